"""Placement across the GPUs of a node: earliest expected finish counted by level and weight,
energy-aware packing, round-robin."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.core import Scheduler, SchedulerConfig
from scheduler.placement import PlacementMode, PlacementParams, Placer
from scheduler.queue import VruntimeLedger
from scheduler.registry import make_policy
from scheduler.request import Request
from scheduler.view import ModelServing
from tests.scheduler.helpers import CLOCKS, MODEL, make_model_table, make_request
from time2clock.table import ModelTable, TableSet

BATCHES = {1: 1.0, 4: 1.6, 8: 2.4}  # a batch's time over batch 1's


def batching_table() -> ModelTable:
    """Curves at batch 1, 4 and 8 whose energy per inference falls with the batch as its time
    per request does (100 W at every batch)."""
    table = make_model_table(batches=BATCHES)
    curves = {}
    for batch, curve in table.curves.items():
        points = tuple(
            replace(p, energy_per_inference_j=100.0 * p.trimmed_mean_ms / 1000.0 / batch)
            for p in curve.points
        )
        curves[batch] = replace(curve, points=points)
    return replace(table, curves=curves)


def node(gpus: int = 2, policy: str = "max") -> list[Scheduler[None]]:
    """``gpus`` schedulers sharing one ledger, as a node's are."""
    ledger = VruntimeLedger()
    tables = TableSet([batching_table()])
    return [
        Scheduler(
            tables,
            make_policy(policy, CLOCKS),
            SchedulerConfig(max_queue=1000),
            {MODEL: ModelServing(max_batch=8, instances=1)},
            ledger=ledger,
        )
        for _ in range(gpus)
    ]


def request(**kw: object) -> Request[None]:
    r = make_request(**kw)  # type: ignore[arg-type]
    r.level = r.priority or 2
    return r


def fill(sched: Scheduler[None], n: int, **kw: object) -> None:
    for _ in range(n):
        assert sched.enqueue(request(**kw), 0.0).accepted


def test_spread_goes_where_the_request_finishes_soonest() -> None:
    gpus = node(3)
    fill(gpus[0], 20)
    fill(gpus[1], 5)
    fill(gpus[2], 12)
    placer = Placer()
    estimates = [placer.estimate(g, i, request(), 0.0) for i, g in enumerate(gpus)]
    assert estimates[1].finish_ms < estimates[2].finish_ms < estimates[0].finish_ms
    assert placer.place(gpus, request(), 0.0) == 1


def test_higher_levels_wait_behind_only_higher_or_equal_work() -> None:
    gpus = node(2)
    fill(gpus[0], 40, priority=2)  # a long queue of the lowest level
    fill(gpus[1], 6, priority=1)  # a short queue of the highest
    placer = Placer()
    # A level-1 request overtakes GPU 0's whole queue; a level-2 one waits behind either.
    assert placer.place(gpus, request(priority=1), 0.0) == 0
    assert placer.place(gpus, request(priority=2), 0.0) == 1


def test_a_flow_goes_where_it_cuts_ahead_not_where_the_queue_is_short() -> None:
    gpus = node(2)
    fill(gpus[0], 40, client_id="light", nice=10)  # weight 110
    fill(gpus[1], 8, client_id="peer", nice=0)  # weight 1024
    placer = Placer()
    # A new flow of weight 1024 would wait for a ninth of a request of light's on GPU 0 (CFS
    # serves light 110/1024 as much), for one of peer's on GPU 1: GPU 0, though its queue is
    # five times longer.
    assert placer.place(gpus, request(client_id="other", nice=0), 0.0) == 0
    # light's own next request waits behind its 40 (first in, first out) on GPU 0.
    assert placer.place(gpus, request(client_id="light", nice=10), 0.0) == 1
    # A much heavier flow cuts ahead of both queues: about one request's time on either GPU.
    heavy = request(client_id="heavy", nice=-10)  # weight 9548
    on = [placer.estimate(g, i, heavy, 0.0).finish_ms for i, g in enumerate(gpus)]
    drain_gpu0 = placer.estimate(gpus[0], 0, request(client_id="light", nice=10), 0.0)
    assert on[0] == pytest.approx(on[1], rel=0.15) and max(on) < 0.2 * drain_gpu0.finish_ms


