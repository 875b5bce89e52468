"""The in-process path benchmark end to end, small: its warm cells, its cold table, its results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import pathbench


def test_warm_and_cold_cells_are_measured_and_written(tmp_path: Path) -> None:
    argv = ["--protocols", "http", "--concurrency", "1,2", "--requests", "40", "--gaps-ms", "0,1"]
    assert pathbench.main([*argv, "--results-dir", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "pathbench.json").read_text())["results"]
    assert [(r["protocol"], r["concurrency"]) for r in results["cost"]] == [
        ("http", 1),
        ("http", 2),
    ]
    assert [r["gap_ms"] for r in results["cold"]] == [0.0, 1.0]
    assert all(r["cpu_us"] > 0 for r in results["cost"] + results["cold"])
    text = (tmp_path / "pathbench.md").read_text()
    assert "| idle gap ms | CPU µs per request | compact loop CPU µs |" in text
    assert all(r["compact_cpu_us"] > 0 for r in results["cold"])


def test_no_cold_table_when_asked_for_none(tmp_path: Path) -> None:
    argv = ["--protocols", "grpc", "--concurrency", "1", "--requests", "20", "--gaps-ms", ""]
    assert pathbench.main([*argv, "--no-learn", "--results-dir", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "pathbench.json").read_text())["results"]
    assert results["cold"] == [] and results["settings"]["learn"] is False
    assert "--no-learn" in (tmp_path / "pathbench.md").read_text()
    assert "idle gap" not in (tmp_path / "pathbench.md").read_text()


@pytest.mark.parametrize("gaps", ["2,x", "-1"])
def test_bad_gaps_are_refused(gaps: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        pathbench.main(["--gaps-ms", gaps, "--results-dir", str(tmp_path)])
    assert info.value.code == 2
