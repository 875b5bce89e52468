"""The adaptive policy on the scheduler core, with injected time."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from scheduler.adaptive import MAX_CLASSES, AdaptivePolicy, EnergyModel, woken_ms
from scheduler.core import Scheduler
from scheduler.feedback import FeedbackParams
from scheduler.policies import ModelPlan, SlackParams, SlackPolicy
from scheduler.view import ModelServing
from tests.scheduler.helpers import (
    CLOCKS,
    MODEL,
    make_model_table,
    make_request,
    make_scheduler,
    make_table,
)
from time2clock.online import OnlineTables
from time2clock.online_energy import Busy, EnergyParams, EnergyWindow
from time2clock.table import ClockPoint, ModelTable, TableSet, Time2ClockTable

FAST = FeedbackParams(min_samples=5)


def serve(
    policy: AdaptivePolicy, until_s: float, slo_ms: float = 100.0
) -> tuple[Scheduler[None], float]:
    """Requests one at a time, every 10 ms, each done 5 ms after it is sent, on a scheduler of
    their own; that scheduler (its arrival rate measured) and the time reached."""
    s = make_scheduler(policy, make_model_table(), serving={MODEL: ModelServing(1, 1)})
    now = 0.0
    while now < until_s:
        s.enqueue(make_request(arrival_s=now, slo_ms=slo_ms), now)
        d = s.next_dispatch(now)
        assert d is not None
        s.on_complete(d.request, 0.005, now + 0.005)
        now += 0.01
    return s, now


def near_misses(
    policy: AdaptivePolicy, slo_ms: float, table: ModelTable | None = None
) -> tuple[Scheduler[None], float]:
    """50 requests one at a time, every 20 ms, each done at 99% of its SLO (a near miss: the
    class asks for the top clock), on a scheduler of their own (``table``, else
    ``make_model_table()``); it and the last completion."""
    s = make_scheduler(policy, table or make_model_table(), serving={MODEL: ModelServing(1, 1)})
    now, took_s = 0.0, 0.99 * slo_ms / 1000.0
    for _ in range(50):
        s.enqueue(make_request(arrival_s=now, slo_ms=slo_ms), now)
        d = s.next_dispatch(now)
        assert d is not None
        s.on_complete(d.request, took_s, now + took_s)
        now += 0.02
    return s, now - 0.02 + took_s


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


@pytest.mark.parametrize(
    ("slo_ms", "start_queue", "start_mhz"),
    [
        (30.0, 2, 600),  # room for a queue: where one request alone meets the setpoint
        (12.0, 2, 2100),  # one alone fits from 1,500 MHz, two back to back nowhere: the top
        (12.0, 1, 1500),  # not asked to leave room for a queue
    ],
)
def test_a_class_starts_at_the_top_where_its_slo_leaves_no_room_for_a_queue(
    slo_ms: float, start_queue: int, start_mhz: int
) -> None:
    """A new class starts at the lowest clock where one request alone meets the setpoint with
    the table's p99 margin (1 ms here: 7.4 ms at 2,100 MHz, 10.2 at 1,500, 22.5 at 600), unless
    no clock runs ``start_queue`` requests back to back within it: then at the top, so that its
    first requests to queue do not pass the SLO before the controller has judged anything."""
    policy = AdaptivePolicy(CLOCKS, feedback=replace(FAST, start_queue=start_queue))
    s = make_scheduler(policy, make_model_table(), serving={MODEL: ModelServing(1, 1)})
    s.enqueue(make_request(arrival_s=0.0, slo_ms=slo_ms), 0.0)
    d = s.next_dispatch(0.0)
    assert d is not None
    s.on_complete(d.request, 0.005, 0.005)  # the class's first completion: it starts
    assert policy.base_mhz(s, MODEL) == start_mhz


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


def test_the_plan_counts_the_next_arrival() -> None:
    """At 100 requests a second the next one may arrive while this one runs (the plan puts it
    early, at the 5% quantile of its gap): with it counted, a request arriving to an idle GPU is
    raised over the base where the two would not both meet a 30 ms SLO at the base clock; with
    no arrival counted it runs at the base."""
    targets = []
    for phantoms in (0, 1):
        policy = AdaptivePolicy(CLOCKS, feedback=replace(FAST, phantoms=phantoms))
        s, now = serve(policy, 20.0, slo_ms=30.0)  # done in 5 ms: the class slows to its floor
        base = policy.base_mhz(s, MODEL)
        raised = s.enqueue(make_request(arrival_s=now, slo_ms=30.0), now).clock_mhz
        assert base is not None and raised is not None
        targets.append((base, raised))
    (base_0, alone), (base_1, counted) = targets
    assert base_0 == base_1 and alone == base_0
    assert counted > alone


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
    s, _ = near_misses(policy, 10.0)
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
    plan = ModelPlan.of(table, 4, CLOCKS, "mean")
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


def test_the_floor_counts_the_drop_a_busy_period_ends_with() -> None:
    """A busy period ends at the floor's clock until the drop to the idle clock lands: where a
    clock change is slow, that idle time at a fast clock costs more than the faster execution
    saves, and the floor comes down. It weighs less as the load grows: a batch ends a busy
    period only where nothing arrives while it runs."""
    table = _batched_table(idle_w=30.0)
    plan = ModelPlan.of(table, 4, CLOCKS, "mean")
    energy = EnergyModel(table, plan, CLOCKS)
    x3 = (np.asarray(CLOCKS, dtype=float) / CLOCKS[-1]) ** 3
    drop_j = 40.0 * x3 * 0.05  # idle 40 W more at the top clock, for a 50 ms change
    plain = energy.floor_index(0.0, 30.0)
    assert energy.floor_index(0.0, 30.0, drop_j=np.zeros(len(CLOCKS))) == plain
    assert energy.floor_index(0.0, 30.0, drop_j=drop_j) < plain
    # A load that keeps the GPU busy: a batch almost never ends a busy period.
    assert energy.floor_index(1e4, 30.0, drop_j=drop_j) == energy.floor_index(1e4, 30.0)


def test_the_drop_is_counted_where_the_idle_power_at_the_top_is_known() -> None:
    slow = SlackParams(change_delay_ms=50.0)
    unknown = AdaptivePolicy(CLOCKS, slow, FeedbackParams(idle_power_w=30.0))
    assert unknown._drop_j() is None
    known = FeedbackParams(idle_power_w=30.0, idle_power_top_w=70.0)
    policy = AdaptivePolicy(CLOCKS, slow, known)
    drop_j = policy._drop_j()
    assert drop_j is not None
    lowest = (CLOCKS[0] / CLOCKS[-1]) ** 3  # the idle power's cubic law, at the lowest clock
    assert drop_j[0] == 0.0 and drop_j[-1] == pytest.approx(40.0 * (1.0 - lowest) * 0.05)
    assert np.all(np.diff(drop_j) >= 0.0)
    assert AdaptivePolicy(CLOCKS, slow, replace(known, count_drop=False))._drop_j() is None
    # On a table whose execution is cheapest fast, the slow change brings the floor down.
    floors: dict[bool, int] = {}
    for count in (False, True):
        p = AdaptivePolicy(CLOCKS, slow, replace(known, count_drop=count))
        s = make_scheduler(p, _batched_table(idle_w=30.0), serving={MODEL: ModelServing(1, 1)})
        floor = p.energy_floor_mhz(s, MODEL)
        assert floor is not None
        floors[count] = floor
    assert floors[True] < floors[False]


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


def test_the_room_caps_the_batch_a_hold_can_form() -> None:
    """Given the time a held batch has in all (``room_s``), the hold and the run fill it: the
    batch is what arrives in the room, less than a fixed hold promises where the hold and a
    slow run together would not fit."""
    table = _batched_table(idle_w=30.0)
    plan = ModelPlan.of(table, 4, CLOCKS, "mean")
    energy = EnergyModel(table, plan, CLOCKS)
    rate, hold_s, room_s = 20.0, 0.05, 0.04
    free = energy.batch_at(rate, hold_s)
    capped = energy.batch_at(rate, hold_s, room_s)
    assert np.all(capped <= free + 1e-9) and np.any(capped < free - 0.1)
    assert capped[-1] == pytest.approx(1.0 + rate * room_s)  # the top clock: hold + run = room
    # The floor is then found over those batches.
    assert 0 <= energy.floor_index(rate, 30.0, 0.0, hold_s, room_s) < len(CLOCKS)


HOLDING = FeedbackParams(min_samples=5, batch_hold=0.8, hold_while_busy=True)


def _batched_scheduler(
    policy: AdaptivePolicy,
    *extra: ModelTable,
    serving: dict[str, ModelServing] | None = None,
    **cfg: object,
) -> Scheduler[None]:
    return make_scheduler(
        policy,
        make_model_table(batches={1: 1.0, 2: 1.2, 4: 1.5}),
        *extra,
        serving=serving or {MODEL: ModelServing(4, 1)},
        **cfg,
    )


def _warm(s: Scheduler[None], until_s: float) -> float:
    """Full batches of 4 every 40 ms (100 requests a second, a rate the policy measures), each
    sent at once (a full batch is never held) and done 20 ms later; the time reached."""
    now = 0.0
    while now < until_s:
        for _ in range(4):
            s.enqueue(make_request(arrival_s=now, slo_ms=100.0), now)
        sent = [d for _ in range(4) if (d := s.next_dispatch(now)) is not None]
        assert len(sent) == 4
        for d in sent:
            s.on_complete(d.request, 0.02, now + 0.02)
        now += 0.04
    return now


def test_a_hold_ends_in_time_for_the_setpoint_at_the_energy_floor() -> None:
    """A lone request with more expected is held, re-decided at each wake-up (fewer arrivals
    to wait for leave more room), and released in time to run at the energy floor, with the
    table's p99 margin, within the controller's setpoint of its SLO."""
    policy = AdaptivePolicy(CLOCKS, feedback=HOLDING)
    s = _batched_scheduler(policy)
    now = _warm(s, 2.0)
    arrival = now
    s.enqueue(make_request(arrival_s=arrival, slo_ms=100.0), now)
    assert s.next_dispatch(now) is None  # one request, more to come: held
    released = None
    for _ in range(100):
        wake = policy.wake_at_s()
        assert wake is not None and wake > now
        now = wake
        s.poll(now)
        if s.next_dispatch(now) is not None:
            released = now
            break
    assert released is not None and released > arrival
    floor = policy.energy_floor_mhz(s, MODEL)
    plan = policy._plan(s, MODEL)
    assert floor is not None and plan is not None
    run_ms = float(plan.times_ms[1, CLOCKS.index(floor)]) + plan.margin_ms
    assert released + run_ms / 1000.0 <= arrival + 0.95 * 0.100 + 1e-9


def test_while_the_model_runs_what_arrives_waits_for_the_next_batch() -> None:
    """With ``hold_while_busy`` a request arriving while its model's batch runs is held for a
    fuller next batch; without, it goes to Triton at once (and runs nearly alone)."""
    for busy, expect_held in ((True, True), (False, False)):
        policy = AdaptivePolicy(CLOCKS, feedback=replace(HOLDING, hold_while_busy=busy))
        s = _batched_scheduler(policy, serving={MODEL: ModelServing(4, 2)}, triton_batches=2)
        now = _warm(s, 2.0)
        for _ in range(4):  # a full batch: goes at once
            s.enqueue(make_request(arrival_s=now, slo_ms=100.0), now)
        sent = [d for _ in range(4) if (d := s.next_dispatch(now)) is not None]
        assert len(sent) == 4
        s.enqueue(make_request(arrival_s=now + 0.001, slo_ms=100.0), now + 0.001)
        held = s.next_dispatch(now + 0.001) is None
        assert held == expect_held


def test_other_models_work_shortens_a_hold() -> None:
    """A model's held batch time-shares the GPU with the other models' work: the hold ends
    earlier while a long execution of another model is at Triton."""
    other = make_model_table(model="other", slower=8.0)
    ends = []
    for busy_other in (False, True):
        policy = AdaptivePolicy(CLOCKS, feedback=HOLDING)
        s = _batched_scheduler(
            policy, other, serving={MODEL: ModelServing(4, 1), "other": ModelServing(1, 1)}
        )
        now = _warm(s, 2.0)
        if busy_other:
            s.enqueue(make_request(model="other", arrival_s=now, slo_ms=1000.0), now)
            assert s.next_dispatch(now) is not None
        s.enqueue(make_request(arrival_s=now, slo_ms=100.0), now)
        assert s.next_dispatch(now) is None
        ends.append(policy._holds[MODEL])
    assert ends[1] < ends[0]


def test_the_gpu_rests_while_every_model_waiting_is_held() -> None:
    """Nothing at Triton and the one model waiting held back: the clock drops to the idle
    clock, and rises one clock change before the hold ends, so the batch starts at speed."""
    policy = AdaptivePolicy(CLOCKS, feedback=replace(HOLDING, rest_while_holding=True))
    s = _batched_scheduler(policy)
    now = _warm(s, 2.0)
    s.enqueue(make_request(arrival_s=now, slo_ms=100.0), now)
    assert s.next_dispatch(now) is None
    idle = policy.idle_clock_mhz(s)
    assert s.clock_target_mhz == idle < (policy.energy_floor_mhz(s, MODEL) or 0)
    lead_s = policy.params.change_delay_ms / 1000.0
    raised = None
    for _ in range(100):
        wake = policy.wake_at_s()
        assert wake is not None and wake > now
        now = wake
        raised = s.poll(now)
        if raised is not None:
            break
        assert s.next_dispatch(now) is None  # still held, still resting
    assert raised is not None and raised > idle
    assert s.next_dispatch(now) is None  # the raise comes first ...
    until = policy._holds[MODEL]
    assert math.isclose(until - now, lead_s)  # ... a clock change before the hold ends
    assert s.next_dispatch(until) is not None


def test_a_quiet_class_no_longer_keeps_the_idle_clock_up() -> None:
    """A class pushed to the top clock by a burst keeps the idle clock there (a wake-up would
    cost its tail), until it has been quiet for ``quiet_s``: then the GPU idles low."""
    policy = AdaptivePolicy(CLOCKS, feedback=FAST)
    s, last = near_misses(policy, 10.0)
    assert s.clock_target_mhz == CLOCKS[-1]  # idle, and held at the top
    wake = policy.wake_at_s()
    assert wake is not None and math.isclose(wake, last + policy.feedback.quiet_s)
    low = s.poll(wake)
    assert low is not None and low < CLOCKS[-1]
    assert s.clock_target_mhz == policy.idle_clock_mhz(s) == low


def test_wake_ups_more_than_the_target_allows_keep_their_base_room() -> None:
    """A class at the top clock whose every request comes after a pause of more than
    ``quiet_s``: at first the GPU idles low once the class is quiet (a wake-up after a pause is
    rare, its base says nothing of it). Once such wake-ups are more than the share of misses the
    target allows (1%), they reach the tail the class measures: the class keeps the room its base
    leaves, none at the top, and the GPU idles there (``rare_wakes``; off, it idles low still)."""
    slo_ms = 10.0
    idle: dict[bool, list[int]] = {}
    for rare in (True, False):
        policy = AdaptivePolicy(CLOCKS, feedback=replace(FAST, rare_wakes=rare))
        s, _ = near_misses(policy, slo_ms)
        seen = idle[rare] = []
        for _ in range(20):
            wake = policy.wake_at_s()
            assert wake is not None
            s.poll(wake)  # quiet
            assert s.clock_target_mhz is not None
            seen.append(s.clock_target_mhz)
            now = wake + 0.05
            s.enqueue(make_request(arrival_s=now, slo_ms=slo_ms), now)
            d = s.next_dispatch(now)
            assert d is not None
            s.on_complete(d.request, 0.0099, now + 0.0099)  # a near miss: the class stays up
        assert (policy._woken.get(MODEL, 0.0) > 0.01) is rare
    assert idle[True][0] == idle[False][0] < CLOCKS[-1]  # the first pauses: low
    assert idle[True][-1] == CLOCKS[-1]  # too many to leave out of the tail: the base's room
    assert idle[False][-1] < CLOCKS[-1]


def test_an_energy_probe_lowers_the_idle_clock_with_the_busy_floor() -> None:
    """A class at the top clock keeps the GPU idling at its busy floor. While the energy fit
    probes a clock under that floor, the GPU idles at the probe, and what comes to it runs
    there: lowering while busy waits ``hold_s``, and a load that leaves the GPU idle between
    requests would otherwise run none of its executions at the probe (nothing measured there,
    a wrong energy curve never healed). The probe holds the class's base down too, so the plan
    keeps the tail with the table's p99 margin meanwhile."""
    tailed = ModelTable("gpu", MODEL, {1: make_table(margin_ms=5.0, concurrency=1)})
    for probe in (True, False):
        policy = AdaptivePolicy(CLOCKS, feedback=FAST)
        s, last = near_misses(policy, 10.0, tailed)
        assert s.clock_target_mhz == CLOCKS[-1]  # idle, and held at the top
        learner = OnlineTables(CLOCKS, energy_params=EnergyParams(probe=probe))
        assert learner.energy is not None
        busy: Busy = (((MODEL, 1), 0.5),)
        learner.energy.add(EnergyWindow.at_clock(0.0, 1.0, CLOCKS[-1], 150.0, 0.5, busy))
        s.learner = learner
        now = last + 0.01  # the class is not quiet yet: only the probe lowers the idle clock
        lowered = s.poll(now)
        if not probe:
            assert lowered is None and s.clock_target_mhz == CLOCKS[-1]
            continue
        assert learner.energy.probes == 1
        assert lowered == s.clock_target_mhz == CLOCKS[-2]  # the probe ladder's next clock
        s.enqueue(make_request(arrival_s=now, slo_ms=100.0), now)
        assert s.clock_target_mhz == CLOCKS[-2]  # runs at the probe: nothing needs more
        first = s.next_dispatch(now)
        assert first is not None
        now += 0.009
        s.on_complete(first.request, 0.009, now)
        assert s.clock_target_mhz == CLOCKS[-2]  # idle again, at the probe
        # The probe holds the class's base down with it, so the plan counts the table's p99
        # margin (5 ms): a request of 20 ms whose mean time fits at the probe, with the load
        # about to arrive counted (it would run there on the mean alone), is raised.
        plan = policy._plan(s, MODEL)
        assert plan is not None and plan.margin_ms == 5.0
        s.enqueue(make_request(arrival_s=now, slo_ms=20.0), now)
        assert s.clock_target_mhz == CLOCKS[-1]
        assert learner.energy.probes == 1  # all of it within the one probe


