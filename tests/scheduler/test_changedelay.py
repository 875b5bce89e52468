"""The clock-change delay learned from the raises timed (:mod:`scheduler.changedelay`), and the
policies planning with it."""

from __future__ import annotations

import math

import pytest

from scheduler.changedelay import ChangeDelayParams, ChangeDelays
from scheduler.params import SlackParams
from scheduler.policies import FixedPolicy, MaxPolicy, SlackPolicy

CLOCKS = [600, 900, 1200, 1500]  # the policy's behaviour with it: tests/scheduler/test_policies.py


def test_nothing_is_learned_before_min_samples_then_the_p90_of_the_window() -> None:
    d = ChangeDelays(ChangeDelayParams(window=10, min_samples=5))
    for ms in (20.0, 21.0, 22.0, 23.0):
        d.landed(ms)
    assert d.state(5.0)["measured_ms"] is None and d.planning_ms(5.0) == 5.0
    d.landed(24.0)
    assert d.measured_ms == 24.0  # nearest rank over five: the fifth
    for ms in (19.0,) * 10:  # the window keeps the last ten
        d.landed(ms)
    assert d.measured_ms == 19.0 and d.planning_ms(5.0) == 19.0
    assert d.landed_count == 15


def test_the_configured_delay_is_the_least_planned_with() -> None:
    d = ChangeDelays(ChangeDelayParams(min_samples=1, tolerance_ms=1.0))
    d.landed(5.8)  # within the reading's tolerance of the configured 5 ms: left as it is
    assert d.measured_ms == 5.8 and d.planning_ms(5.0) == 5.0
    d.landed(7.0)
    d.landed(7.0)
    assert d.planning_ms(5.0) == 7.0
    assert d.planning_ms(20.0) == 20.0  # a GPU faster than configured: the configured figure


def test_the_first_raises_are_timed_one_after_another() -> None:
    d = ChangeDelays(ChangeDelayParams(every_s=0.25, warmup=2))
    for t in (0.0, 0.01):
        assert d.due(t)
        d.started(t)
        d.landed(20.0)
        assert d.measured_ms == 20.0 and d.planning_ms(5.0) == 20.0  # from the first
    assert not d.due(0.02) and d.due(0.26)


def test_raises_are_timed_at_most_every_every_s_and_later_after_one_never_shows() -> None:
    d = ChangeDelays(ChangeDelayParams(every_s=0.25, backoff=20.0, warmup=1))
    assert d.due(0.0)
    d.started(0.0)
    d.landed(5.0)  # the warm-up: every raise until one landed
    d.started(0.0)
    assert not d.due(0.2) and d.due(0.25)
    d.started(0.25)
    d.missed(0.25)
    assert d.not_landed == 1 and not d.due(5.0) and d.due(5.25)
    assert d.timed == 3 and d.landed_count == 1
    assert d.wants(100.0, 900, 1200)
    assert not d.wants(100.0, 1200, 900) and not d.wants(100.0, None, 900)  # no raise
    assert not d.wants(100.0, 900, None)
    d.active = False  # the policy plans no delay: nothing is timed
    assert not d.due(100.0) and not d.wants(100.0, 900, 1200)


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        ChangeDelays().landed(math.inf)
    with pytest.raises(ValueError, match="finite"):
        ChangeDelays().landed(-1.0)
    with pytest.raises(ValueError, match="min_samples"):
        ChangeDelayParams(window=4, min_samples=5)
    with pytest.raises(ValueError, match="quantile"):
        ChangeDelayParams(quantile=0.0)
    with pytest.raises(ValueError, match="warmup"):
        ChangeDelayParams(warmup=-1)


def test_the_state_says_what_was_timed_and_planned() -> None:
    d = ChangeDelays(ChangeDelayParams(min_samples=2))
    d.started(0.0)
    d.landed(20.0)
    d.started(1.0)
    d.landed(30.0)
    assert d.state(5.0) == {
        "configured_ms": 5.0,
        "planned_ms": 30.0,
        "measured_ms": 30.0,
        "quantile": 0.9,
        "timed": 2,
        "landed": 2,
        "not_landed": 0,
        "recent_ms": [20.0, 30.0],
    }
    assert d.state(None)["planned_ms"] is None


def test_slack_plans_with_the_delay_it_is_given_and_keeps_what_it_was_configured_with() -> None:
    p = SlackPolicy(CLOCKS, SlackParams(change_delay_ms=5.0))
    assert p.configured_change_delay_ms() == 5.0
    p.plan_change_delay_ms(20.0)
    assert p.params.change_delay_ms == 20.0 and p.configured_change_delay_ms() == 5.0
    off = SlackPolicy(CLOCKS, SlackParams(learn_change_delay=False))
    assert off.configured_change_delay_ms() is None
    for fixed in (MaxPolicy(CLOCKS), FixedPolicy(CLOCKS, 900)):
        assert fixed.configured_change_delay_ms() is None
        fixed.plan_change_delay_ms(20.0)  # plans no raise: nothing to change
