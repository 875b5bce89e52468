"""The idle benchmark end to end, small: a real sidecar process, its CPU read, its results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import idle


def test_an_idle_sidecars_cpu_is_measured_and_written(tmp_path: Path) -> None:
    argv = ["--rounds", "2", "--span-s", "0.5", "--settle-s", "0"]
    assert idle.main([*argv, "--results-dir", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "idle.json").read_text())["results"]
    spans = results["cpu_ms_per_s"]["now"]
    assert len(spans) == 2 and all(math.isfinite(v) and v >= 0 for v in spans)
    assert results["settings"]["span_s"] == 0.5
    assert "| sidecar | CPU ms/s, median | min | max |" in (tmp_path / "idle.md").read_text()


@pytest.mark.parametrize("flags", [["--rounds", "0"], ["--span-s", "0"], ["--settle-s", "-1"]])
def test_bad_settings_are_refused(flags: list[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        idle.main([*flags, "--results-dir", str(tmp_path)])
    assert info.value.code == 2