def test_a_flow_served_elsewhere_waits_its_turn() -> None:
    """The node-wide virtual runtime: a flow far ahead (served a lot, here on GPU 0) would wait
    on GPU 1 for all of b's queue, whose virtual runtime is far behind; a new flow would not."""
    gpus = node(2)
    fill(gpus[0], 10, client_id="a")
    while (d := gpus[0].next_dispatch(0.0)) is not None:
        gpus[0].on_complete(d.request, 0.02, 0.0)
    fill(gpus[0], 6, client_id="d")  # wakes at GPU 0's min virtual runtime, near a's
    fill(gpus[1], 3, client_id="b")  # GPU 1 has served nobody
    placer = Placer()
    served = [placer.estimate(g, i, request(client_id="a"), 0.0) for i, g in enumerate(gpus)]
    fresh = [placer.estimate(g, i, request(client_id="c"), 0.0) for i, g in enumerate(gpus)]
    assert served[0].finish_ms < served[1].finish_ms  # all 3 of b before it on GPU 1
    assert fresh[1].finish_ms <= fresh[0].finish_ms
    assert placer.place(gpus, request(client_id="a"), 0.0) == 0
    assert placer.place(gpus, request(client_id="c"), 0.0) == 1


def test_an_idle_node_spreads_and_round_robin_takes_turns() -> None:
    gpus = node(4)
    placer = Placer()
    assert [placer.place(gpus, request(), 0.0) for _ in range(4)] == [0, 1, 2, 3]
    rr = Placer(PlacementParams(PlacementMode.ROUND_ROBIN))
    fill(gpus[0], 50)  # round-robin ignores what each GPU holds
    assert [rr.place(gpus, request(), 0.0) for _ in range(5)] == [0, 1, 2, 3, 0]
    down = [True, False, True, True]
    assert [rr.place(gpus, request(), 0.0, available=down) for _ in range(3)] == [2, 3, 0]
    assert placer.place(gpus, request(), 0.0, available=[False, False, True, False]) == 2
    with pytest.raises(ValueError, match="no GPU is available"):
        placer.place(gpus, request(), 0.0, available=[False] * 4)
    assert rr.placed == [3, 1, 2, 2] and placer.placed[2] >= 1


def test_energy_packs_onto_a_busy_gpu_while_the_deadline_allows() -> None:
    gpus = node(3)
    fill(gpus[1], 3)
    energy = Placer(PlacementParams(PlacementMode.ENERGY), idle_w=[40.0] * 3)
    loose = request(slo_ms=500.0)
    assert energy.place(gpus, loose, 0.0) == 1  # shares a batch: less energy per inference
    # Where the busy GPU cannot finish it within half the time left, it spreads instead.
    est = energy.estimate(gpus[1], 1, loose, 0.0)
    tight = request(slo_ms=2.0 * est.finish_ms * 0.9)
    assert energy.place(gpus, tight, 0.0) in (0, 2)
    assert Placer().place(gpus, loose, 0.0) != 1  # spread would not have packed


def test_energy_on_an_idle_node_uses_the_first_gpu_and_spread_does_not() -> None:
    gpus = node(4)
    energy = Placer(PlacementParams(PlacementMode.ENERGY), idle_w=[40.0] * 4)
    spread = Placer()
    assert {energy.place(gpus, request(slo_ms=500.0), 0.0) for _ in range(4)} == {0}
    assert {spread.place(gpus, request(slo_ms=500.0), 0.0) for _ in range(4)} == {0, 1, 2, 3}


def test_params_are_checked() -> None:
    with pytest.raises(ValueError, match="placement must be one of spread, energy, round-robin"):
        PlacementParams("random")
    with pytest.raises(ValueError, match="pack_slo_share"):
        PlacementParams(pack_slo_share=0.0)
