"""The release depth and the wait bound: what lower levels may keep at Triton while a higher
level is active, and that the higher level never waits in the sidecar for them."""

from __future__ import annotations

import random

import pytest

from scheduler.core import SECOND_BATCH_AT, Scheduler
from scheduler.registry import make_policy
from scheduler.view import ModelServing
from scheduler.waitbound import GUARD_S, SAFETY, WaitBound, bound_ms, execution_ms
from tests.scheduler.helpers import CLOCKS, MODEL, make_model_table, make_request, make_scheduler
from time2clock.table import ModelTable

TOP = CLOCKS[-1]
BATCHES = {1: 1.0, 8: 2.0, 32: 5.0}  # 7.4, 14.8 and 36.9 ms at the top clock
SERVING = ModelServing(32, 2, priority_levels=2, default_priority_level=2)
OTHER = "other"


def scheduler(*models: str, serving: ModelServing = SERVING) -> Scheduler[None]:
    names = models or (MODEL,)
    tables = [make_model_table(batches=BATCHES, model=m) for m in names]
    return make_scheduler(
        make_policy("max", CLOCKS), *tables, serving=dict.fromkeys(names, serving)
    )


def release_all(s: Scheduler[None], now_s: float) -> int:
    sent = 0
    while s.next_dispatch(now_s) is not None:
        sent += 1
    return sent


def at_triton(s: Scheduler[None], level: int, model: str = MODEL) -> int:
    return s.inflight_levels(model).get(level, 0)


def flood(s: Scheduler[None], n: int, now_s: float, model: str = MODEL) -> None:
    for _ in range(n):
        assert s.enqueue(make_request(arrival_s=now_s, slo_ms=1e5, model=model), now_s).accepted


def test_alone_a_level_keeps_two_full_batches_at_triton_and_one_beside_another() -> None:
    """A model whose Triton batcher has no priority levels: what waits there runs first come,
    first served, so a higher level arriving takes the depth back to one batch."""
    s = scheduler(serving=ModelServing(32, 2))
    flood(s, 100, 0.0)
    # into an idle model, one full batch at once; the second once the first is expected
    # three quarters done (36.9 ms for 32 at the top clock), when the scheduler asks to wake
    assert release_all(s, 0.0) == 32
    due_s = SECOND_BATCH_AT * execution_ms(make_model_table(batches=BATCHES), TOP, 32) / 1000
    assert s.wake_at_s() == pytest.approx(due_s)
    assert release_all(s, due_s - 1e-4) == 0
    assert release_all(s, due_s) == 32 and s.release_depth(MODEL, due_s) == 64
    assert s.wake_at_s() is None
    assert s.queue_len == 36  # the rest waits in the sidecar, where priority and CFS decide
    # a higher level arrives: nothing to recall, but the depth is one batch again at once
    assert s.enqueue(make_request(priority=1, slo_ms=1e5), 0.05).accepted
    assert s.release_depth(MODEL, 0.05) == 32
    # and two again once the higher level has been quiet for the guard time
    flood(s, 1, 0.06 + GUARD_S)
    assert s.release_depth(MODEL, 0.06 + GUARD_S) == 64


def test_levels_that_triton_orders_keep_two_batches_while_one_model_has_arrivals() -> None:
    """Where the model's batcher has priority levels that keep the sidecar's levels apart (the
    level goes to Triton as its ``priority``), a higher-level request released now is batched
    before the lower levels' requests waiting at Triton: the second batch stays while this
    model alone has arrivals, and goes once another model's come (Triton orders requests
    within a model, not across the models sharing the GPU)."""
    s = scheduler(MODEL, OTHER)
    flood(s, 100, 0.0)
    release_all(s, 0.0)
    assert s.enqueue(make_request(priority=1, slo_ms=1e5), 0.05).accepted
    assert s.release_depth(MODEL, 1.0) == 64
    flood(s, 1, 1.0, model=OTHER)
    assert s.release_depth(MODEL, 1.0) == 32
    # both levels keep arriving; the other model's one arrival counts for the guard time
    later = 0.9 + GUARD_S
    assert s.enqueue(make_request(priority=1, slo_ms=1e5, arrival_s=later), later).accepted
    assert s.release_depth(MODEL, later) == 32
    flood(s, 1, 1.1 + GUARD_S)
    assert s.release_depth(MODEL, 1.1 + GUARD_S) == 64


