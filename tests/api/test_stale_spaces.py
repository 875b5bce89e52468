"""An embedded Triton killed together with its sidecar leaves its workspace (a copy of Triton)
and its copies of the models behind; the next embedded start removes them, and nothing that
belongs to a live process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import api.embedded as embedded
from api.embedded import (
    OWNER_FILE,
    SPACE_PREFIX,
    claim_space,
    model_copies,
    process_start,
    remove_space,
    sweep_stale_spaces,
)
from dvfs.simulated import SimulatedDevice


def gone_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def space_with_copy(root: Path, copies: Path, name: str, owners: str | None) -> tuple[Path, Path]:
    """A workspace named ``name`` with ``owners`` as its owner file (None: none) and one copy of
    a model whose ``config.pbtxt`` names it, as Triton's do."""
    space = root / f"{SPACE_PREFIX}{name}"
    (space / "ws").mkdir(parents=True)
    if owners is not None:
        (space / OWNER_FILE).write_text(owners)
    copy = copies / f"folder{name[:6]:0<6}"
    copy.mkdir()
    (copy / "config.pbtxt").write_text(f'parameters {{ value: "{space}/ws/model" }}')
    return space, copy


def test_only_workspaces_whose_processes_are_all_gone_are_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies = tmp_path / "copies"
    copies.mkdir()
    monkeypatch.setattr(embedded, "TRITON_COPIES_DIR", copies)
    me, dead = os.getpid(), gone_pid()
    mine = f"{me} {process_start(me)}\n"
    spaces = {
        "deadaa": f"{dead} 1\n",  # its sidecar gone
        "reused": f"{me} 1\n",  # a live pid, but another process than the one that made it
        "bothgo": f"{dead} 1\n{me} 1\n",  # the sidecar and its Triton, both gone
        "alivea": mine,  # its sidecar alive
        "halfal": f"{dead} 1\n{mine}",  # the sidecar gone, its Triton still stopping
        "noowns": None,  # not ours, or still being made
        "garble": "not a pid\n",
    }
    made = {
        name: space_with_copy(tmp_path, copies, name, owners) for name, owners in spaces.items()
    }
    removed = sweep_stale_spaces(tmp_path)
    stale = {"deadaa", "reused", "bothgo"}
    assert sorted(removed) == sorted(made[name][0] for name in stale)
    for name, (space, copy) in made.items():
        assert space.exists() == copy.exists() == (name not in stale), name


def test_a_claim_names_the_process_and_when_it_started(tmp_path: Path) -> None:
    claim_space(tmp_path, os.getpid())
    pid, start = (tmp_path / OWNER_FILE).read_text().split()
    assert int(pid) == os.getpid() and start == process_start(os.getpid())
    assert process_start(gone_pid()) is None


SIDECAR = """
import sys
from pathlib import Path
from api.embedded import EmbeddedTriton
triton = EmbeddedTriton(Path(sys.argv[1]))
triton.start()
print(triton._space, flush=True)
sys.stdin.read()
"""


def test_a_triton_killed_with_its_sidecar_is_swept_at_the_next_start(tmp_path: Path) -> None:
    """Real parts: a process holding an embedded Triton, stopped so it cannot react, its
    Triton's whole group and then itself killed; the workspace and the model copies stay,
    and the sweep at the next start removes them."""
    state = tmp_path / "gpu.state"
    SimulatedDevice("v100", state_path=state).close()
    sidecar = subprocess.Popen(
        [sys.executable, "-c", SIDECAR, str(state)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    space = None
    try:
        assert sidecar.stdout is not None
        space = Path(sidecar.stdout.readline().strip())
        owners = [line.split() for line in (space / OWNER_FILE).read_text().splitlines()]
        assert len(owners) == 2 and int(owners[0][0]) == sidecar.pid  # then its Triton
        triton_pid = int(owners[1][0])
        copies = model_copies(space)
        assert len(copies) == 3  # simnet, simbert, noop
        os.kill(sidecar.pid, signal.SIGSTOP)  # it cannot restart Triton or clean up
        os.killpg(triton_pid, signal.SIGKILL)  # Triton's group: it, its stubs
        sidecar.kill()
        sidecar.wait(10)
        deadline = time.monotonic() + 10
        while process_start(triton_pid) is not None:
            assert time.monotonic() < deadline, "the Triton child outlived SIGKILL"
            time.sleep(0.05)
        assert space.is_dir() and all(c.is_dir() for c in copies)  # left behind
        assert space in sweep_stale_spaces()
        assert not space.exists() and not any(c.exists() for c in copies)
    finally:
        if sidecar.poll() is None:
            sidecar.kill()
            sidecar.wait(10)
        if space is not None and space.name.startswith(SPACE_PREFIX):
            remove_space(space)
