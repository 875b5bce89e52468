"""Arrival processes that move: compressed days, production shapes, bursts; and what ``load``
counts against."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dvfs.profiles import get_profile
from simulator.compare import DEFAULT_MIX, slo_models
from simulator.shapes import SHAPES, DayShape, cosine_day
from simulator.simulate import SimConfig, mix_capacity_rps, simulate, top_clock_capacity_rps
from simulator.workload import DayCycle, day_arrivals, mean_rate_rps


def test_a_shape_passes_through_its_points_and_wraps_around() -> None:
    shape = DayShape("test", (1.0, 3.0, 2.0, 4.0), "by hand")
    # Each value is the rate at the middle of its quarter of the day, over the peak (4).
    mids = (np.arange(4) + 0.5) / 4
    assert np.allclose(shape.at(mids), [0.25, 0.75, 0.5, 1.0])
    # Between two midpoints, linear; past the last one, towards the first (the day wraps).
    assert shape.at(np.array([0.25]))[0] == pytest.approx(0.5)
    assert shape.at(np.array([0.0]))[0] == pytest.approx((1.0 + 0.25) / 2)
    assert shape.at(np.array([1.125]))[0] == pytest.approx(0.25)
    assert shape.trough == 0.25


def test_the_synthetic_day_runs_from_its_trough_at_midnight_to_the_peak_at_noon() -> None:
    day = cosine_day(0.15)
    assert day.at(np.array([0.0]))[0] == pytest.approx(0.15, abs=0.01)
    assert day.at(np.array([0.5]))[0] == pytest.approx(1.0, abs=0.01)
    assert day.trough == pytest.approx(0.15, abs=0.01)
    with pytest.raises(ValueError, match="trough"):
        cosine_day(1.5)


def test_the_production_shapes_are_days_of_hours_with_their_documented_swing() -> None:
    for shape in SHAPES.values():
        assert len(shape.relative) == 24 and max(shape.relative) == 1.0
        assert "Azure LLM inference trace 2024" in shape.source
    assert SHAPES["azure-code"].trough == pytest.approx(0.09)  # an 11× swing
    assert SHAPES["azure-conv"].trough == pytest.approx(0.52)  # about 2×


def test_a_shape_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.txt"
    path.write_text("# hourly\n1\n2\n\n4  # the peak\n")
    shape = DayShape.from_file(path)
    assert shape.relative == (1.0, 2.0, 4.0) and shape.name == "mine"
    assert DayCycle(shape=str(path)).day_shape() == shape
    path.write_text("1\nlots\n")
    with pytest.raises(ValueError, match=r"mine.txt:2: not a relative rate"):
        DayShape.from_file(path)
    with pytest.raises(ValueError, match="unknown day shape"):
        DayCycle(shape="nope").day_shape()


def test_day_arrivals_follow_the_rate_curve() -> None:
    cycle = DayCycle(days=2.0, trough=0.2, burst_factor=1.0)
    peak, duration = 200.0, 400.0
    arrivals = day_arrivals(peak, duration, cycle, np.random.default_rng(0))
    expected = mean_rate_rps(peak, duration, cycle) * duration
    assert len(arrivals) == pytest.approx(expected, rel=0.03)
    assert np.all(np.diff(arrivals) >= 0) and arrivals[0] >= 0 and arrivals[-1] < duration
    # Per 10 s, the count follows the curve: the troughs at 0 and 200 s, the peaks at 100, 300.
    counts = np.histogram(arrivals, bins=40, range=(0, duration))[0] / 10.0
    mids = np.arange(40) * 10.0 + 5.0
    rate = cycle.rate_rps(mids, peak, duration, np.zeros(0))
    assert np.corrcoef(counts, rate)[0, 1] > 0.98
    assert counts[:2].mean() < 0.35 * peak and counts[9:11].mean() > 0.9 * peak


def test_bursts_multiply_the_rate_and_the_peak_stays_the_highest_rate() -> None:
    cycle = DayCycle(days=1.0, trough=1.0, burst_factor=2.0, burst_s=2.0, burst_gap_s=10.0)
    rng = np.random.default_rng(1)
    bursts = cycle.bursts(200.0, rng)
    assert 10 <= len(bursts) <= 30  # about one every 10 s
    t = np.linspace(0.0, 200.0, 20_001)
    rate = cycle.rate_rps(t, 100.0, 200.0, bursts)
    inside = np.zeros_like(t, dtype=bool)
    for b in bursts:
        inside |= (t >= b) & (t < b + 2.0)
    # Flat day (trough 1): 50 req/s, 100 in a burst; the run's rate never passes its peak.
    assert np.allclose(rate[inside], 100.0) and np.allclose(rate[~inside], 50.0)
    assert rate.max() <= 100.0
    arrivals = day_arrivals(100.0, 200.0, cycle, np.random.default_rng(1))
    during = sum(((arrivals >= b) & (arrivals < b + 2.0)).sum() for b in bursts)
    assert during / (inside.mean() * 200.0) > 1.6 * (len(arrivals) - during) / (
        (~inside).mean() * 200.0
    )


def test_day_arrivals_are_seeded() -> None:
    cycle = DayCycle(shape="azure-code")
    first = day_arrivals(50.0, 30.0, cycle, np.random.default_rng(7))
    again = day_arrivals(50.0, 30.0, cycle, np.random.default_rng(7))
    assert np.array_equal(first, again)
    with pytest.raises(ValueError):
        DayCycle(burst_factor=0.5)


def test_a_simulated_day_reports_its_arrivals_and_peak() -> None:
    cfg = SimConfig(
        gpu="v100",
        policy="max",
        rate_rps=80.0,
        arrival="day",
        day=DayCycle(shape="azure-conv"),
        duration_s=10.0,
        with_oracle=False,
    )
    out = simulate(cfg).to_json()
    assert out["arrival"] == "day:azure-conv" and out["rate_rps"] == 80.0
    assert 0 < out["requests"] < 80.0 * 10.0


def test_load_one_is_what_the_top_clock_holds() -> None:
    """``load`` counts against the highest rate at which ``max`` keeps every model's p99
    within its SLO: below it the top clock holds the tail (on other arrivals too), well past
    it it does not, and it is below the full-batch bound that Triton's batcher never reaches."""
    models = slo_models("v100", DEFAULT_MIX, 2.0)
    cfg = SimConfig(gpu="v100", policy="max", models=models, duration_s=20.0, with_oracle=False)
    capacity = top_clock_capacity_rps(cfg)
    assert capacity < mix_capacity_rps(get_profile("v100"), models)
    assert top_clock_capacity_rps(replace(cfg, seed=5, policy="slack")) == capacity  # cached
    held = simulate(replace(cfg, load=0.9, seed=1)).to_json()
    assert held["rate_rps"] == pytest.approx(0.9 * capacity)
    assert held["p99_over_slo"] <= 1.0
    overloaded = simulate(replace(cfg, load=1.3, seed=1)).to_json()
    assert overloaded["p99_over_slo"] > 1.0
    with pytest.raises(ValueError, match="misses these SLOs"):
        top_clock_capacity_rps(replace(cfg, models=slo_models("v100", DEFAULT_MIX, 0.05)))