def test_levels_that_share_one_triton_level_keep_one_batch() -> None:
    """Two sidecar levels sent as the same Triton priority (the model has one level) are not
    ordered there: one batch, as without priority levels."""
    s = scheduler(serving=ModelServing(32, 2, priority_levels=1, default_priority_level=1))
    flood(s, 100, 0.0)
    release_all(s, 0.0)
    assert s.release_depth(MODEL, 1.0) == 64
    assert s.enqueue(make_request(priority=1, slo_ms=1e5), 1.0).accepted
    assert s.release_depth(MODEL, 1.0) == 32


def test_triton_orders_levels_that_map_to_distinct_priorities() -> None:
    assert ModelServing(8, 1, priority_levels=2, default_priority_level=2).orders((1, 2))
    assert ModelServing(8, 1, priority_levels=2, default_priority_level=2).orders((1, 3))
    assert not ModelServing(8, 1, priority_levels=2, default_priority_level=2).orders((2, 3))
    assert not ModelServing(8, 1).orders((1, 2))


def test_clients_of_different_nice_keep_one_batch_at_triton() -> None:
    """Nice weights have shares to keep only in the sidecar's queue: while two nice values
    arrive, one full batch at Triton, whatever the wait; two again once one alone has for the
    guard time."""
    s = scheduler()
    for _ in range(50):
        assert s.enqueue(make_request(nice=-5, client_id="a", arrival_s=0.0), 0.0).accepted
        assert s.enqueue(make_request(nice=5, client_id="b", arrival_s=0.0), 0.0).accepted
    assert release_all(s, 0.0) == 32
    assert s.wake_at_s() is None  # no second batch to wait for
    assert release_all(s, 1.0) == 0 and s.release_depth(MODEL, 1.0) == 32
    later = GUARD_S + 0.5
    assert s.enqueue(make_request(nice=-5, client_id="a", arrival_s=later), later).accepted
    assert s.release_depth(MODEL, later) == 64  # busy since 0: the second batch is due


def test_a_burst_whose_clients_leave_runs_one_batch_for_nobody() -> None:
    """The second batch waits for the first to be nearly done: clients that leave before then
    are taken out of the sidecar's queue and nothing of theirs runs."""
    s = scheduler()
    requests = [make_request(arrival_s=0.0, slo_ms=1e5) for _ in range(100)]
    for r in requests:
        assert s.enqueue(r, 0.0).accepted
    assert release_all(s, 0.0) == 32
    for r in requests:
        if r.seq not in s.inflight:
            assert s.cancel(r)  # gone before the second batch was due
    assert s.queue_len == 0
    assert release_all(s, 1.0) == 0


def test_a_higher_level_caps_what_lower_levels_keep_at_triton() -> None:
    """With a priority-1 class active (SLO 40 ms), the flood keeps at Triton only what a
    priority-1 request arriving now could wait behind and still meet its SLO: one execution of
    everything there, then its own, at the table's times."""
    s = scheduler()
    slo_ms = 40.0
    assert s.enqueue(make_request(priority=1, slo_ms=slo_ms), 0.0).accepted
    flood(s, 100, 0.0)
    release_all(s, 0.0)
    hi, lo = at_triton(s, 1), at_triton(s, 2)
    assert hi == 1  # the higher level went first
    table = s.table_for(MODEL)
    assert table is not None
    arriving = hi + 1
    assert 1 < lo < 32
    assert 2 * execution_ms(table, TOP, lo + arriving) <= SAFETY * slo_ms
    assert 2 * execution_ms(table, TOP, lo + 1 + arriving) > SAFETY * slo_ms


