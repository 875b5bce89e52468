"""The adaptive policy on the scheduler core, with injected time."""

from __future__ import annotations

import math

import numpy as np

from scheduler.adaptive import MAX_CLASSES, AdaptivePolicy, EnergyModel
from scheduler.feedback import FeedbackParams
from scheduler.policies import ModelPlan, SlackPolicy
from scheduler.view import ModelServing
from tests.scheduler.helpers import (
    CLOCKS,
    MODEL,
    make_model_table,
    make_request,
    make_scheduler,
    make_table,
)
from time2clock.table import ClockPoint, ModelTable, TableSet, Time2ClockTable

FAST = FeedbackParams(min_samples=5)


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


def test_completions_well_under_the_slo_slow_the_class_down() -> None:
    policy = AdaptivePolicy(CLOCKS, feedback=FAST)
    serve(policy, 20.0)
    (state,) = policy.state()
    assert state["model"] == MODEL and state["slo_ms"] == 100.0
    assert state["attainment"] == 1.0 and state["near_misses"] == 0
    assert float(state["scale"]) < 1.0  # type: ignore[arg-type]
    base = state["base_mhz"]
    assert isinstance(base, int) and base < CLOCKS[-1]


def test_near_misses_speed_the_class_up_at_once() -> None:
    policy = AdaptivePolicy(CLOCKS, feedback=FAST)
    s = make_scheduler(policy, make_model_table(), serving={MODEL: ModelServing(1, 1)})
    serve(policy, 5.0)
    slow = policy.controller(MODEL, 100.0).level
    now = 10.0
    s.enqueue(make_request(arrival_s=now, slo_ms=100.0), now)
    d = s.next_dispatch(now)
    assert d is not None
    base = policy.base_mhz(s, MODEL)
    assert base is not None
    s.on_complete(d.request, 0.099, now + 0.099)  # at 99% of its SLO: a near miss
    assert policy.controller(MODEL, 100.0).level > slow
    after = policy.base_mhz(s, MODEL)
    assert after is not None and after >= base


def test_a_queue_is_planned_on_mean_times_lower_than_slacks_margins() -> None:
    """The controller measures the tail, so the plan under it plans the mean: a queue gets a
    lower clock than under ``slack``'s p99 margins and phantom arrivals."""
    fine = list(range(300, 2101, 50))
    adaptive, slack = AdaptivePolicy(fine, feedback=FAST), SlackPolicy(fine)
    serve(adaptive, 20.0)
    targets = []
    for policy in (adaptive, slack):
        s = make_scheduler(policy, make_model_table(), serving={MODEL: ModelServing(1, 1)})
        for _ in range(6):
            s.enqueue(make_request(arrival_s=0.0, slo_ms=100.0), 0.0)
        targets.append(s.clock_target_mhz)
    assert targets[0] is not None and targets[1] is not None
    assert targets[0] < targets[1]


def test_idle_the_clock_drops_at_once_and_comes_back_with_the_next_request() -> None:
    policy = AdaptivePolicy(CLOCKS, feedback=FAST)
    s = make_scheduler(policy, make_model_table(), serving={MODEL: ModelServing(1, 1)})
    now = 0.0
    for _ in range(400):  # room to spare: the class slows down
        s.enqueue(make_request(arrival_s=now), now)
        d = s.next_dispatch(now)
        assert d is not None
        s.on_complete(d.request, 0.005, now + 0.005)
        now += 0.01
    s.enqueue(make_request(arrival_s=now), now)
    busy = s.clock_target_mhz
    d = s.next_dispatch(now)
    assert d is not None and busy is not None
    done = s.on_complete(d.request, 0.005, now + 0.005)  # the last one: the GPU goes idle
    assert done.clock_mhz is not None and done.clock_mhz < busy  # no hysteresis: at once
    assert policy.idle_clock_mhz(s) == done.clock_mhz
    back = s.enqueue(make_request(arrival_s=now + 0.05), now + 0.05)
    assert back.clock_mhz is not None and back.clock_mhz >= busy


def test_a_class_at_the_top_clock_does_not_idle_low() -> None:
    """No room in the tail (every completion a near miss): the class asks for the top clock
    and a wake-up may cost nothing, so the GPU idles where it works."""
    policy = AdaptivePolicy(CLOCKS, feedback=FAST)
    s = make_scheduler(policy, make_model_table(), serving={MODEL: ModelServing(1, 1)})
    now = 0.0
    for _ in range(50):
        s.enqueue(make_request(arrival_s=now, slo_ms=10.0), now)
        d = s.next_dispatch(now)
        assert d is not None
        s.on_complete(d.request, 0.0099, now + 0.0099)
        now += 0.02
    assert policy.model_scale(MODEL) == 1.0
    assert policy.idle_clock_mhz(s) == policy.base_mhz(s, MODEL) == CLOCKS[-1]


