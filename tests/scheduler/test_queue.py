from __future__ import annotations

import random
from collections import Counter

from scheduler.queue import PriorityCfsQueue, vruntime_charge
from scheduler.request import Request
from tests.scheduler.helpers import make_request

_seq = iter(range(1_000_000))


def push(q: PriorityCfsQueue[None], **kw: object) -> Request[None]:
    r = make_request(**kw)  # type: ignore[arg-type]
    r.seq = next(_seq)
    r.level = r.priority or 2
    q.push(r)
    return r


def test_strict_priority_then_fifo_within_a_flow() -> None:
    q: PriorityCfsQueue[None] = PriorityCfsQueue()
    low1 = push(q, priority=2)
    low2 = push(q, priority=0)  # the default level is 2 here
    high = push(q, priority=1)
    assert [q.pop(5.0), q.pop(5.0), q.pop(5.0), q.pop(5.0)] == [high, low1, low2, None]


def test_cfs_shares_follow_nice_weights() -> None:
    q: PriorityCfsQueue[None] = PriorityCfsQueue()
    for _ in range(2000):
        push(q, client_id="a", nice=0)
        push(q, client_id="b", nice=5)
    served: Counter[str] = Counter()
    for _ in range(1000):
        r = q.pop(7.0)
        assert r is not None
        q.settle(r, 7.0)  # real == expected
        served[r.client_id] += 1
    assert abs(served["a"] / served["b"] - 1024 / 335) < 0.05


def test_waking_flow_is_placed_at_min_vruntime() -> None:
    q: PriorityCfsQueue[None] = PriorityCfsQueue()
    for _ in range(50):
        push(q, client_id="busy")
    for _ in range(20):
        q.pop(10.0)
    busy_vr = q.flow_vruntimes(2)["busy"]
    assert busy_vr == vruntime_charge(200.0, 0)
    newcomer = push(q, client_id="new")
    # Placed at the level's min vruntime, not at 0: it cannot run 20 times in a row.
    assert q.flow_vruntimes(2)["new"] == q.min_vruntime(2) > 0
    order = [q.pop(10.0) for _ in range(3)]
    assert newcomer in order[:2]
    assert sum(r is not None and r.client_id == "busy" for r in order) >= 1


def test_sleeper_gets_no_credit_for_sleeping() -> None:
    q: PriorityCfsQueue[None] = PriorityCfsQueue()
    push(q, client_id="sleeper")
    q.pop(10.0)
    for _ in range(30):
        push(q, client_id="worker")
    for _ in range(25):
        q.pop(10.0)
    push(q, client_id="sleeper")
    assert q.flow_vruntimes(2)["sleeper"] == q.min_vruntime(2)


def test_ties_go_to_the_oldest_request() -> None:
    q: PriorityCfsQueue[None] = PriorityCfsQueue()
    first = push(q, client_id="x")
    second = push(q, client_id="y")
    assert q.pop(1.0) is first
    q.settle(first, 1.0)
    assert q.pop(1.0) is second


def test_settle_charges_real_minus_expected() -> None:
    q: PriorityCfsQueue[None] = PriorityCfsQueue()
    r = push(q, client_id="a", nice=5)
    push(q, client_id="a", nice=5)
    q.pop(10.0)
    before = q.flow_vruntimes(2)["a"]
    q.settle(r, 25.0)  # took 25 ms, 10 were charged
    assert q.flow_vruntimes(2)["a"] == before + vruntime_charge(15.0, 5)


def test_iter_order_is_exactly_the_pop_order() -> None:
    rng = random.Random(4)
    q: PriorityCfsQueue[None] = PriorityCfsQueue()
    for _ in range(300):
        push(
            q,
            client_id=rng.choice("abcd"),
            nice=rng.choice([-5, 0, 5]),
            priority=rng.choice([0, 1, 2]),
            slo_ms=rng.uniform(10, 100),
        )
    preview = [r.seq for r in q.iter_order(300, 7.0)]
    popped = []
    while (r := q.pop(7.0)) is not None:
        popped.append(r.seq)
    assert preview == popped
    assert len(popped) == 300 and len(q) == 0


def test_earliest_deadline_tracks_pops() -> None:
    q: PriorityCfsQueue[None] = PriorityCfsQueue()
    a = push(q, slo_ms=50.0, client_id="a")
    push(q, slo_ms=20.0, client_id="a", arrival_s=0.01)
    assert q.earliest_deadline_s() == 0.03
    q.pop(1.0)
    q.pop(1.0)
    assert q.earliest_deadline_s() is None
    assert a.deadline_s == 0.05


def test_remove_takes_a_waiting_request_out_of_the_order() -> None:
    q: PriorityCfsQueue[None] = PriorityCfsQueue()
    a1, a2, a3 = (push(q, client_id="a") for _ in range(3))
    b1 = push(q, client_id="b", nice=5)
    assert q.remove(a1) and q.remove(a3)  # the head of a flow, and its tail
    assert not q.remove(a1)  # not waiting any more
    assert len(q) == 2 and q.queued_for(2, "a") == 1
    assert list(q.iter_order(10, 5.0)) == [a2, b1]
    assert q.remove(b1) and q.backlogged_weight() == 1024  # only a's flow still waits
    assert q.pop(5.0) is a2 and q.pop(5.0) is None
    assert q.backlogged_weight() == 0 and q.earliest_deadline_s() is None
    assert not q.remove(a2)  # dispatched: not recalled


def test_first_sendable_skips_a_held_model_however_many_wait_ahead() -> None:
    """A model held back (its batch at Triton) blocks nothing behind it: the first request of
    another model goes, in the flow's order, even behind thousands of the held one."""
    q: PriorityCfsQueue[None] = PriorityCfsQueue()
    for _ in range(2000):
        push(q, model="held")
    other = push(q, model="free")
    later = push(q, model="free")
    assert q.first_sendable(lambda model, level: model != "held") is other
    assert q.first_sendable(lambda model, level: True) is q.peek()
    assert q.first_sendable(lambda model, level: False) is None
    q.remove(other)
    assert q.first_sendable(lambda model, level: model != "held") is later


def test_first_sendable_takes_the_flow_cfs_puts_first_among_those_that_can_go() -> None:
    """Inside a level, the flow with the smallest virtual runtime among those with a request
    that may go, not the flow that merely has the oldest request; a higher level held back
    leaves the lower level its turn."""
    q: PriorityCfsQueue[None] = PriorityCfsQueue()
    for _ in range(3):
        push(q, client_id="served", model="free")
    for _ in range(3):
        r = q.pop(10.0)
        assert r is not None
        q.settle(r, 10.0)  # "served" now has run 30 ms
    push(q, client_id="fresh", model="held")
    older_served = push(q, client_id="served", model="free")
    fresh_free = push(q, client_id="fresh", model="free")
    assert q.flow_vruntimes(2)["fresh"] < q.flow_vruntimes(2)["served"]
    assert older_served.seq < fresh_free.seq
    assert q.first_sendable(lambda model, level: model != "held") is fresh_free
    high = push(q, priority=1, model="held")
    assert q.first_sendable(lambda model, level: True) is high
    assert q.first_sendable(lambda model, level: model != "held") is fresh_free