def test_the_higher_level_is_never_held_for_the_lower() -> None:
    s = scheduler()
    assert s.enqueue(make_request(priority=1, slo_ms=40.0), 0.0).accepted
    flood(s, 100, 0.0)
    release_all(s, 0.0)
    before = at_triton(s, 1)
    for i in range(5):
        assert s.enqueue(make_request(priority=1, slo_ms=40.0, arrival_s=0.001), 0.001).accepted
        assert s.next_dispatch(0.001) is not None, f"priority-1 request {i} was held"
    assert at_triton(s, 1) == before + 5


def test_a_lower_level_is_never_starved_outright() -> None:
    """A higher level whose SLO no batch could meet still leaves the lower level one request
    at Triton."""
    s = scheduler()
    assert s.enqueue(make_request(priority=1, slo_ms=5.0), 0.0).accepted
    flood(s, 50, 0.0)
    release_all(s, 0.0)
    assert at_triton(s, 2) == 1


def test_protection_ends_after_the_higher_level_goes_quiet() -> None:
    s = scheduler()
    assert s.enqueue(make_request(priority=1, slo_ms=40.0), 0.0).accepted
    flood(s, 100, 0.0)
    release_all(s, 0.0)
    capped = at_triton(s, 2)
    for r in list(s.inflight.values()):  # everything at Triton completes
        s.on_complete(r, 0.02, 0.02)
    later = GUARD_S + 0.1
    flood(s, 1, later)  # an arrival refreshes what is protected
    release_all(s, later)
    assert capped < at_triton(s, 2) == s.release_depth(MODEL, later)


def test_other_models_share_the_gpu_so_the_cap_tightens() -> None:
    """A second model busy on the GPU halves the speed the bound counts on (time sharing), so
    the lower level of the protected model keeps less at Triton; the other model's own lower
    level is not capped by a level of a model it does not run with in one batch."""
    alone = scheduler(MODEL, OTHER)
    assert alone.enqueue(make_request(priority=1, slo_ms=80.0), 0.0).accepted
    flood(alone, 100, 0.0)
    release_all(alone, 0.0)
    shared = scheduler(MODEL, OTHER)
    assert shared.enqueue(make_request(priority=1, slo_ms=80.0), 0.0).accepted
    flood(shared, 100, 0.0, model=OTHER)
    flood(shared, 100, 0.0)
    release_all(shared, 0.0)
    assert at_triton(shared, 2) < at_triton(alone, 2)
    assert at_triton(shared, 2, OTHER) == shared.release_depth(OTHER, 0.0)


def test_a_full_batch_of_lower_levels_at_triton_does_not_hold_a_higher_one() -> None:
    """The release depth counts a request's own level and those above: a priority-1 request
    goes to Triton's priority queue, ahead of the lower level's batch already there."""
    s = scheduler()
    flood(s, 100, 0.0)
    assert release_all(s, 0.0) == s.release_depth(MODEL, 0.0)
    assert s.enqueue(make_request(priority=1, slo_ms=200.0, arrival_s=0.001), 0.001).accepted
    sent = s.next_dispatch(0.001)
    assert sent is not None and sent.request.level == 1
    assert s.next_dispatch(0.001) is None  # the lower level stays at its depth


def one_instance_scheduler() -> Scheduler[None]:
    serving = ModelServing(32, 1, priority_levels=2, default_priority_level=2)
    return make_scheduler(
        make_policy("max", CLOCKS), make_model_table(batches=BATCHES), serving={MODEL: serving}
    )


def test_the_bound_counts_a_gap_between_instances_then_a_batch() -> None:
    """One instance: a whole batch to wait for, then its own (2·T); two: half a batch (1.5·T);
    a second model on the GPU stretches both."""
    assert bound_ms(10.0, 1, 1) == pytest.approx(20.0)
    assert bound_ms(10.0, 2, 1) == pytest.approx(15.0)
    assert bound_ms(10.0, 4, 2) == pytest.approx(25.0)


