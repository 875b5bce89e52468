"""The one way benchmarks and tests start ``python -m api serve`` as a process of its own.

``with running(["--policy", "max"], state_dir=d) as sc:`` starts the sidecar on free ports in a
session of its own, waits until it is ready, and yields its URLs, pid and log; on every way out
of the block (an exception, a failed start, a test that timed out) it is sent SIGTERM, given
``stop_timeout_s`` to exit, and then every process left of its tree is killed.

The tree is found by session: the sidecar leads its own, and the embedded Triton's child starts
another one below it (see :mod:`api.embedded`); every process Triton starts stays in that one.
A session outlives the process that led it, so what the tree left behind is found even after
the sidecar itself died (``kill -9``) and its children were re-parented.

The other way round, a sidecar does not outlive the process that started it: on Linux it is
sent SIGTERM when that process ends, however it ends (``kill -9`` of a benchmark, a runner's
timeout), and stops its own tree as on any SIGTERM. Without this, a benchmark killed from
outside left its sidecar and Triton running, serving nobody and taking the CPU that the next
measurement on the machine counts.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.embedded import free_port

HOST = "127.0.0.1"
#: The ``python -m api serve`` flags :func:`start` sets itself (a caller's must leave them out).
OWNED_FLAGS = ("host", "port", "grpc-port", "state-dir", "admin-token", "admin-token-file")
READY_PATH = "/v2/health/ready"
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends


@dataclass(frozen=True)
class ProcessInfo:
    """One line of ``/proc``: a process, its parent, group, session and command line."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    cmdline: bytes


def processes() -> dict[int, ProcessInfo]:
    """Every process visible in ``/proc`` (Linux), zombies left out: they have exited."""
    found: dict[int, ProcessInfo] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] in ("Z", "X"):
                continue
            pid = int(entry.name)
            found[pid] = ProcessInfo(
                pid,
                ppid=int(fields[1]),
                pgid=int(fields[2]),
                sid=int(fields[3]),
                state=fields[0],
                cmdline=(entry / "cmdline").read_bytes(),
            )
    return found


