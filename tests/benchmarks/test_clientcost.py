"""The client-cost benchmark end to end, small: its reply server, both clients, its results."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import clientcost


def test_both_clients_are_measured_and_written(tmp_path: Path) -> None:
    argv = ["--concurrency", "1,2", "--requests", "40", "--rounds", "1"]
    assert clientcost.main([*argv, "--results-dir", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "clientcost.json").read_text())["results"]["cost"]
    assert [(r["client"], r["concurrency"]) for r in rows] == [
        ("loadgen", 1),
        ("aiohttp", 1),
        ("loadgen", 2),
        ("aiohttp", 2),
    ]
    for r in rows:
        assert r["cpu_us"][0] > 0 and r["p50_us"][0] > 0
    assert "| loadgen | 1 |" in (tmp_path / "clientcost.md").read_text()
