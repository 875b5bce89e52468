"""``python -m api serve`` as a child process, for tests that send it signals."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from api.embedded import free_port


def start_sidecar(state_dir: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start the embedded default in a child process and wait until it is ready."""
    port = free_port()
    log = (state_dir / "sidecar.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "api", "serve", "--port", str(port),
            "--state-dir", str(state_dir), "--profile-clocks", "6", "--profile-requests", "10",
            "--policy", "max", *args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the sidecar exited: {(state_dir / 'sidecar.log').read_text()}")
        try:
            if httpx.get(f"http://{url}/v2/health/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError("the sidecar did not get ready")
        time.sleep(0.2)


def descendants(pid: int) -> dict[int, bytes]:
    """Every process below ``pid``: pid → command line."""
    parents: dict[int, int] = {}
    cmds: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmds[int(entry.name)] = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: dict[int, bytes] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found[child] = cmds.get(child, b"")
                frontier.append(child)
    return found


def tritonserver_pids(pid: int) -> list[int]:
    return [
        p for p, cmd in descendants(pid).items() if cmd.split(b"\0")[0].endswith(b"/tritonserver")
    ]