def descendants(pid: int) -> dict[int, bytes]:
    """Every live process below ``pid`` (children, theirs, ...): pid → command line."""
    table = processes()
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found: dict[int, bytes] = {}
    frontier = [pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found[child] = table[child].cmdline
            frontier.append(child)
    return found


def tritonserver_pids(pid: int) -> list[int]:
    """The ``tritonserver`` processes below ``pid``."""
    return [
        p for p, cmd in descendants(pid).items() if cmd.split(b"\0")[0].endswith(b"/tritonserver")
    ]


def in_sessions(sessions: set[int]) -> dict[int, bytes]:
    """Every live process in one of ``sessions``: pid → command line."""
    return {p: info.cmdline for p, info in processes().items() if info.sid in sessions}


@dataclass
class SidecarProcess:
    """A started ``python -m api serve`` and the sessions its tree lives in."""

    proc: subprocess.Popen[bytes]
    port: int
    grpc_port: int
    log_path: Path
    admin_token: str | None = None
    sessions: set[int] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        """The sidecar's HTTP endpoint, ``host:port``."""
        return f"{HOST}:{self.port}"

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def admin(self, path: str) -> dict[str, Any]:
        """``GET`` an admin endpoint (``/admin/state``) with the admin token."""
        request = urllib.request.Request(f"http://{self.url}{path}")
        if self.admin_token is not None:
            request.add_header("Authorization", f"Bearer {self.admin_token}")
        with urllib.request.urlopen(request, timeout=30) as reply:
            data: dict[str, Any] = json.load(reply)
        return data

    def remember_tree(self) -> dict[int, bytes]:
        """Note the sessions of the sidecar's tree as it is now (call it while the sidecar is
        alive: a restarted Triton starts a new session); returns the tree."""
        tree = descendants(self.pid)
        table = processes()
        self.sessions.add(self.pid)
        self.sessions.update(table[p].sid for p in tree if p in table)
        self.sessions.discard(os.getsid(0))  # never our own
        return tree

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, up to ``timeout_s`` to exit, then :meth:`kill_tree`; the exit code."""
        if self.proc.poll() is None:
            self.remember_tree()
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        self.kill_tree()
        return self.proc.returncode

    def kill_tree(self, wait_s: float = 10.0) -> dict[int, bytes]:
        """SIGKILL the sidecar and every process in its tree's sessions, and wait until they
        are gone; returns what is still there after ``wait_s`` (nothing, normally)."""
        if self.proc.poll() is None:
            self.remember_tree()
        deadline = time.monotonic() + wait_s
        while True:
            left = in_sessions(self.sessions)
            if self.proc.poll() is None:
                left[self.pid] = b""
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(0.1)
            if not left or time.monotonic() > deadline:
                return left


def ends_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` by which a child is sent SIGTERM when this process ends (Linux's
    parent-death signal); None where there is none.

    The signal follows the *thread* that started the child: start sidecars from a thread that
    lives as long as they should (the main thread, or a pool's). A parent that ended between the
    fork and the call is caught by comparing the child's parent with this process.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the child
    except (OSError, AttributeError):
        return None
    starter = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != starter:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def start(
    flags: Sequence[str] = (),
    *,
    state_dir: Path,
    admin_token: str | None = None,
    log_path: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    start_timeout_s: float = 240.0,
    wait_ready: bool = True,
) -> SidecarProcess:
    """Start ``python -m api serve`` with ``flags`` and wait until it is ready.

    The helper owns ``--host``, ``--port``, ``--grpc-port`` and ``--state-dir`` (and
    ``--admin-token`` when ``admin_token`` is given): do not pass them in ``flags``. The log goes
    to ``log_path`` (default ``state_dir/sidecar.log``). ``cwd`` and ``env`` (added to this
    process's environment) run another source tree. On a failed start nothing is left running.
    ``wait_ready`` False returns at once (a test that acts while the sidecar starts).
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    port, grpc_port = free_port(), free_port()
    argv = [
        sys.executable, "-m", "api", "serve",
        "--host", HOST, "--port", str(port), "--grpc-port", str(grpc_port),
        "--state-dir", str(state_dir),
        *((f"--admin-token={admin_token}",) if admin_token is not None else ()),  # may start with -
        *flags,
    ]  # fmt: skip
    log_path = log_path or state_dir / "sidecar.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=None if env is None else {**os.environ, **env},
            start_new_session=True,
            preexec_fn=ends_with_this_process(),
        )
    sc = SidecarProcess(proc, port, grpc_port, log_path, admin_token, {proc.pid})
    if not wait_ready:
        return sc
    try:
        _wait_ready(sc, time.monotonic() + start_timeout_s)
    except BaseException:
        sc.kill_tree()
        raise
    sc.remember_tree()
    return sc


def _wait_ready(sc: SidecarProcess, deadline: float) -> None:
    url = f"http://{sc.url}{READY_PATH}"
    while True:
        if sc.proc.poll() is not None:
            raise RuntimeError(
                f"the sidecar exited during start-up (code {sc.proc.returncode}); its log:\n"
                + sc.log()[-4000:]
            )
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as reply:
            if reply.status == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the sidecar was not ready in time; its log: {sc.log_path}")
        time.sleep(0.2)


@contextlib.contextmanager
def running(
    flags: Sequence[str] = (),
    *,
    state_dir: Path,
    stop_timeout_s: float = 60.0,
    starts: int = 1,
    **options: Any,
) -> Iterator[SidecarProcess]:
    """:func:`start` for the duration of a block; stopped (its whole tree) on every way out.
    ``starts`` > 1: a sidecar that exits during start-up (it happens on a loaded machine) is
    started again, up to that many times in all."""
    if starts < 1:
        raise ValueError(f"starts must be >= 1, got {starts}")
    for attempt in range(1, starts + 1):
        try:
            sc = start(flags, state_dir=state_dir, **options)
            break
        except RuntimeError:
            if attempt == starts:
                raise
    try:
        yield sc
    finally:
        sc.stop(stop_timeout_s)