def test_a_wake_up_leaves_a_request_alone_its_slo_where_clock_changes_are_slow() -> None:
    """A clock change (20 ms) slower than a request: a request woken from the idle clock runs
    there to its end. The GPU idles at the lowest clock from which a request alone still meets
    the setpoint with the tail margin: while its class has room in its base (which would let a
    wake-up lose more than that to a change that lands mid-request), and once the class is
    quiet (its base then says nothing of the next request and leaves it the whole SLO)."""
    slo_ms, delay_ms = 20.0, 20.0
    policy = AdaptivePolicy(CLOCKS, SlackParams(change_delay_ms=delay_ms), feedback=FAST)
    s, _ = serve(policy, 5.0, slo_ms=slo_ms)
    model_scale = policy.model_scale(MODEL)
    assert model_scale is not None and model_scale < 0.5  # room: the base is low
    plan = policy._plan(s, MODEL)
    assert plan is not None
    times_ms = plan.times_ms[1]
    most_ms = policy.feedback.setpoint * slo_ms - plan.margin_ms
    wake = policy.wake_at_s()
    assert wake is not None
    for moment in ("idle", "quiet"):
        if moment == "quiet":
            s.poll(wake)
            assert policy._recent_scale(MODEL) == 0.0  # quiet: no base to go by
        idle = s.clock_target_mhz
        assert idle is not None and idle == policy.idle_clock_mhz(s)
        i = CLOCKS.index(idle)
        assert woken_ms(times_ms, i, delay_ms) <= most_ms
        assert i > 0 and woken_ms(times_ms, i - 1, delay_ms) > most_ms, moment
    # A change slower than the request: all of it at the idle clock. A 2 ms one: the share
    # of the work 2 ms at the idle clock do, and the rest at the top.
    assert woken_ms(times_ms, i, delay_ms) == times_ms[i]
    rest = 1.0 - 2.0 / times_ms[i]
    assert woken_ms(times_ms, i, 2.0) == pytest.approx(2.0 + rest * times_ms[-1])


