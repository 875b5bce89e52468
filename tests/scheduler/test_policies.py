from __future__ import annotations

import math

import pytest

from scheduler.policies import SeedPolicy, SlackParams, SlackPolicy
from scheduler.registry import make_policy
from scheduler.view import ModelServing
from tests.scheduler.helpers import (
    CLOCKS,
    MODEL,
    make_model_table,
    make_request,
    make_scheduler,
    make_table,
)

NO_DELAY = SlackParams(change_delay_ms=0.0, phantoms=0, batch_hold=0.0)


def clock_for_mean_ms(budget_ms: float, slower: float = 1.0) -> int:
    """Brute force over the ladder: the lowest clock whose mean time fits the budget."""
    fit = make_table(slower=slower).mean_fit
    return min((c for c in CLOCKS if fit.predict_ms(c) <= budget_ms), default=CLOCKS[-1])


def test_max_default_fixed_and_unknown() -> None:
    assert make_policy("max", CLOCKS).initial_clock_mhz() == 2100
    assert make_policy("default", CLOCKS).initial_clock_mhz() is None
    assert make_policy("fixed:900", CLOCKS).initial_clock_mhz() == 900
    with pytest.raises(ValueError, match=r"whole number of MHz, got .900\.5."):
        make_policy("fixed:900.5", CLOCKS)
    with pytest.raises(ValueError, match="1000 MHz is not a supported clock"):
        make_policy("fixed:1000", CLOCKS)
    with pytest.raises(ValueError, match="unknown policy 'fast'; known: max, default, seed, slack"):
        make_policy("fast", CLOCKS)


def test_seed_sets_the_clock_for_the_queue_at_enqueue() -> None:
    s = make_scheduler(SeedPolicy(CLOCKS))
    # Nothing ahead: one round of 40 ms -> the lowest clock (37.6 ms) will do.
    assert s.enqueue(make_request(slo_ms=40.0), 0.0).clock_mhz is None  # already at 300
    assert s.clock_target_mhz == 300
    s.enqueue(make_request(slo_ms=40.0), 0.0)
    # Two ahead at concurrency 2: ceil(3/2) = 2 rounds of 20 ms -> f >= 692 MHz -> 900.
    assert s.enqueue(make_request(slo_ms=40.0), 0.0).clock_mhz == 900


def test_seed_steps_up_one_step_at_dequeue_when_the_slo_would_break() -> None:
    s = make_scheduler(SeedPolicy(CLOCKS))
    for _ in range(3):
        s.enqueue(make_request(slo_ms=40.0), 0.0)
    assert s.clock_target_mhz == 900
    # Waited 30 ms; 30 + 15.6 (900 MHz) > 40: raise to the clock for a queue one longer
    # (2 ahead -> 900 MHz) but at least the next clock up: 1200.
    d = s.next_dispatch(0.030)
    assert d is not None and d.clock_mhz == 1200
    # In time: no change.
    s2 = make_scheduler(SeedPolicy(CLOCKS))
    s2.enqueue(make_request(slo_ms=40.0), 0.0)
    d2 = s2.next_dispatch(0.001)
    assert d2 is not None and d2.clock_mhz is None


def test_slack_never_below_the_energy_optimal_clock() -> None:
    policy = SlackPolicy(CLOCKS, NO_DELAY)
    s = make_scheduler(policy)
    s.enqueue(make_request(slo_ms=1000.0), 0.0)
    assert policy.target_mhz(s, 0.0) == 900


def test_slack_meets_one_request_at_its_tail() -> None:
    policy = SlackPolicy(CLOCKS, NO_DELAY)
    s = make_scheduler(policy)
    s.enqueue(make_request(slo_ms=12.0), 0.0)
    # mean + q·√1 <= room·safety: 12·0.95 − 1 = 10.4 ms of mean time -> 1500 MHz.
    assert policy.target_mhz(s, 0.0) == clock_for_mean_ms(12.0 * 0.95 - 1.0) == 1500


def test_slack_walks_every_request_in_dispatch_order() -> None:
    policy = SlackPolicy(CLOCKS, NO_DELAY)
    s = make_scheduler(policy)
    s.enqueue(make_request(slo_ms=100.0, client_id="a"), 0.0)
    s.enqueue(make_request(slo_ms=25.0, client_id="a"), 0.0)
    # Batches of 1: the second finishes after two executions, 2·t + √2 <= 25·0.95.
    expected = (25.0 * 0.95 - math.sqrt(2.0)) / 2.0
    assert policy.target_mhz(s, 0.0) == clock_for_mean_ms(expected)


