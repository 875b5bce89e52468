"""The helper that starts a sidecar process: a failed start leaves nothing, and stopping finds
every process of the tree by session, even after the top was killed and the rest re-parented."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import sidecar as helper
from benchmarks.sidecar import SidecarProcess, descendants, processes, start

SLEEP = "import time; time.sleep(120)"
# A top process whose child leads a session of its own and has a child of its own: the shape of
# the sidecar and its embedded Triton.
CHILD = (
    "import subprocess, sys, time; "
    f"subprocess.Popen([sys.executable, '-c', {SLEEP!r}]); time.sleep(120)"
)
TREE = (
    "import subprocess, sys, time; "
    f"subprocess.Popen([sys.executable, '-c', {CHILD!r}], start_new_session=True); "
    "time.sleep(120)"
)


def test_a_sidecar_that_cannot_start_raises_with_its_log_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    with pytest.raises(RuntimeError, match=r"(?s)exited during start-up \(code 2\).*--policy"):
        start(["--policy", "nonsense"], state_dir=tmp_path)
    assert "--policy must be one of" in (tmp_path / "sidecar.log").read_text()


def test_kill_tree_finds_what_a_killed_top_left_behind_and_nothing_else(tmp_path: Path) -> None:
    top = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True)
    bystander = subprocess.Popen([sys.executable, "-c", SLEEP])  # in our own session
    sc = SidecarProcess(top, 0, 0, tmp_path / "log")
    try:
        deadline = time.monotonic() + 30
        while len(descendants(top.pid)) < 2:
            assert time.monotonic() < deadline, "the tree did not start"
            time.sleep(0.05)
        tree = sc.remember_tree()
        assert len(sc.sessions) == 2  # the top's and the one its child started
        top.send_signal(signal.SIGKILL)
        top.wait()
        orphans = [p for p in tree if p in processes()]
        assert len(orphans) == 2 and not descendants(top.pid)  # re-parented: out of reach by ppid
        assert sc.kill_tree() == {}
        assert not [p for p in tree if p in processes()]
        assert bystander.poll() is None, "a process outside the tree was killed"
    finally:
        sc.kill_tree()
        bystander.kill()
        bystander.wait()


def test_running_starts_again_a_sidecar_that_exits_during_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``starts``: a start that fails (RuntimeError, as :func:`start` raises when the sidecar
    exits during start-up) is tried again; the last failure is raised."""
    tries: list[int] = []
    stopped: list[float] = []

    class Started:
        def stop(self, timeout_s: float) -> int:
            stopped.append(timeout_s)
            return 0

    def flaky(flags: object, **options: object) -> Started:
        tries.append(1)
        if len(tries) < 3:
            raise RuntimeError("the sidecar exited during start-up")
        return Started()

    monkeypatch.setattr(helper, "start", flaky)
    with helper.running(state_dir=tmp_path, starts=3) as sc:
        assert isinstance(sc, Started)
    assert len(tries) == 3 and stopped == [60.0]
    tries.clear()
    with (
        pytest.raises(RuntimeError, match="start-up"),
        helper.running(state_dir=tmp_path, starts=2),
    ):
        pass
    assert len(tries) == 2
    with (
        pytest.raises(ValueError, match="starts must be"),
        helper.running(state_dir=tmp_path, starts=0),
    ):
        pass


# A benchmark that starts the embedded default and then waits, as a long measurement does.
STARTER = """
import sys, time
from pathlib import Path
from benchmarks.sidecar import start
sc = start(["--policy", "max", "--profile-models="], state_dir=Path(sys.argv[1]))
print(sc.pid, flush=True)
time.sleep(600)
"""


def test_a_sidecar_and_its_triton_end_when_what_started_it_is_killed(tmp_path: Path) -> None:
    """``kill -9`` of the process that started a sidecar (a benchmark killed from outside)
    ends the sidecar and its embedded Triton too, within seconds: none is left serving
    nobody."""
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    sessions: set[int] = set()
    try:
        assert starter.stdout is not None
        pid = int(starter.stdout.readline() or 0)  # once the sidecar is ready
        assert pid > 0, "the starter did not start a sidecar"
        tree = descendants(pid)
        assert helper.tritonserver_pids(pid), "no embedded Triton below the sidecar"
        table = processes()
        sessions = {pid} | {table[p].sid for p in tree if p in table}
        starter.send_signal(signal.SIGKILL)
        starter.wait()
        deadline = time.monotonic() + 30.0
        while helper.in_sessions(sessions) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert helper.in_sessions(sessions) == {}, "the sidecar's tree outlived its starter"
    finally:
        starter.kill()
        starter.wait()
        for left in helper.in_sessions(sessions):
            with contextlib.suppress(ProcessLookupError):
                os.kill(left, signal.SIGKILL)
