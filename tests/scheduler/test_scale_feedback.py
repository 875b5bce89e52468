"""The deadline-scale controller (the token policy's loop): its stability, with injected time
and seeded plants."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from scheduler.feedback import ScaleController, ScaleParams

SLO_MS = 100.0


def drive(
    c: ScaleController,
    start_s: float,
    end_s: float,
    rate_hz: float,
    ratio_of_scale: float,
    rng: np.random.Generator,
    spread: float = 0.05,
) -> list[tuple[float, float]]:
    """Feed completions whose latency / SLO is ``ratio_of_scale · scale`` (a plant whose tail
    grows with the deadline the plan aims at), with a little seeded noise; (time, scale) after
    each."""
    trace = []
    t = start_s
    while t < end_s:
        ratio = ratio_of_scale * c.scale * (1.0 + spread * rng.standard_normal())
        c.observe(t, ratio * SLO_MS, SLO_MS)
        trace.append((t, c.scale))
        t += 1.0 / rate_hz
    return trace


def test_settles_at_the_setpoint_without_oscillating() -> None:
    """A plant with room: the scale creeps up, at most ``max_step`` a period, and stays."""
    p = ScaleParams()
    c = ScaleController(p)
    trace = drive(c, 0.0, 60.0, 200.0, 0.4, np.random.default_rng(1))
    scales = np.array([s for _, s in trace])
    times = np.array([t for t, _ in trace])
    # Each period raises by at most max_step: after 5 s no more than 1.1**5.
    assert scales[times < 5.0].max() <= (1 + p.max_step) ** 5 + 1e-9
    # The plant's p99 is 0.4·scale·(1 + 2.33·0.05): it settles near setpoint / that.
    settled = scales[times > 40.0]
    expected = p.setpoint / (0.4 * (1 + 2.33 * 0.05))
    assert settled.min() > 0.85 * expected and settled.max() <= expected * 1.05
    assert c.backoffs == 0  # never over the SLO: never cut
    # No oscillation: once settled it moves less than 5%.
    assert settled.max() / settled.min() < 1.05


def test_a_burst_costs_one_cut() -> None:
    p = ScaleParams()
    c = ScaleController(p)
    drive(c, 0.0, 10.0, 100.0, 0.5, np.random.default_rng(2))
    before = c.scale
    for i in range(50):  # 50 misses within 0.2 s: one burst
        c.observe(10.0 + i * 0.004, 2.0 * SLO_MS, SLO_MS)
    assert c.backoffs == 1
    assert c.scale == pytest.approx(before * p.backoff)


def test_a_run_of_misses_backs_off_fast_and_stays_bounded() -> None:
    p = ScaleParams()
    c = ScaleController(p)
    drive(c, 0.0, 20.0, 100.0, 0.4, np.random.default_rng(3))
    high = c.scale
    assert high > 1.5
    # The load steps up: the same scale now gives a tail 2× over the SLO.
    trace = drive(c, 20.0, 40.0, 100.0, 2.0 / high, np.random.default_rng(4))
    first_cut = next(t for t, s in trace if s < high)
    # As soon as the misses pass the window's budget (1% of its 1000 samples: the 11th miss at
    # 100 per second), not a window later.
    assert first_cut <= 20.0 + 11 / 100.0 + 1e-9
    cut_times = [t for (_, prev), (t, s) in itertools.pairwise(trace) if s < prev]
    assert all(b - a >= p.backoff_gap_s for a, b in itertools.pairwise(cut_times))
    assert min(s for _, s in trace) >= p.min_scale
    # It ends where the tail is back under the SLO: scale·2/high ≤ 1.
    assert c.scale * 2.0 / high <= 1.0


def test_recovers_after_the_load_steps_back_down() -> None:
    p = ScaleParams()
    c = ScaleController(p)
    drive(c, 0.0, 10.0, 100.0, 1.5, np.random.default_rng(5))  # overloaded: scale cut
    low = c.scale
    assert low < 1.0
    drive(c, 10.0, 60.0, 100.0, 0.4, np.random.default_rng(6))  # the load falls back
    assert c.scale > 1.5 * low
    assert c.scale <= p.max_scale


def test_quiet_class_keeps_its_scale() -> None:
    c = ScaleController()
    drive(c, 0.0, 20.0, 100.0, 0.4, np.random.default_rng(7))
    kept = c.scale
    c.observe(500.0, 0.4 * kept * SLO_MS, SLO_MS)  # one completion after a long silence
    assert c.scale == kept
    assert np.isnan(c.tail_ratio())  # the window emptied: too few to judge


@pytest.mark.parametrize(
    "bad",
    [
        {"target": 1.0},
        {"setpoint": 0.0},
        {"backoff": 1.0},
        {"min_scale": 2.0},
        {"horizon_s": -1.0},
    ],
)
def test_params_are_checked(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ScaleParams(**bad)  # type: ignore[arg-type]


def test_a_rebase_takes_back_earned_room_and_forgets_the_old_window() -> None:
    c = ScaleController()
    drive(c, 0.0, 30.0, 100.0, 0.4, np.random.default_rng(8))
    assert c.scale > 1.5
    c.rebase(1.0)
    assert c.scale == 1.0 and c.rebases == 1
    assert np.isnan(c.attainment())  # what completed under the old plan no longer counts
    c.rebase(1.0)
    assert c.rebases == 1  # nothing to take back: not counted


def feed(
    c: ScaleController, start_s: float, n: int, rate_hz: float, ratio: float, miss_every: int = 0
) -> float:
    """``n`` completions at ``rate_hz`` from ``start_s``, each at ``ratio`` of the SLO but every
    ``miss_every``-th (0: none) at twice it; the time after the last."""
    for i in range(n):
        miss = miss_every > 0 and i % miss_every == miss_every - 1
        c.observe(start_s + i / rate_hz, (2.0 if miss else ratio) * SLO_MS, SLO_MS)
    return start_s + n / rate_hz


def test_a_debt_over_the_horizon_holds_the_scale_until_repaid() -> None:
    """4% misses for 25 s: both loops cut. Then no misses: the window-only loop creeps back up
    at once, the one with a horizon holds its scale until the completions since have paid the
    misses past 1% back, then creeps up too."""
    window_only = ScaleController(ScaleParams())
    horizon = ScaleController(ScaleParams(horizon_s=600.0))
    for c in (window_only, horizon):
        t = feed(c, 0.0, 2500, 100.0, 0.3, miss_every=25)
        assert c.backoffs > 0
    cut = horizon.scale
    assert horizon.debt > 50  # 100 misses against a budget of 25
    for c in (window_only, horizon):
        feed(c, t, 3000, 100.0, 0.3)
    assert window_only.scale > 2 * cut
    assert horizon.scale == cut and horizon.raises == 0
    assert horizon.debt > 0
    feed(horizon, t + 30.0, 12000, 100.0, 0.3)  # 2 minutes more: repaid, decayed
    assert horizon.debt < 0
    assert horizon.scale > 2 * cut


def test_a_debt_takes_misses_off_the_window_budget() -> None:
    """After a debt, the second of three misses a few seconds apart cuts, where the window's own
    budget (1% of the some 400-1,000 completions it holds) lets all three go by."""
    window_only = ScaleController(ScaleParams(max_scale=1.0))
    horizon = ScaleController(ScaleParams(max_scale=1.0, horizon_s=600.0))
    for c in (window_only, horizon):
        t = feed(c, 0.0, 2500, 100.0, 0.3, miss_every=25)
        t = feed(c, t, 1000, 100.0, 0.3)  # a full window without a miss
    assert horizon.debt > 10
    before = {id(c): c.backoffs for c in (window_only, horizon)}
    for c in (window_only, horizon):
        for k in range(3):
            c.observe(t + 3.0 * k, 2.0 * SLO_MS, SLO_MS)
    assert window_only.backoffs == before[id(window_only)]
    assert horizon.backoffs > before[id(horizon)]


def test_no_debt_before_a_full_window_of_completions() -> None:
    """A few early misses set no debt: the horizon counts once it holds ``max_samples``."""
    c = ScaleController(ScaleParams(horizon_s=600.0, max_samples=1000))
    t = feed(c, 0.0, 999, 100.0, 0.3, miss_every=10)
    assert c.debt == 0.0
    feed(c, t, 100, 100.0, 0.3)  # the decayed count passes 1,000
    assert c.debt > 0