def test_slack_plans_in_batches_and_needs_a_lower_clock_for_them() -> None:
    """Four requests run as one batch of 4 (1.5× a single one), not four in a row."""
    batched = SlackPolicy(CLOCKS, NO_DELAY)
    table = make_model_table(batches={1: 1.0, 4: 1.5})
    s = make_scheduler(batched, table, serving={MODEL: ModelServing(4, 1)})
    for _ in range(4):
        s.enqueue(make_request(slo_ms=30.0), 0.0)
    expected = (30.0 * 0.95 - 1.0) / 1.5
    assert batched.target_mhz(s, 0.0) == clock_for_mean_ms(expected) == 900
    one_by_one = SlackPolicy(CLOCKS, NO_DELAY)
    s1 = make_scheduler(one_by_one, table, serving={MODEL: ModelServing(1, 1)})
    for _ in range(4):
        s1.enqueue(make_request(slo_ms=30.0), 0.0)
    assert one_by_one.target_mhz(s1, 0.0) == 2100  # 4·t + 2 ms <= 28.5 needs 6.6 ms: none


def test_slack_counts_in_flight_work_less_what_is_done() -> None:
    policy = SlackPolicy(CLOCKS, NO_DELAY)
    s = make_scheduler(policy, serving={MODEL: ModelServing(1, 1)})
    s.enqueue(make_request(slo_ms=30.0), 0.0)
    assert s.next_dispatch(0.0) is not None
    s.enqueue(make_request(slo_ms=30.0, arrival_s=0.0), 0.0)
    # Two executions ahead of the second: 2·t + √2 <= 30·0.95.
    assert s.clock_target_mhz == clock_for_mean_ms((30.0 * 0.95 - math.sqrt(2)) / 2) == 1200
    # 5 ms later the one in flight has done 5 ms of its work: 2·t − 5 + √2 <= 25·0.95.
    assert policy.target_mhz(s, 0.005) == clock_for_mean_ms((25 * 0.95 - math.sqrt(2) + 5) / 2)


def test_slack_raises_at_once_and_lowers_only_after_the_hold() -> None:
    params = SlackParams(change_delay_ms=0.0, phantoms=0, hold_s=0.05, batch_hold=0.0)
    s = make_scheduler(SlackPolicy(CLOCKS, params))
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
    policy = SlackPolicy(CLOCKS, SlackParams(change_delay_ms=2.0, phantoms=0, batch_hold=0.0))
    s = make_scheduler(policy)
    s.enqueue(make_request(slo_ms=14.0), 0.0)
    assert policy.target_mhz(s, 0.0) == clock_for_mean_ms((14.0 - 2.0) * 0.95 - 1.0)


def test_slack_plans_raises_with_the_delay_learned() -> None:
    """A delay learned (``plan_change_delay_ms``) is counted as a configured one is."""
    targets = []
    for configured, learned in ((2.0, None), (2.0, 4.0), (4.0, None)):
        policy = SlackPolicy(
            CLOCKS, SlackParams(change_delay_ms=configured, phantoms=0, batch_hold=0.0)
        )
        s = make_scheduler(policy)
        if learned is not None:
            policy.plan_change_delay_ms(learned)
        s.enqueue(make_request(slo_ms=14.0), 0.0)  # a raise from the floor, asked now
        targets.append(s.clock_target_mhz)
    assert targets == [1500, 2100, 2100]


def test_slack_phantoms_keep_up_with_the_arrival_rate() -> None:
    results = []
    for phantoms in (0, 16):
        policy = SlackPolicy(CLOCKS, SlackParams(change_delay_ms=0.0, phantoms=phantoms))
        s = make_scheduler(policy, serving={MODEL: ModelServing(1, 2)})
        for i in range(300):  # 150 requests/s for 2 s, each served at once
            s.enqueue(make_request(slo_ms=60.0, arrival_s=i / 150.0), i / 150.0)
            d = s.next_dispatch(i / 150.0)
            assert d is not None
            s.on_complete(d.request, 0.001, i / 150.0)
        s.enqueue(make_request(slo_ms=60.0, arrival_s=2.0), 2.0)
        results.append(policy.target_mhz(s, 2.0))
    # 16 more at 150 req/s, in a burst, one at a time: each must take well under 60/16 ms.
    assert results[0] == 900
    assert results[1] > 900
    assert make_table().predict_ms(results[1]) < 1000.0 * 2 / 150