def _batched_table(idle_w: float) -> ModelTable:
    """Batches of 1, 2 and 4, each twice as efficient per request as the one before, with
    power ``idle_w + 40·(f/f_max)³`` W at batch 1: an energy floor to find."""
    curves = {}
    for b, ratio in ((1, 1.0), (2, 1.2), (4, 1.5)):
        base = make_table(batch=b, slower=ratio, concurrency=1)
        points = tuple(
            ClockPoint(
                p.clock_mhz,
                p.n,
                p.trimmed_mean_ms,
                0,
                0,
                0,
                0,
                0,
                0,
                energy_per_inference_j=(idle_w + 40.0 * (p.clock_mhz / CLOCKS[-1]) ** 3)
                * (1.0 + 1.0 / b)
                * p.trimmed_mean_ms
                / 1000.0
                / b,
            )
            for p in base.points
        )
        curves[b] = Time2ClockTable(
            base.gpu,
            base.model,
            base.trim,
            1,
            base.mean_fit,
            points,
            tail_fits=base.tail_fits,
            residual_quantiles_ms=base.residual_quantiles_ms,
            batch=b,
        )
    return ModelTable(gpu="gpu", model=MODEL, curves=curves)


def test_the_energy_floor_counts_the_batches_the_load_forms() -> None:
    table = _batched_table(idle_w=30.0)
    plan = ModelPlan(table, 4, CLOCKS, "mean")
    energy = EnergyModel(table, plan, CLOCKS)
    assert energy.known
    # No load: one request per execution; a heavy load: bigger batches at every clock, and
    # the bigger at the slower clocks (an execution lasts longer).
    assert np.all(energy.batch_at(0.0) == 1.0)
    heavy = energy.batch_at(300.0)
    assert np.all(heavy > 1.0) and heavy[0] >= heavy[-1]
    # Counting energy above the idle power, a slower clock costs less than counting it all
    # (it shortens the idle time it replaces).
    assert energy.floor_index(0.0, 30.0) <= energy.floor_index(0.0, 0.0)
    # Within a tolerance the floor is the lowest clock that close to the least energy.
    assert energy.floor_index(0.0, 30.0, tolerance=0.5) <= energy.floor_index(0.0, 30.0)


def test_the_class_never_sinks_below_the_energy_floor() -> None:
    policy = AdaptivePolicy(CLOCKS, feedback=FAST)
    s = make_scheduler(policy, make_model_table(), serving={MODEL: ModelServing(1, 1)})
    serve(policy, 60.0, slo_ms=1000.0)  # a very loose SLO: all the room in the world
    floor = policy.energy_floor_mhz(s, MODEL)
    assert floor is not None
    assert policy.base_mhz(s, MODEL) == floor  # at the floor, not below it
    levels = policy._levels(s, MODEL)
    assert levels is not None
    assert math.isclose(policy.controller(MODEL, 1000.0).level, levels[CLOCKS.index(floor)])


def test_a_markedly_faster_table_restarts_the_judgement() -> None:
    policy = AdaptivePolicy(CLOCKS, feedback=FAST)
    s = make_scheduler(policy, make_model_table(), serving={MODEL: ModelServing(1, 1)})
    serve(policy, 20.0)
    policy.attach(s)
    s.enqueue(make_request(), 0.0)  # plans with the table in force
    level = policy.controller(MODEL, 100.0).level
    s.set_tables(TableSet([make_model_table()]))  # the same table again: nothing to redo
    s.enqueue(make_request(), 0.0)
    assert policy.state()[0]["rebases"] == 0
    s.set_tables(TableSet([make_model_table(slower=0.5)]))  # twice as fast: judged afresh
    s.enqueue(make_request(), 0.0)
    assert policy.state()[0]["rebases"] == 1
    assert policy.controller(MODEL, 100.0).level == level


def test_classes_are_bounded() -> None:
    policy = AdaptivePolicy(CLOCKS)
    for i in range(MAX_CLASSES + 36):
        policy.controller(MODEL, 50.0 + i)
    assert len(policy.controllers) == MAX_CLASSES
    assert (MODEL, 50.0) not in policy.controllers  # the oldest went first
