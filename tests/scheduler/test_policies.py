from __future__ import annotations

import math

import pytest

from scheduler.core import Scheduler, SchedulerConfig
from scheduler.policies import SeedPolicy, SlackParams, SlackPolicy, make_policy
from tests.scheduler.helpers import CLOCKS, make_request, make_table

NO_DELAY = SlackParams(change_delay_ms=0.0, phantoms=0)


def slack_scheduler(params: SlackParams = NO_DELAY, **cfg: object) -> tuple[Scheduler, SlackPolicy]:
    table = make_table()
    policy = SlackPolicy(table, CLOCKS, params)
    return Scheduler(table, policy, SchedulerConfig(**cfg)), policy  # type: ignore[arg-type]


def clock_for_mean_ms(budget_ms: float) -> int:
    """Brute force over the ladder: the lowest clock whose mean time fits the budget."""
    fit = make_table().mean_fit
    return min((c for c in CLOCKS if fit.predict_ms(c) <= budget_ms), default=CLOCKS[-1])


def test_max_and_default() -> None:
    table = make_table()
    assert make_policy("max", table, CLOCKS).initial_clock_mhz() == 2100
    assert make_policy("default", table, CLOCKS).initial_clock_mhz() is None
    with pytest.raises(ValueError, match="unknown policy 'fast'; known: max, default, seed, slack"):
        make_policy("fast", table, CLOCKS)


def test_seed_sets_the_clock_for_the_queue_at_enqueue() -> None:
    table = make_table()
    s = Scheduler(table, SeedPolicy(table, CLOCKS), SchedulerConfig())
    # Nothing ahead: one round of 40 ms -> the lowest clock (37.6 ms) will do.
    assert s.enqueue(make_request(slo_ms=40.0), 0.0).clock_mhz is None  # already at 300
    assert s.clock_target_mhz == 300
    s.enqueue(make_request(slo_ms=40.0), 0.0)
    # Two ahead at concurrency 2: ceil(3/2) = 2 rounds of 20 ms -> f >= 692 MHz -> 900.
    assert s.enqueue(make_request(slo_ms=40.0), 0.0).clock_mhz == 900


def test_seed_steps_up_one_step_at_dequeue_when_the_slo_would_break() -> None:
    table = make_table()
    s = Scheduler(table, SeedPolicy(table, CLOCKS), SchedulerConfig())
    for _ in range(3):
        s.enqueue(make_request(slo_ms=40.0), 0.0)
    assert s.clock_target_mhz == 900
    # Waited 30 ms; 30 + 15.6 (900 MHz) > 40: raise to the clock for a queue one longer
    # (2 ahead -> 900 MHz) but at least the next clock up: 1200.
    d = s.next_dispatch(0.030)
    assert d is not None and d.clock_mhz == 1200
    # In time: no change.
    s2 = Scheduler(table, SeedPolicy(table, CLOCKS), SchedulerConfig())
    s2.enqueue(make_request(slo_ms=40.0), 0.0)
    d2 = s2.next_dispatch(0.001)
    assert d2 is not None and d2.clock_mhz is None


def test_slack_never_below_the_energy_optimal_clock() -> None:
    s, policy = slack_scheduler()
    assert policy.floor_mhz == 900 and policy.initial_clock_mhz() == 900
    s.enqueue(make_request(slo_ms=1000.0), 0.0)
    assert policy.target_mhz(s, 0.0) == 900


def test_slack_meets_one_request_at_its_tail_in_closed_form() -> None:
    s, policy = slack_scheduler()
    s.enqueue(make_request(slo_ms=12.0), 0.0)
    # ((room·safety) − q·√1) / 1 = 12·0.95 − 1 = 10.4 ms of mean time -> 1500 MHz.
    assert policy.budgets_ms(s, 0.0)[0] == pytest.approx(12.0 * 0.95 - 1.0)
    assert policy.target_mhz(s, 0.0) == clock_for_mean_ms(10.4) == 1500


