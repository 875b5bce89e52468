"""gRPC's floor benchmark end to end, small: every server measured, the results written, and
no server process left behind."""

from __future__ import annotations

import json
from pathlib import Path

from api.embedded import free_port
from benchmarks import grpcfloor
from benchmarks.floor import server_process
from benchmarks.sidecar import processes


def _servers_running() -> list[int]:
    return [p.pid for p in processes().values() if b"benchmarks.grpcfloor\0--serve" in p.cmdline]


def test_a_running_server_is_seen() -> None:
    """What the check below looks for is there while a server runs, and gone after."""
    args = ("--serve", str(free_port()), "--server", "sync")
    with server_process("the fixed gRPC server", "benchmarks.grpcfloor", *args) as (proc, _):
        assert _servers_running() == [proc.pid]
    assert _servers_running() == []


def test_every_server_is_measured_and_written(tmp_path: Path) -> None:
    argv = ["--concurrency", "1,2", "--duration-s", "0.3", "--results-dir", str(tmp_path)]
    assert grpcfloor.main(argv) == 0
    rows = json.loads((tmp_path / "grpcfloor.json").read_text())["results"]["cost"]
    assert [(r["server"], r["client"], r["concurrency"]) for r in rows] == [
        ("aio", "aio", 1),
        ("aio", "aio", 2),
        ("aio", "h2", 1),
        ("aio", "h2", 2),
        ("sync", "aio", 1),
        ("sync", "aio", 2),
        ("h2", "aio", 1),
        ("h2", "aio", 2),
        ("h2", "h2", 1),
        ("h2", "h2", 2),
    ]
    for r in rows:
        assert r["calls_per_s"] > 0
        assert r["server_cpu_us"] > 0 and r["client_cpu_us"] > 0
    assert "| server | client | concurrency | calls/s |" in (tmp_path / "grpcfloor.md").read_text()
    assert _servers_running() == []
