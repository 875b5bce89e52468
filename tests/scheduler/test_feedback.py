"""The tail controller's stability, with injected time and seeded plants."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from scheduler.feedback import FeedbackParams, TailController

SLO_MS = 100.0


def drive(
    c: TailController,
    start_s: float,
    end_s: float,
    rate_hz: float,
    at_top: float,
    rng: np.random.Generator,
    spread: float = 0.05,
    floor_level: float = -math.inf,
) -> list[tuple[float, float, float]]:
    """Feed completions from a plant whose latency / SLO is ``at_top`` at the top clock and
    grows as the class's speed falls (``at_top / scale``), with a little seeded noise;
    (time, level, latency / SLO) after each."""
    trace = []
    t = start_s
    while t < end_s:
        ratio = at_top / c.scale * (1.0 + spread * rng.standard_normal())
        c.observe(t, ratio * SLO_MS, SLO_MS, floor_level)
        trace.append((t, c.level, ratio))
        t += 1.0 / rate_hz
    return trace


@pytest.mark.parametrize("fast_descent", [FeedbackParams().fast_descent, 10.0])
def test_settles_where_the_target_quantile_meets_the_setpoint(fast_descent: float) -> None:
    """A plant with room: the class walks down from the top clock and stays where about 1% of
    completions are past the setpoint, without oscillating; one step per completion, or
    faster while far below the setpoint: ``young_descent`` times over the class's first
    ``young_completions``, ``fast_descent`` times after."""
    p = FeedbackParams(fast_descent=fast_descent)
    c = TailController(p)
    trace = drive(c, 0.0, 200.0, 200.0, 0.4, np.random.default_rng(1))
    levels = np.array([lv for _, lv, _ in trace])
    ratios = np.array([r for _, _, r in trace])
    # Slowing down is gradual: one step of gain_at(n)·(1 − target) at the n-th completion,
    # more of them while the tail stays far below the setpoint (from the top clock, at
    # first); the step shrinks as the class settles.
    changes = np.diff(levels)  # the i-th is the (i + 2)-th completion's
    n = np.arange(len(changes)) + 2
    steps = np.array([p.gain_at(int(k)) for k in n]) * (1 - p.target)
    young = n < p.young_completions
    times = np.where(young, max(p.fast_descent, p.young_descent), p.fast_descent)
    down = changes < 0
    downs, down_steps, down_times = -changes[down], steps[down], times[down]
    assert np.all(downs <= down_times * down_steps + 1e-12)
    assert np.allclose(downs[:50], down_steps[:50])  # a hundred completions before it is sure
    fast = np.isclose(downs, down_times * down_steps) & (down_times > 1)
    assert fast[young[down]].sum() >= 20  # the walk down from the top, while young
    assert not fast[-5000:].any()  # far from the setpoint only
    if p.fast_descent == 1:  # settled, one step per completion
        assert np.allclose(downs[~young[down]], down_steps[~young[down]])
    assert np.median(downs[-5000:]) == pytest.approx(p.settled_gain * (1 - p.target))
    # Where the plant's p99 (0.4/scale·(1 + 2.33·0.05)) meets the setpoint.
    expected = -math.log(p.setpoint / (0.4 * (1 + 2.33 * 0.05)))
    settled = levels[-10_000:]
    assert abs(float(np.median(settled)) - expected) < 0.05
    # No oscillation: once settled the speed stays within a few of its 5% steps.
    assert math.exp(settled.max() - settled.min()) < 1.2
    # And the tail it holds: about 1% past the setpoint, the SLO itself kept.
    late = ratios[-10_000:]
    assert 0.003 < float(np.mean(late > p.setpoint)) < 0.02
    assert float(np.quantile(late, 0.99)) <= 1.0


def test_the_first_completions_move_nothing() -> None:
    p = FeedbackParams(min_samples=20)
    c = TailController(p)
    for i in range(20):
        assert not c.observe(i * 0.01, 2.0 * SLO_MS, SLO_MS)
    assert c.level == 0.0 and c.near_misses == 20
    c.level = -1.0
    assert c.observe(1.0, 2.0 * SLO_MS, SLO_MS)  # the 21st counts: faster at once
    assert c.level == pytest.approx(-1.0 + p.gain_at(21) * p.target)


def test_the_step_is_large_for_a_new_class_and_settles() -> None:
    """``gain · √(settle_completions / n)``: about seven times ``gain`` at the first step,
    ``gain`` at the 1,000th completion, ``settled_gain`` from the 4,000th on."""
    p = FeedbackParams(gain=0.05, settled_gain=0.025, settle_completions=1000)
    assert p.gain_at(21) == pytest.approx(0.05 * math.sqrt(1000 / 21))
    assert p.gain_at(1000) == pytest.approx(0.05)
    assert p.gain_at(4000) == pytest.approx(0.025)
    assert p.gain_at(10**6) == pytest.approx(0.025)
    steps = [p.gain_at(n) for n in range(21, 5000)]
    assert all(a >= b for a, b in itertools.pairwise(steps))
    with pytest.raises(ValueError, match="settled_gain"):
        FeedbackParams(gain=0.05, settled_gain=0.06)
    with pytest.raises(ValueError, match="settle_completions"):
        FeedbackParams(settle_completions=0)


def test_a_run_of_near_misses_speeds_up_within_the_run() -> None:
    p = FeedbackParams()
    c = TailController(p)
    drive(c, 0.0, 60.0, 100.0, 0.3, np.random.default_rng(3))
    low = c.level
    assert low < -0.5
    # The load steps up: at the same speed the tail is now 1.5× over the SLO.
    trace = drive(c, 60.0, 90.0, 100.0, 0.3 * 1.5 / 0.95, np.random.default_rng(4))
    first_up = next(t for t, lv, _ in trace if lv > low)
    assert first_up < 60.0 + 0.02  # the first near miss is answered
    ups = [b - a for (_, a, _), (_, b, _) in itertools.pairwise(trace) if b > a]
    assert max(ups) <= p.settled_gain * p.target + 1e-12  # each one settled step
    # It ends where the tail is back at the setpoint, never past the top clock.
    assert max(lv for _, lv, _ in trace) <= 0.0
    tail = [r for t, _, r in trace if t > 80.0]
    assert float(np.quantile(tail, 0.99)) <= 1.0


def test_recovers_after_the_load_steps_back_down() -> None:
    p = FeedbackParams()
    c = TailController(p)
    drive(c, 0.0, 20.0, 100.0, 0.9, np.random.default_rng(5))  # no room: near the top
    high = c.level
    assert high > -0.1
    drive(c, 20.0, 120.0, 100.0, 0.3, np.random.default_rng(6))  # the load falls back
    assert c.level < high - 0.5  # ten thousand completions with room: much slower
    assert c.level >= math.log(0.3 / p.setpoint) - 0.2  # but not past where the tail holds


def test_never_winds_up_below_the_floor() -> None:
    """At its energy floor with room to spare, the level stays at the floor: the first near
    miss when the load returns moves it up from there, not from a credit built below."""
    p = FeedbackParams()
    c = TailController(p)
    floor = -0.4
    drive(c, 0.0, 60.0, 100.0, 0.1, np.random.default_rng(7), floor_level=floor)
    assert c.level == pytest.approx(floor)
    c.observe(60.0, 2.0 * SLO_MS, SLO_MS, floor)
    assert c.level == pytest.approx(floor + p.gain_at(c.completions) * p.target)


def test_quiet_class_keeps_its_level() -> None:
    c = TailController()
    drive(c, 0.0, 20.0, 100.0, 0.4, np.random.default_rng(8))
    kept = c.level
    assert math.isfinite(c.tail_ratio())
    # Nothing for a long time: nothing moves, and the window forgets the old completions.
    c.observe(500.0, 0.4 * SLO_MS, SLO_MS)
    step = c.params.gain_at(c.completions) * (1 - c.params.target)
    assert c.level == pytest.approx(kept - step)
    assert math.isnan(c.tail_ratio())  # one completion: too few to judge


def test_a_rebase_keeps_the_level_and_judges_afresh() -> None:
    c = TailController()
    drive(c, 0.0, 30.0, 100.0, 0.4, np.random.default_rng(9))
    kept = c.level
    c.rebase()
    assert c.level == kept and c.rebases == 1
    assert math.isnan(c.attainment())  # what completed under the old plan no longer counts
    for i in range(c.params.min_samples):  # a new warm-up
        assert not c.observe(31.0 + i * 0.01, 2.0 * SLO_MS, SLO_MS)
    assert c.level == kept


@pytest.mark.parametrize(
    "bad",
    [
        {"target": 1.0},
        {"setpoint": 0.0},
        {"gain": 0.0},
        {"idle_depth": 1.5},
        {"min_samples": -1},
        {"young_completions": -1},
        {"young_descent": 0.5},
        {"fast_descent": 0.0},
        {"start_queue": 0},
    ],
)
def test_params_are_checked(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FeedbackParams(**bad)  # type: ignore[arg-type]


def test_a_young_class_pushed_up_comes_back_down_sooner() -> None:
    """Near misses at a class's first completions (taken at its largest steps) push it to the
    top; with room after, it walks down ``young_descent`` times faster while young, so it is
    near where its tail holds within its first thousand completions, not minutes later."""
    levels = {}
    for young_descent in (1.0, FeedbackParams().young_descent):
        c = TailController(FeedbackParams(young_descent=young_descent), level=-0.8)
        for i in range(40):  # a hiccup: the first completions all past the SLO
            c.observe(i * 0.01, 1.2 * SLO_MS, SLO_MS)
        assert c.level >= 0.0  # at the top (or past it: overshoot)
        drive(c, 0.4, 9.9, 100.0, 0.3, np.random.default_rng(11))  # 950 completions more
        assert c.completions < c.params.young_completions
        levels[young_descent] = c.level
    holds = -math.log(FeedbackParams().setpoint / (0.3 * (1 + 2.33 * 0.05)))
    assert levels[1.0] > holds + 0.3  # one step per completion: still a third too fast
    assert abs(levels[FeedbackParams().young_descent] - holds) < 0.1  # young: there


def test_saturated_at_the_top_it_stays_there() -> None:
    """Near misses beyond the target even at the top clock: the level runs a little past the
    top (the speed asked stays 1), so the completions in between do not walk the class below
    the top; with room again it comes back down, the overshoot bounded."""
    p = FeedbackParams(min_samples=0)
    c = TailController(p)
    rng = np.random.default_rng(11)
    levels = []
    for i in range(20_000):  # 3% near misses whatever the speed: the setpoint is out of reach
        ratio = 0.99 if rng.random() < 0.03 else 0.5
        c.observe(i * 0.01, ratio * SLO_MS, SLO_MS)
        levels.append(c.level)
    late = np.array(levels[-10_000:])
    assert late.max() <= p.overshoot + 1e-12
    assert float(np.mean(late >= 0.0)) > 0.75  # at the top most of the time
    assert c.scale == 1.0
    for i in range(20_000, 21_000):  # room again: back down below the top
        c.observe(i * 0.01, 0.5 * SLO_MS, SLO_MS)
    assert c.level < 0.0 and c.scale < 1.0
