"""``python -m api serve`` as a child process, for tests that send it signals."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from api.embedded import free_port
from benchmarks.adversary import descendants, tritonserver_pids

__all__ = ["descendants", "start_sidecar", "tritonserver_pids"]


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