def test_a_request_lost_even_at_the_top_clock_does_not_hold_the_idle_clock_up() -> None:
    """A quiet class whose request alone misses the setpoint with the tail margin even at the
    top clock (8 ms: the table gives 7.4 ms and a 1 ms margin) still keeps its mean within it
    (the GPU idles at the top, where a wake-up adds least); one that misses it on its mean (7 ms)
    is lost whatever the idle clock, so the GPU idles as deep as the room allows."""
    idle = {}
    for slo_ms in (8.0, 7.0):
        policy = AdaptivePolicy(CLOCKS, feedback=FAST)
        s, _ = near_misses(policy, slo_ms)
        plan = policy._plan(s, MODEL)
        assert plan is not None
        assert plan.times_ms[1][-1] + plan.margin_ms > policy.feedback.setpoint * slo_ms
        assert s.clock_target_mhz == CLOCKS[-1]  # idle, and held at the top while recent
        wake = policy.wake_at_s()
        assert wake is not None
        s.poll(wake)
        assert policy._recent_scale(MODEL) == 0.0  # quiet
        idle[slo_ms] = s.clock_target_mhz
    assert idle == {8.0: CLOCKS[-1], 7.0: CLOCKS[0]}


def test_a_model_with_no_table_keeps_the_idle_clock_at_the_top_until_it_is_quiet() -> None:
    """A model with no table runs at the top clock, and what a wake-up from a lower clock
    would cost it is unknown: between its requests the GPU idles at the top (so each of its
    executions runs at one clock, and its table can be learned from them), and drops only
    once it has been quiet for ``quiet_s``."""
    policy = AdaptivePolicy(CLOCKS, feedback=FAST)
    other = "untabled"
    s = make_scheduler(
        policy,
        make_model_table(),
        serving={MODEL: ModelServing(1, 1), other: ModelServing(1, 1)},
    )
    now = 0.0
    for _ in range(20):
        s.enqueue(make_request(arrival_s=now, model=other), now)
        assert s.clock_target_mhz == CLOCKS[-1]
        d = s.next_dispatch(now)
        assert d is not None
        s.on_complete(d.request, 0.005, now + 0.005)
        assert s.clock_target_mhz == CLOCKS[-1]  # idle between its requests, at the top
        now += 0.01
    wake = policy.wake_at_s()
    assert wake is not None and math.isclose(wake, now - 0.01 + 0.005 + policy.feedback.quiet_s)
    low = s.poll(wake)
    assert low is not None and low < CLOCKS[-1]
    assert s.clock_target_mhz == policy.idle_clock_mhz(s) == low


