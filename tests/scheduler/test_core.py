from __future__ import annotations

import pytest

from scheduler.core import Scheduler, SchedulerConfig
from scheduler.registry import make_policy
from scheduler.view import ModelServing
from tests.scheduler import helpers
from tests.scheduler.helpers import CLOCKS, make_request


def make_scheduler(policy: str = "max", **cfg: object) -> Scheduler[None]:
    return helpers.make_scheduler(make_policy(policy, CLOCKS), **cfg)  # type: ignore[arg-type]


def test_bounded_inflight_and_completion() -> None:
    s = make_scheduler(max_inflight=2)
    reqs = [make_request() for _ in range(3)]
    for r in reqs:
        assert s.enqueue(r, 0.0).accepted
    d1, d2 = s.next_dispatch(0.0), s.next_dispatch(0.0)
    assert d1 is not None and d2 is not None
    assert s.next_dispatch(0.0) is None  # two in flight
    s.on_complete(d1.request, 0.007, 0.007)
    d3 = s.next_dispatch(0.007)
    assert d3 is not None and d3.request is reqs[2]
    with pytest.raises(KeyError):
        s.on_complete(d1.request, 0.007, 0.01)


def test_full_queue_refuses_with_a_reason_and_keeps_what_it_has() -> None:
    s = make_scheduler(max_queue=3)
    for i in range(3):
        assert s.enqueue(make_request(client_id=f"c{i}"), 0.0).accepted
    result = s.enqueue(make_request(client_id="late"), 0.0)
    assert not result.accepted
    assert result.reason is not None and "queue full (3 requests waiting)" in result.reason
    assert s.queue_len == 3


def test_fair_admission_caps_a_flooding_flow_but_admits_others() -> None:
    s = make_scheduler(max_queue=100)
    accepted = sum(s.enqueue(make_request(client_id="flood"), 0.0).accepted for _ in range(200))
    assert accepted == 90  # one flow alone may hold (1 - reserve) of the queue
    refused = s.enqueue(make_request(client_id="flood"), 0.0)
    assert refused.reason is not None and "fair share" in refused.reason
    assert s.enqueue(make_request(client_id="vip", priority=1), 0.0).accepted
    assert s.enqueue(make_request(client_id="other"), 0.0).accepted


@pytest.mark.parametrize(
    ("hint", "message"),
    [
        ({"priority": 3}, "priority must be in 0..2"),
        ({"priority": -1}, "priority must be in 0..2"),
        ({"nice": 20}, "nice must be in -20..19"),
        ({"slo_ms": 0.0}, "slo_ms must be a positive number"),
        ({"slo_ms": float("nan")}, "slo_ms must be a positive number"),
    ],
)
def test_bad_hints_are_refused_by_name(hint: dict[str, float], message: str) -> None:
    s = make_scheduler()
    result = s.enqueue(make_request(**hint), 0.0)  # type: ignore[arg-type]
    assert not result.accepted and result.reason is not None and message in result.reason
    assert s.queue_len == 0


def test_priority_zero_is_the_default_level() -> None:
    s = make_scheduler(priority_levels=3)
    low = make_request(priority=0)
    mid = make_request(priority=2)
    s.enqueue(low, 0.0)
    s.enqueue(mid, 0.0)
    assert low.level == 3
    d = s.next_dispatch(0.0)
    assert d is not None and d.request is mid
    with pytest.raises(ValueError):
        SchedulerConfig(priority_levels=2, default_priority_level=3)


def test_arrival_rate_estimate() -> None:
    s = make_scheduler(max_queue=10_000)
    for i in range(2000):
        s.enqueue(make_request(client_id=str(i % 7)), i / 200.0)
        s.next_dispatch(i / 200.0)
        for r in list(s.inflight.values()):
            s.on_complete(r, 0.001, i / 200.0)
    assert s.arrival_rate_rps(2000 / 200.0) == pytest.approx(200.0, rel=0.05)
    assert s.arrival_rate_rps(20.0) < 1.0  # decays when arrivals stop


def test_drain_empties_the_queue_and_leaves_in_flight_alone() -> None:
    s = make_scheduler(max_inflight=1)
    reqs = [make_request(client_id=c) for c in "abc"]
    for r in reqs:
        s.enqueue(r, 0.0)
    d = s.next_dispatch(0.0)
    assert d is not None
    assert s.drain() == reqs[1:]
    assert s.queue_len == 0 and list(s.inflight.values()) == [d.request]
    assert s.next_dispatch(0.0) is None


def test_a_model_at_its_release_depth_does_not_block_another_queued_behind_it() -> None:
    """Hundreds of requests of a model whose batch is at Triton wait ahead of another
    model's: that one goes to Triton all the same."""
    s = make_scheduler()
    for _ in range(600):
        assert s.enqueue(make_request(model="busy", slo_ms=1e5), 0.0).accepted
    assert s.enqueue(make_request(model="other", slo_ms=1e5), 0.0).accepted
    sent = []
    while (d := s.next_dispatch(0.0)) is not None:
        sent.append(d.request.model)
    assert sent.count("busy") == s.release_depth("busy")
    assert sent[-1] == "other" and sent.count("other") == 1


def test_waiting_keeps_arrival_order_as_requests_leave_from_anywhere() -> None:
    s = helpers.make_scheduler(
        make_policy("max", CLOCKS), serving={helpers.MODEL: ModelServing(32, 1)}
    )
    reqs = [make_request(client_id=f"c{i % 3}", nice=(i % 3) * 5 - 5) for i in range(12)]
    for r in reqs:
        assert s.enqueue(r, 0.0).accepted
    waiting = s.queued_of(reqs[0].model)
    assert list(waiting) == reqs and len(waiting) == 12
    sent = [d.request for _ in range(5) if (d := s.next_dispatch(0.0)) is not None]
    assert len(sent) == 5
    s.cancel(reqs[7])
    left = [r for r in reqs if r not in sent and r is not reqs[7]]
    assert list(waiting) == left
    assert [waiting[i] for i in range(len(left))] == left
    assert waiting[-1] is left[-1] and waiting[-len(left)] is left[0]
    assert list(waiting[1:3]) == left[1:3]
    with pytest.raises(IndexError):
        waiting[len(left)]