def test_two_models_each_predicted_by_its_own_table() -> None:
    """A fast and a 3× slower model share one queue; each request's work is its own model's."""
    fast = make_model_table(model="fast")
    slow = make_model_table(model="slow", slower=3.0)
    policy = SlackPolicy(CLOCKS, NO_DELAY)
    serving = {"fast": ModelServing(1, 1), "slow": ModelServing(1, 1)}
    s = make_scheduler(policy, fast, slow, serving=serving)
    clock = s.clock_target_mhz
    assert clock is not None
    assert s.charge_ms("fast") == pytest.approx(fast.predict_ms(clock))
    assert s.charge_ms("slow") == pytest.approx(slow.predict_ms(clock))
    assert s.charge_ms("slow") == pytest.approx(3 * s.charge_ms("fast"))
    s.enqueue(make_request(model="slow", slo_ms=40.0), 0.0)
    # The slow model alone: t_slow + 1 <= 38 -> its own table's clock, not the fast one's.
    assert policy.target_mhz(s, 0.0) == clock_for_mean_ms(40 * 0.95 - 1, slower=3.0) == 1500
    s2 = make_scheduler(SlackPolicy(CLOCKS, NO_DELAY), fast, slow, serving=serving)
    s2.enqueue(make_request(model="fast", slo_ms=40.0), 0.0)
    assert s2.policy.target_mhz(s2, 0.0) == 900  # type: ignore[attr-defined]


def test_slack_gives_a_model_without_a_table_the_top_clock() -> None:
    policy = SlackPolicy(CLOCKS, NO_DELAY)
    s = make_scheduler(policy)
    s.enqueue(make_request(model="unprofiled", slo_ms=1000.0), 0.0)
    assert policy.target_mhz(s, 0.0) == 2100


def test_slack_holds_a_partial_batch_while_it_pays_and_lets_it_go_together() -> None:
    policy = SlackPolicy(CLOCKS, SlackParams(change_delay_ms=0.0, phantoms=0, batch_hold=0.5))
    table = make_model_table(batches={1: 1.0, 8: 2.0})
    s = make_scheduler(policy, table, serving={MODEL: ModelServing(8, 1)})
    for i in range(20):  # 200 requests/s measured, served one by one (too tight to hold)
        s.enqueue(make_request(slo_ms=5.0, arrival_s=i / 200), i / 200)
        d = s.next_dispatch(i / 200)
        assert d is not None
        s.on_complete(d.request, 0.001, i / 200)
    now = 0.2
    first = make_request(slo_ms=100.0, arrival_s=now)
    s.enqueue(first, now)
    assert s.next_dispatch(now) is None  # held: more are on their way
    hold = s.wake_at_s()
    assert hold is not None and now < hold <= now + 0.05 + 1e-9  # at most half its SLO
    s.enqueue(make_request(slo_ms=100.0, arrival_s=now + 0.01), now + 0.01)
    assert s.next_dispatch(now + 0.01) is None
    s.poll(hold)  # the hold falls due
    sent = [s.next_dispatch(hold), s.next_dispatch(hold)]
    assert all(d is not None for d in sent)  # both go together, as one batch
    assert s.next_dispatch(hold) is None


def test_slack_lets_a_full_batch_go_at_once() -> None:
    policy = SlackPolicy(CLOCKS, SlackParams(change_delay_ms=0.0, phantoms=0, batch_hold=0.5))
    table = make_model_table(batches={1: 1.0, 4: 1.5})
    s = make_scheduler(policy, table, serving={MODEL: ModelServing(4, 1)})
    for i in range(4):
        s.enqueue(make_request(slo_ms=100.0), 0.001 * i)
    assert sum(s.next_dispatch(0.004) is not None for _ in range(5)) == 4


def test_dispatch_keeps_two_full_batches_at_triton_under_saturation() -> None:
    """Two full batches at Triton while one level is alone (one running, one ready; one
    with ``triton_batches_alone=1``); the rest waits in the sidecar, one more released for each
    completion."""
    s = make_scheduler(make_policy("max", CLOCKS), serving={MODEL: ModelServing(8, 2)})
    for _ in range(100):
        s.enqueue(make_request(), 0.0)
    sent = 0
    while s.next_dispatch(0.0) is not None:
        sent += 1
    assert sent == 8  # the second batch once the first is expected nearly done
    due_s = s.wake_at_s()
    assert due_s is not None and due_s > 0.0
    while s.next_dispatch(due_s) is not None:
        sent += 1
    assert sent == s.release_depth(MODEL, due_s) == 16
    assert s.queue_len == 84
    d_done = next(iter(s.inflight.values()))
    s.on_complete(d_done, 0.01, due_s + 0.01)
    assert s.next_dispatch(due_s + 0.01) is not None and s.next_dispatch(due_s + 0.01) is None