def test_a_hold_resting_at_its_batchs_clock_keeps_no_time_for_a_clock_change() -> None:
    """Where the GPU rests while holding at a clock at least as fast as the held batch is
    planned at (here, no deeper idle clock allowed: ``idle_depth`` 0), the batch waits for no
    raise: its hold ends a clock change later than where the GPU rests below it, and the
    energy floor counts the same longer room for the batches holds form."""
    until, room = [], []
    for depth in (1.0, 0.0):
        policy = AdaptivePolicy(CLOCKS, feedback=replace(HOLDING, idle_depth=depth))
        s = _batched_scheduler(policy)
        now = _warm(s, 2.0)
        floor = policy.energy_floor_mhz(s, MODEL)
        assert floor is not None and policy._rest_mhz is not None
        assert (policy._rest_mhz >= floor) == (depth == 0.0)
        s.enqueue(make_request(arrival_s=now, slo_ms=100.0), now)
        assert s.next_dispatch(now) is None  # held
        until.append(policy._holds[MODEL])
        plan = policy._plan(s, MODEL)
        assert plan is not None
        room_s = policy._hold_room_s(s, MODEL, plan)[1]
        assert room_s is not None
        room.append(room_s)
    lead_s = policy.params.change_delay_ms / 1000.0
    assert until[1] - until[0] == pytest.approx(lead_s)
    assert room[1] - room[0] == pytest.approx(lead_s)
