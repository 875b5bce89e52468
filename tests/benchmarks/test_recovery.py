"""The recovery report's judgement of when a learning run has healed, and where repeated runs
record their energy fits."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.recovery import Run, Window, _fit_dir, healed_from, healing


def run(name: str, joules_per_inference: list[float]) -> Run:
    windows = [
        Window(start_s=10.0 * k, completed=100, energy_j=100.0 * j, p99_ms=30.0, table_error=None)
        for k, j in enumerate(joules_per_inference)
    ]
    return Run(name, windows, {})


BASE = run("max", [2.0, 2.0, 2.0, 2.0])
CLEAN = run("clean", [1.4, 1.4, 1.4, 1.4])  # a 30% saving in every window


def test_healed_from_the_first_window_after_which_every_gap_stays_within_three_points() -> None:
    # savings 5%, 26%, 28.5%, 20%, 27.5%, 28%: gaps 25, 4, 1.5, 10, 2.5, 2 points
    learner = run("learning", [1.9, 1.48, 1.43, 1.6, 1.45, 1.44])
    base = run("max", [2.0] * 6)
    clean = run("clean", [1.4] * 6)
    assert healed_from(learner, clean, base) == 40.0  # not 20 s: 30-40 s is 10 points short
    assert healed_from(clean, clean, base) == 0.0


def test_a_run_short_in_its_last_window_or_empty_there_has_not_healed() -> None:
    assert healed_from(run("short", [1.4, 1.4, 1.4, 1.6]), CLEAN, BASE) is None
    empty = Run(
        "empty",
        [*run("x", [1.4, 1.4, 1.4]).windows, Window(30.0, 0, 0.0, math.nan, None)],
        {},
    )
    assert healed_from(empty, CLEAN, BASE) is None


def test_healing_names_each_run() -> None:
    runs = [run("a", [2.0, 1.4, 1.4, 1.4]), run("b", [2.0] * 4)]
    text = healing(runs, [healed_from(r, CLEAN, BASE) for r in runs])
    assert "- a: from 10 s on" in text
    assert "- b: not by the last window" in text


def test_repeated_runs_record_their_fits_apart() -> None:
    assert _fit_dir(None, 2, 3) is None
    assert _fit_dir(Path("fits"), 1, 1) == Path("fits")
    assert _fit_dir(Path("fits"), 2, 3) == Path("fits/2")
