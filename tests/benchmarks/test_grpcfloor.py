"""gRPC's floor benchmark end to end, small: both servers measured, the results written, and
no server process left behind."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from benchmarks import grpcfloor


def _servers_running() -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if "benchmarks.grpcfloor --serve" in line]


def test_both_servers_are_measured_and_written(tmp_path: Path) -> None:
    argv = ["--concurrency", "1,2", "--duration-s", "0.3", "--results-dir", str(tmp_path)]
    assert grpcfloor.main(argv) == 0
    rows = json.loads((tmp_path / "grpcfloor.json").read_text())["results"]["cost"]
    assert [(r["server"], r["concurrency"]) for r in rows] == [
        ("aio", 1),
        ("aio", 2),
        ("sync", 1),
        ("sync", 2),
    ]
    for r in rows:
        assert r["calls_per_s"] > 0
        assert r["server_cpu_us"] > 0 and r["client_cpu_us"] > 0
    assert "| server | concurrency | calls/s |" in (tmp_path / "grpcfloor.md").read_text()
    assert _servers_running() == []
