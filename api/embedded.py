"""The embedded default: a real Triton (PyTriton's bundled server) hosting emulated-GPU models.

``simnet`` (a ResNet-50-class CNN) and ``simbert`` (a BERT-large-class transformer, several times
slower and batching less well) both take ``INPUT0`` FP32 ``[-1, 16]`` and answer ``OUTPUT0 =
2·INPUT0``. Triton's dynamic batcher forms their batches (up to each model's largest, two
instances each) from two priority levels, as the sidecar's (it sends each request's level).
Each batch takes as long as the simulated GPU says for that model, that batch size and the
clock the sidecar set (read from the device's shared state file), speeding up or slowing down
mid-batch when the clock, or the number of batches sharing the GPU, changes, and adds its
energy to that GPU's counter. ``noop`` answers at once (for measuring the sidecar's own
cost).

Triton runs in a child process that the sidecar starts, waits for, and stops on every exit path.
The child leads a process group of its own, which holds everything Triton starts (its backend
stubs, their helpers), and watches its parent from a thread: when the sidecar is gone (even
``kill -9``), Triton is stopped in order if that takes at most ``ORPHAN_GRACE_S``, and then every
process left in the group is killed, so a killed sidecar leaves nothing running. Where the two
are killed together (a whole tree ``kill -9``-ed, a host's OOM killer), nothing is left to
remove Triton's workspace (a copy of Triton) and its copies of the models: each workspace names
the processes it belongs to (``OWNER_FILE``), and every embedded start first removes those whose
processes are all gone (:func:`sweep_stale_spaces`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dvfs.profiles import CNN, TRANSFORMER
from dvfs.simulated import SimulatedDevice, shared_time_ms

log = logging.getLogger(__name__)
Floats = npt.NDArray[np.float32]

SIMNET = "simnet"
SIMBERT = "simbert"
NOOP = "noop"
NOOP_MAX_BATCH = 8  # noop's largest batch
EMULATED = {SIMNET: CNN, SIMBERT: TRANSFORMER}  # Triton's model name -> the simulated model
INSTANCES = 2
BATCHER_DELAY_US = 500  # how long Triton's batcher may wait for a fuller batch
PRIORITY_LEVELS = 2  # Triton's priority queue: the sidecar sends each request's level
INPUT_WIDTH = 16
STEP_S = 0.002  # how often a running batch re-reads the clock
PARENT_POLL_S = 0.1  # how often the Triton child checks that the sidecar is still there
ORPHAN_GRACE_S = 3.0  # the sidecar gone: Triton's orderly stop gets this long, then all is killed
RETRY_WAIT_MAX_S = 5.0  # the longest wait before another start after a failed one
SHM_DIR = Path("/dev/shm")
# Triton copies a model loaded with its files (as PyTriton loads every model) into a
# ``folderXXXXXX`` directory here; the directory is hard-coded in Triton's core, not $TMPDIR.
TRITON_COPIES_DIR = Path("/tmp")
SPACE_PREFIX = "triton-"  # the embedded Triton's workspace: a directory of the temp dir
OWNER_FILE = "owner"  # in a workspace: "pid start-time" of each process it belongs to


@dataclass(frozen=True)
class EmbeddedPorts:
    http: int
    grpc: int
    metrics: int

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc}"


class EmbeddedUnavailableError(RuntimeError):
    """The embedded default was asked for, but its extra (PyTriton) is not installed."""


def require_embedded() -> None:
    """Raise :class:`EmbeddedUnavailableError`, saying what to install, unless PyTriton is
    importable; the runtime install alone serves only in front of an existing Triton."""
    missing = [m for m in ("pytriton", "httpx") if importlib.util.find_spec(m) is None]
    if missing:
        raise EmbeddedUnavailableError(
            f"the embedded default needs the 'embedded' extra (missing: {', '.join(missing)}): "
            "pip install '.[embedded]' (make setup installs it), "
            "or point --triton-url at an existing Triton"
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def emulate_batch(device: SimulatedDevice, model: str, batch: int) -> None:
    """Occupy the simulated GPU for one batch of ``model``, following the clock and the number
    of batches sharing the GPU while it runs."""
    law = device.profile.model(model)
    device.begin_work(model, batch)
    try:
        clock = device.clock_mhz()
        mean_ms = law.mean_latency_ms(clock, batch)
        work = device.sample_latency_ms(clock, model=model, batch=batch) / mean_ms
        done = 0.0
        while done < 1.0:
            clock, running, models = device.sharing(model)
            total_s = work * shared_time_ms(law, clock, batch, running, models) / 1000.0
            step_s = min((1.0 - done) * total_s, STEP_S)
            time.sleep(step_s)
            done += step_s / total_s
    finally:
        device.end_work(model, batch)


Binder = Callable[[Any, str, int], None]


def _serve(
    state_path: str,
    ports: EmbeddedPorts,
    instances: int,
    binder: Binder,
    parent: int,
    space_dir: str,
) -> None:
    """Child process: run PyTriton with the models ``binder`` binds, until SIGTERM or until the
    sidecar (``parent``) is gone. PyTriton's workspace (a copy of Triton) is made in
    ``space_dir``, which the sidecar made, so that the sidecar removes it once this process is
    gone, however it ended.

    It starts its own session, so a Ctrl-C or a signal to the sidecar's process group does not
    kill Triton under PyTriton's feet: only the sidecar stops it, in order. No lock is shared
    with the parent (a process killed while holding one would deadlock the other).
    """
    os.setsid()  # first: the group that the orphan watch kills must be this one, not the sidecar's
    orphaned, stopped = threading.Event(), threading.Event()
    space = Path(space_dir)  # removed here if the sidecar is gone
    threading.Thread(
        target=_watch_parent,
        args=(parent, orphaned, stopped, space),
        name="watch-sidecar",
        daemon=True,
    ).start()
    # Triton, its backend stubs and PyTriton talk a lot, at shutdown most of all: their output
    # goes to the log beside the state file, not to the sidecar's console.
    log_path = _log_path(state_path)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    stopping = [False]
    signal.signal(signal.SIGTERM, lambda *_: stopping.__setitem__(0, True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Pitfall 1 (shared/ENVIRONMENT.md): the Python backend stub must load this interpreter's
    # libpython, not the system's.
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    os.environ["LD_LIBRARY_PATH"] = f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig
    from pytriton.utils.workspace import Workspace

    logging.getLogger("pytriton").setLevel(logging.WARNING)
    config = TritonConfig(  # every port on localhost only: nothing may bypass the sidecar
        http_address="127.0.0.1",
        http_port=ports.http,
        grpc_address="127.0.0.1",  # only the sidecar talks to it
        grpc_port=ports.grpc,
        metrics_address="127.0.0.1",
        metrics_port=ports.metrics,
        log_verbose=0,
        exit_timeout_secs=2,
        log_file=log_path,
    )
    # Pitfall 2: open the statistics endpoints that perf_analyzer-style tools read.
    security = TritonSecurityConfig(restricted_endpoints=[])
    if not orphaned.is_set():
        workspace = Workspace(space / "ws")
        with Triton(config=config, security_config=security, workspace=workspace) as triton:
            binder(triton, state_path, instances)
            triton.run()
            # The sidecar gone: do not outlive it. Triton gone (killed, crashed): exit, so that
            # the sidecar sees this process end and starts a fresh one.
            while not stopping[0] and not orphaned.wait(0.2) and triton.is_alive():
                pass
            if not stopping[0] and not orphaned.is_set():  # said in the log the sidecar quotes
                print(
                    "embedded Triton: PyTriton reports the server or a model's handler gone; "
                    "exiting for the sidecar to start a fresh one",
                    flush=True,
                )
    stopped.set()
    if orphaned.is_set():
        _end_orphaned(space)
    # Whatever Triton left behind (a backend stub that missed the shutdown) is in our group.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)


def _watch_parent(
    parent: int, orphaned: threading.Event, stopped: threading.Event, space: Path
) -> None:
    """Thread of the Triton child: once the sidecar is gone (this process re-parented), ask the
    main thread to stop Triton; if it has not within ``ORPHAN_GRACE_S`` (a slow shutdown, or
    Triton still starting), end everything here.

    Polling ``getppid`` against the pid the sidecar passed in tells a dead parent reliably,
    even one that died before this thread started. ``PR_SET_PDEATHSIG`` would not: it fires when
    the *thread* that started the child ends (the sidecar starts Triton from worker threads),
    and Triton's own children need a group kill anyway (its backend stubs outlive it).
    """
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    orphaned.set()
    if not stopped.wait(ORPHAN_GRACE_S):
        _end_orphaned(space)


def _end_orphaned(space: Path) -> None:
    """Kill every other process of this group (Triton, its stubs, their helpers), remove what
    PyTriton would have removed on an orderly stop (its workspace, a copy of Triton, in ``space``;
    this process's shared-memory segments) and Triton's copies of the models, and exit."""
    me = os.getpid()
    for _ in range(20):  # a process may fork while we look: look again until none is left
        others = [p for p in _group_members(os.getpgrp()) if p != me]
        if not others:
            break
        for pid in others:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    remove_space(space)
    for segment in SHM_DIR.glob(f"pytrtion{me}-*"):  # PyTriton names them after this process
        with contextlib.suppress(OSError):
            segment.unlink()
    os._exit(0)


def model_copies(space: Path) -> list[Path]:
    """Triton's copies of the models of the server whose PyTriton workspace is in ``space``.

    Triton removes a copy when its model unloads, which a stopping server never does (orderly
    or killed), so every start would leave one per model in ``TRITON_COPIES_DIR``. Each copy's
    ``config.pbtxt`` names PyTriton's workspace, in ``space``: that tells this server's copies
    from those of any other server on the machine."""
    marker = f'"{space}/'
    found = []
    for folder in TRITON_COPIES_DIR.glob("folder??????"):
        with contextlib.suppress(OSError):
            if marker in (folder / "config.pbtxt").read_text(errors="replace"):
                found.append(folder)
    return found


def remove_space(space: Path) -> list[Path]:
    """Remove ``space`` (PyTriton's workspace, a copy of Triton) and :func:`model_copies` of its
    server, once the server is stopped; returns the copies."""
    shutil.rmtree(space, ignore_errors=True)
    copies = model_copies(space)
    for folder in copies:
        shutil.rmtree(folder, ignore_errors=True)
    return copies


def process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, field 22 of Linux's
    ``/proc/PID/stat``), None if there is no such process or it has ended (a zombie): with the
    pid it names one process, even after the pid is reused."""
    fields = _live_stat(Path(f"/proc/{pid}"))
    return fields[19] if fields is not None else None


def _live_stat(proc_dir: Path) -> list[str] | None:
    """The fields of a process's ``/proc/PID/stat`` after its name (the state first); None if
    there is no such process or it has ended (a zombie)."""
    with contextlib.suppress(OSError, IndexError):
        fields = (proc_dir / "stat").read_text().rsplit(")", 1)[1].split()
        if len(fields) > 19 and fields[0] not in ("Z", "X"):
            return fields
    return None


def claim_space(space: Path, pid: int) -> None:
    """Record that ``space`` belongs to process ``pid`` (while any of its processes lives, no
    sweep removes it)."""
    start = process_start(pid)
    if start is not None:
        with (space / OWNER_FILE).open("a") as handle:
            handle.write(f"{pid} {start}\n")


def _owners_gone(space: Path) -> bool:
    """Whether every process ``space`` names is gone (False where it names none it can read:
    not ours, or still being made)."""
    try:
        lines = (space / OWNER_FILE).read_text().splitlines()
    except OSError:
        return False
    owners = [line.split() for line in lines if line.strip()]
    if not owners or any(len(owner) != 2 or not owner[0].isdigit() for owner in owners):
        return False
    return all(process_start(int(pid)) != start for pid, start in owners)


def sweep_stale_spaces(root: Path | None = None) -> list[Path]:
    """Remove the embedded Tritons' workspaces in ``root`` (the temp dir) whose processes are
    all gone, with their copies of the models (:func:`remove_space`); returns them."""
    removed = []
    for space in sorted((root or Path(tempfile.gettempdir())).glob(f"{SPACE_PREFIX}*")):
        if space.is_dir() and _owners_gone(space):
            copies = len(remove_space(space))
            log.info(
                "removed %s, the workspace of an embedded Triton whose processes are gone "
                "(killed together), with %d copies of its models",
                space,
                copies,
            )
            removed.append(space)
    return removed


def _group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (Linux ``/proc``; zombies are not)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _live_stat(entry)
        if fields is not None and fields[2] == str(pgid):
            members.append(int(entry.name))
    return members


def bind_emulated(triton: Any, state_path: str, instances: int) -> None:
    """``simnet`` and ``simbert`` on the simulated GPU whose state is at ``state_path``, each
    behind Triton's dynamic batcher, and ``noop``."""
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

    def make_emulated(model: str, seed: int) -> Any:
        device = SimulatedDevice.attach(Path(state_path), rng=np.random.default_rng(seed))

        @batch  # type: ignore[untyped-decorator]
        def emulated(INPUT0: Floats) -> dict[str, Floats]:  # noqa: N803 (the tensor's name)
            emulate_batch(device, model, len(INPUT0))
            return {"OUTPUT0": (INPUT0 * 2).astype(np.float32)}

        return emulated

    @batch  # type: ignore[untyped-decorator]
    def noop(INPUT0: Floats) -> dict[str, Floats]:  # noqa: N803
        return {"OUTPUT0": INPUT0}

    tensors = {
        "inputs": [Tensor(name="INPUT0", dtype=np.float32, shape=(INPUT_WIDTH,))],
        "outputs": [Tensor(name="OUTPUT0", dtype=np.float32, shape=(INPUT_WIDTH,))],
    }
    batcher = DynamicBatcher(
        max_queue_delay_microseconds=BATCHER_DELAY_US,
        priority_levels=PRIORITY_LEVELS,
        default_priority_level=PRIORITY_LEVELS,
    )
    probe = SimulatedDevice.attach(Path(state_path))
    profile = probe.profile
    probe.close()
    for i, (name, model) in enumerate(EMULATED.items()):
        triton.bind(
            name,
            [make_emulated(model, 100 * i + k) for k in range(instances)],
            config=ModelConfig(max_batch_size=profile.model(model).max_batch, batcher=batcher),
            **tensors,
        )
    from api.embedded_llm import bind_llm

    bind_llm(triton, state_path)  # on a GPU with an LLM profile: the generative model too
    # Last: it is the one whose readiness says every model is loaded.
    triton.bind(
        NOOP, [noop] * instances, config=ModelConfig(max_batch_size=NOOP_MAX_BATCH), **tensors
    )


def _log_path(state_path: str | Path) -> Path:
    """Where Triton's output goes: the log beside the state file."""
    return Path(state_path).with_suffix(".triton.log")


def _log_end(state_path: str | Path, lines: int = 12) -> str:
    """The last ``lines`` lines of Triton's log (what says why a start failed), named, or why
    there are none."""
    path = _log_path(state_path)
    try:
        text = "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as err:
        text = f"(unreadable: {err})"
    return f"the end of its log ({path}):\n{text}"


class EmbeddedTriton:
    """Starts and stops the embedded Triton (a child process); use as a context manager."""

    def __init__(
        self,
        state_path: Path,
        *,
        instances: int = INSTANCES,
        start_timeout_s: float = 120.0,
        binder: Binder = bind_emulated,
        ready_model: str = NOOP,
    ) -> None:
        """``binder`` (a module-level function: it crosses to the child) binds the models;
        ready once ``ready_model`` is. Triton's log goes beside ``state_path``."""
        self.state_path = state_path
        self.instances = instances
        self.binder = binder
        self.ready_model = ready_model
        self.start_timeout_s = start_timeout_s
        self.ports = EmbeddedPorts(free_port(), free_port(), free_port())
        self._proc: BaseProcess | None = None
        self._space: Path | None = None  # the child's PyTriton workspace lives in here
        self._closed = False
        self.restarts = 0

    @property
    def url(self) -> str:
        return self.ports.url

    def alive(self) -> bool:
        """Whether the child that runs Triton is still there (it exits when Triton dies)."""
        proc = self._proc
        return proc is not None and proc.is_alive()

    def why_down(self) -> str:
        """Why Triton is being restarted, for the sidecar's log (Triton's own log goes away with
        the sidecar's state directory): how its process ended, or that it still runs, and the
        end of its log."""
        proc = self._proc
        if proc is None:
            how = "not running"
        elif proc.is_alive():
            how = "running but not answering"
        else:
            how = f"exited with code {proc.exitcode}"
        return f"embedded Triton {how}; " + _log_end(self.state_path)

    def restart(self, stop_timeout_s: float = 5.0) -> None:
        """Stop what is left of Triton and start a fresh one (same ports if they are free)."""
        if self._closed:
            return
        self.stop(stop_timeout_s)
        self.restarts += 1
        self.start()

    def start(self, attempts: int = 10) -> None:
        """Start Triton and wait until it serves; retried on a failed start-up.

        PyTriton's handshake with a model instance occasionally races during model load (a
        second instance connects to the first one's handshake socket before it listens: the
        connect is refused, the model fails to load, Triton exits); a fresh start on fresh
        ports succeeds. Seen about once in twenty starts on a 2-core machine, three times in a
        row right after a Triton that had to be killed, and five in a row in one clean-clone CI
        run (which instance initialises first is a race each start): each retry first waits a
        little longer, at most ``RETRY_WAIT_MAX_S``. A start that never becomes ready (a stub
        stuck in the same handshake, Triton alive but the model never loaded) is stopped and
        retried the same way.
        """
        require_embedded()
        sweep_stale_spaces()
        for attempt in range(1, attempts + 1):
            if self._closed:
                raise RuntimeError("embedded Triton is closed")
            try:
                self._start_once()
                return
            except (RuntimeError, TimeoutError) as err:
                if attempt == attempts:
                    raise
                log.warning("embedded Triton failed to start (%s); retrying", err)
                time.sleep(min(2.0 * attempt, RETRY_WAIT_MAX_S))  # load may pass meanwhile
                self.ports = EmbeddedPorts(free_port(), free_port(), free_port())

    def _start_once(self) -> None:
        ctx = mp.get_context("spawn")
        # A short path: Triton's models talk over Unix sockets in the workspace, whose paths
        # may not pass 107 bytes.
        self._space = Path(tempfile.mkdtemp(prefix=SPACE_PREFIX))
        claim_space(self._space, os.getpid())
        proc = ctx.Process(
            target=_serve,
            name="embedded-triton",
            daemon=False,
            args=(
                str(self.state_path),
                self.ports,
                self.instances,
                self.binder,
                os.getpid(),
                str(self._space),
            ),
        )
        proc.start()  # one that failed to start is never stopped (joining it would raise)
        self._proc = proc
        if proc.pid is not None:
            claim_space(self._space, proc.pid)
        try:
            self._wait_ready(time.monotonic() + self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        if self._closed:  # closed while a restart was starting it (in another thread)
            self.stop()
            raise RuntimeError("embedded Triton closed while starting")
        log.info("embedded Triton ready at %s", self.url)

    def _wait_ready(self, deadline: float) -> None:
        import httpx

        url = f"http://{self.url}/v2/models/{self.ready_model}/ready"
        while time.monotonic() < deadline:
            assert self._proc is not None
            if not self._proc.is_alive():
                raise RuntimeError(
                    f"embedded Triton exited during start-up (code {self._proc.exitcode}); "
                    + _log_end(self.state_path)
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(
            f"embedded Triton not ready after {self.start_timeout_s:.0f} s; "
            + _log_end(self.state_path)
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop Triton and wait for it; escalates to SIGKILL if it will not go. PyTriton's
        workspace goes too (a Triton killed before PyTriton removed it would leave it behind),
        and Triton's copies of the models (no stop removes them)."""
        proc, self._proc = self._proc, None
        space, self._space = self._space, None
        if proc is not None:
            self._end(proc, timeout_s)
        if space is not None:
            remove_space(space)

    @staticmethod
    def _end(proc: BaseProcess, timeout_s: float) -> None:
        """The child asked to stop, killed if it will not go within ``timeout_s``; then its
        whole group killed."""
        if proc.is_alive():
            proc.terminate()
        proc.join(timeout_s)
        if proc.is_alive():
            log.warning("embedded Triton did not stop in %.0f s; killing it", timeout_s)
            proc.kill()
            proc.join(5.0)
        if proc.pid is not None:  # the child leads its own process group: Triton and its stubs
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def __enter__(self) -> EmbeddedTriton:
        self.start()
        return self

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop Triton for good: a restart in progress elsewhere stops too."""
        self._closed = True
        self.stop(timeout_s)

    def __exit__(self, *exc: object) -> None:
        self.close()