def test_slack_walks_every_request_in_dispatch_order() -> None:
    s, policy = slack_scheduler(max_inflight=1)
    s.enqueue(make_request(slo_ms=100.0, client_id="a"), 0.0)
    s.enqueue(make_request(slo_ms=25.0, client_id="a"), 0.0)
    # The second one finishes after two service times: (25·0.95 − √2)/2 ms each.
    expected = (25.0 * 0.95 - math.sqrt(2.0)) / 2.0
    assert policy.budgets_ms(s, 0.0)[0] == pytest.approx(expected)
    assert policy.target_mhz(s, 0.0) == clock_for_mean_ms(expected)


def test_slack_counts_in_flight_work() -> None:
    s, policy = slack_scheduler(max_inflight=1)
    s.enqueue(make_request(slo_ms=30.0), 0.0)
    s.next_dispatch(0.0)
    assert s.clock_target_mhz == 900
    s.enqueue(make_request(slo_ms=30.0, arrival_s=0.0), 0.0)
    # The queued one needs two service times, (30·0.95 − √2)/2 = 13.5 ms: raised to 1200 MHz,
    # and the request in flight now goes at that speed.
    assert s.clock_target_mhz == 1200
    now = 0.005
    work_left = 1.0 - 5.0 / policy.table.predict_ms(1200)
    assert s.inflight_work_left(now)[0][0] == pytest.approx(work_left)
    units = work_left + 1.0
    room = 30.0 - 5.0
    assert policy.budgets_ms(s, now)[0] == pytest.approx((room * 0.95 - math.sqrt(units)) / units)


def test_slack_raises_at_once_and_lowers_only_after_the_hold() -> None:
    params = SlackParams(change_delay_ms=0.0, phantoms=0, hold_s=0.05)
    s, _ = slack_scheduler(params)
    result = s.enqueue(make_request(slo_ms=12.0), 0.0)
    assert result.clock_mhz == 1500
    d = s.next_dispatch(0.0)
    assert d is not None
    done = s.on_complete(d.request, 0.007, 0.007)
    assert done.clock_mhz is None  # idle now, but not for long enough
    assert s.wake_at_s() == pytest.approx(0.057)
    assert s.poll(0.03) is None
    assert s.poll(0.057) == 900
    assert s.wake_at_s() is None


def test_slack_allows_for_the_clock_change_delay_when_raising() -> None:
    s, policy = slack_scheduler(SlackParams(change_delay_ms=2.0, phantoms=0))
    s.enqueue(make_request(slo_ms=14.0), 0.0)
    budget, delayed = policy.budgets_ms(s, 0.0)
    assert delayed == pytest.approx(budget - 2.0 * 0.95)
    assert policy.target_mhz(s, 0.0) == clock_for_mean_ms(delayed)


def test_slack_phantoms_keep_up_with_the_arrival_rate() -> None:
    s_without, p_without = slack_scheduler(SlackParams(change_delay_ms=0.0, phantoms=0))
    s_with, p_with = slack_scheduler(SlackParams(change_delay_ms=0.0, phantoms=16))
    for s in (s_without, s_with):
        for i in range(300):  # 150 requests/s for 2 s, each served at once
            s.enqueue(make_request(slo_ms=60.0, arrival_s=i / 150.0), i / 150.0)
            d = s.next_dispatch(i / 150.0)
            assert d is not None
            s.on_complete(d.request, 0.001, i / 150.0)
        s.enqueue(make_request(slo_ms=60.0, arrival_s=2.0), 2.0)
    # With 150 req/s coming, 2 lanes need a mean time well under 2/150 s = 13.3 ms.
    assert p_without.target_mhz(s_without, 2.0) == 900
    assert p_with.target_mhz(s_with, 2.0) > 900
    assert p_with.table.predict_ms(p_with.target_mhz(s_with, 2.0)) < 1000.0 * 2 / 150
