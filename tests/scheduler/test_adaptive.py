"""The adaptive policy on the scheduler core, with injected time."""

from __future__ import annotations

from scheduler.adaptive import MAX_CLASSES, AdaptivePolicy
from scheduler.policies import SlackPolicy
from scheduler.view import ModelServing
from tests.scheduler.helpers import CLOCKS, MODEL, make_model_table, make_request, make_scheduler
from time2clock.table import TableSet


def serve(policy: AdaptivePolicy, until_s: float, slo_ms: float = 100.0) -> float:
    """Requests one at a time, every 10 ms, each done 5 ms after it is sent; the time reached."""
    s = make_scheduler(policy, make_model_table(), serving={MODEL: ModelServing(1, 1)})
    now = 0.0
    while now < until_s:
        s.enqueue(make_request(arrival_s=now, slo_ms=slo_ms), now)
        d = s.next_dispatch(now)
        assert d is not None
        s.on_complete(d.request, 0.005, now + 0.005)
        now += 0.01
    return now


def test_completions_well_under_the_slo_earn_room() -> None:
    policy = AdaptivePolicy(CLOCKS)
    serve(policy, 20.0)
    (state,) = policy.state()
    assert state["model"] == MODEL and state["slo_ms"] == 100.0
    assert state["attainment"] == 1.0
    assert float(state["scale"]) > 1.5  # type: ignore[arg-type]


def test_a_class_with_room_plans_a_lower_clock_than_slack() -> None:
    adaptive, slack = AdaptivePolicy(CLOCKS), SlackPolicy(CLOCKS)
    serve(adaptive, 20.0)
    targets = []
    for policy in (adaptive, slack):
        s = make_scheduler(policy, make_model_table(), serving={MODEL: ModelServing(1, 1)})
        for _ in range(6):
            s.enqueue(make_request(arrival_s=0.0, slo_ms=100.0), 0.0)
        targets.append(s.clock_target_mhz)
    assert targets[0] is not None and targets[1] is not None
    assert targets[0] < targets[1]


def test_a_markedly_faster_table_takes_the_earned_room_back() -> None:
    policy = AdaptivePolicy(CLOCKS)
    s = make_scheduler(policy, make_model_table(), serving={MODEL: ModelServing(1, 1)})
    serve(policy, 20.0)
    policy.attach(s)
    s.enqueue(make_request(), 0.0)  # plans with the table in force
    earned = policy.controller(MODEL, 100.0).scale
    assert earned > 1.5
    s.set_tables(TableSet([make_model_table()]))  # the same table again: nothing taken back
    s.enqueue(make_request(), 0.0)
    assert policy.controller(MODEL, 100.0).scale == earned
    s.set_tables(TableSet([make_model_table(slower=0.5)]))  # twice as fast: room taken back
    s.enqueue(make_request(), 0.0)
    assert policy.controller(MODEL, 100.0).scale == 1.0
    assert policy.state()[0]["rebases"] == 1


def test_classes_are_bounded() -> None:
    policy = AdaptivePolicy(CLOCKS)
    for i in range(MAX_CLASSES + 36):
        policy.controller(MODEL, 50.0 + i)
    assert len(policy.controllers) == MAX_CLASSES
    assert (MODEL, 50.0) not in policy.controllers  # the oldest went first