def flooded_beside_priority_one(s: Scheduler[None], slo_ms: float) -> tuple[ModelTable, int]:
    """A priority-1 request with ``slo_ms`` and 100 of the flood at time 0, released as the
    bound lets them; the model's table and the priority-1 batch the bound counts on."""
    assert s.enqueue(make_request(priority=1, slo_ms=slo_ms), 0.0).accepted
    flood(s, 100, 0.0)
    release_all(s, 0.0)
    table = s.table_for(MODEL)
    assert table is not None
    return table, at_triton(s, 1) + 1


def assert_largest(table: ModelTable, lower: int, own: int, instances: int, slo_ms: float) -> None:
    """``lower`` is the most that keeps the bound with ``instances`` within the SLO."""
    assert bound_ms(execution_ms(table, TOP, lower + own), instances, 1) <= SAFETY * slo_ms
    assert bound_ms(execution_ms(table, TOP, lower + 1 + own), instances, 1) > SAFETY * slo_ms


def test_with_one_instance_the_lower_level_gets_what_two_batches_allow_and_no_more() -> None:
    s = one_instance_scheduler()
    table, own = flooded_beside_priority_one(s, 60.0)
    lo = at_triton(s, 2)
    assert_largest(table, lo, own, 1, 60.0)
    release_all(s, 0.5)  # no chunks to wait for: nothing more goes later
    assert at_triton(s, 2) == lo


def spacing_s(table: ModelTable, requests: int, slo_ms: float) -> float:
    """How far apart two instances' batches of ``requests`` in all must start for a higher
    request to wait and run within the SLO: the gap left is ``T − d``, so ``d ≥ 2·T − budget``."""
    return max(0.0, 2 * execution_ms(table, TOP, requests) - SAFETY * slo_ms) / 1000


def test_with_two_instances_the_rest_goes_in_a_chunk_once_the_batches_are_far_enough_apart() -> (
    None
):
    """At once, what holds the bound even if it all runs as one batch (2·T); beyond it, up to
    what holds it with the instances' batches a gap apart (1.5·T), a chunk at a time, each far
    enough after the last that the instance coming free first leaves the higher request room:
    at the cap, half a batch apart; with fewer at Triton, batches are shorter and need less."""
    s = scheduler()
    table, own = flooded_beside_priority_one(s, 60.0)
    first = at_triton(s, 2)
    assert_largest(table, first, own, 1, 60.0)
    cap = s.bound.cap(s, MODEL, 1, 0.0)
    assert cap is not None and first < cap.lower
    assert_largest(table, cap.lower, own, 2, 60.0)
    assert cap.gap_s == pytest.approx(spacing_s(table, cap.lower + own, 60.0))
    assert cap.gap_s <= execution_ms(table, TOP, cap.lower + own) / 2 / 1000
    assert cap.chunk == -(-cap.lower // 2)
    gap_s = spacing_s(table, first + 1 + own, 60.0)
    assert 0 < gap_s < cap.gap_s
    release_all(s, 0.9 * gap_s)
    assert at_triton(s, 2) == first  # too close to the first chunk
    release_all(s, 1.01 * gap_s)
    assert first < at_triton(s, 2) <= min(cap.lower, first + cap.chunk)
    release_all(s, 1.0)
    assert at_triton(s, 2) == cap.lower  # never beyond the cap


def test_what_is_protected_is_every_class_seen_within_the_guard() -> None:
    """Arrivals that add or expire no class skip the bookkeeping; what is protected is still
    exactly the classes whose last arrival is within ``GUARD_S``."""
    rng = random.Random(5)
    bound = WaitBound()
    last: dict[tuple[str, int], float] = {}
    now_s = 0.0
    for _ in range(2000):
        now_s += rng.expovariate(4.0)
        model, level = rng.choice([MODEL, OTHER]), rng.choice([1, 2, 2, 3])
        if rng.random() < 0.02:
            now_s += GUARD_S * rng.uniform(0.5, 1.5)  # quiet spells: classes expire
        bound.arrived(model, level, 50.0, now_s)
        last[(model, level)] = now_s
        expected = {k for k, at in last.items() if now_s - at <= GUARD_S}
        assert {(m, lvl) for m, lvl, _ in bound.protected()} == expected
