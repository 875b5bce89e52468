"""Isolated executions found in the scheduler's events (injected time)."""

from __future__ import annotations

import pytest

from scheduler.core import Scheduler, SchedulerConfig
from scheduler.observe import ExecutionObserver
from scheduler.policies import FixedPolicy
from scheduler.request import Request
from scheduler.view import ModelServing
from tests.scheduler.helpers import CLOCKS, MODEL, make_model_table
from time2clock.online import ExecutionSample, OnlineParams, OnlineTables, TableRefit
from time2clock.table import TableSet


def settled() -> ExecutionObserver:
    obs = ExecutionObserver(window_s=0.001, settle_s=0.02)
    obs.clock_changed(0.0)
    return obs


def test_a_group_sent_together_onto_an_idle_gpu_is_one_sample() -> None:
    obs = settled()
    for seq, t in enumerate((1.0, 1.0002, 1.0005)):
        obs.on_dispatch("m", seq, 900, 8, t)
    assert obs.on_complete(0, 1.010) is None
    assert obs.on_complete(2, 1.011) is None
    sample = obs.on_complete(1, 1.012)
    assert sample is not None
    assert (sample.model, sample.clock_mhz, sample.batch, sample.at_s) == ("m", 900, 3, 1.012)
    assert sample.ms == pytest.approx(12.0)


@pytest.mark.parametrize(
    "spoiler",
    [
        "late",  # a request of the model sent after the window
        "other_model",  # another model sent while it runs
        "clock",  # the clock target changed while it ran
        "too_many",  # more than the model's largest batch
        "failed",  # one of them failed (no measurement)
    ],
)
def test_anything_that_is_not_an_isolated_execution_is_no_sample(spoiler: str) -> None:
    obs = settled()
    obs.on_dispatch("m", 0, 900, 2, 1.0)
    obs.on_dispatch("m", 1, 900, 2, 1.0003)
    last = 1
    if spoiler == "late":
        obs.on_dispatch("m", 2, 900, 2, 1.005)
        last = 2
    elif spoiler == "other_model":
        obs.on_dispatch("x", 2, 900, 2, 1.0004)
        last = 2
    elif spoiler == "too_many":
        obs.on_dispatch("m", 2, 900, 2, 1.0004)
        last = 2
    elif spoiler == "clock":
        obs.clock_changed(1.003)
    results = [obs.on_complete(0, 1.01)]
    results += [
        obs.on_complete(seq, 1.02, measured=spoiler != "failed") for seq in range(1, last + 1)
    ]
    assert results == [None] * len(results)
    # and the next isolated execution (clock settled again) is measured as usual
    obs.on_dispatch("m", 10, 900, 2, 2.0)
    assert obs.on_complete(10, 2.01) is not None


def test_no_sample_until_the_clock_has_settled_nor_without_a_clock() -> None:
    obs = ExecutionObserver(settle_s=0.02)
    obs.clock_changed(1.0)
    obs.on_dispatch("m", 0, 900, 8, 1.005)  # 5 ms after the change: may not have landed
    assert obs.on_complete(0, 1.015) is None
    obs.on_dispatch("m", 1, None, 8, 2.0)  # the GPU's own clock (policy default): unknown
    assert obs.on_complete(1, 2.01) is None
    obs.clock_changed(None)  # a new policy, at a moment not known: counts from the next send
    obs.on_dispatch("m", 2, 900, 8, 3.0)
    assert obs.on_complete(2, 3.01) is None
    obs.on_dispatch("m", 3, 900, 8, 3.05)
    assert obs.on_complete(3, 3.06) is not None


def _serve(sched: Scheduler[None], t: float, n: int, ms: float) -> float:
    """``n`` requests one after another, each ``ms`` at the GPU; the time after them."""
    for _ in range(n):
        sched.enqueue(Request(MODEL, t, slo_ms=500.0), t)
        d = sched.next_dispatch(t)
        assert d is not None
        t += ms / 1000.0
        sched.on_complete(d.request, ms / 1000.0, t)
        t += 0.05
    return t


def test_the_core_measures_and_refits_with_injected_time() -> None:
    """A scheduler with a learner: sequential requests at a fixed clock are measured, and a
    refit due after ``refit_every_s`` hands the policy a new table."""
    table = make_model_table()
    learner = OnlineTables(CLOCKS, gpu="gpu", params=OnlineParams(refit_every_s=1.0))
    sched: Scheduler[None] = Scheduler(
        TableSet([table]),
        FixedPolicy(CLOCKS, 900),
        SchedulerConfig(),
        serving={MODEL: ModelServing(max_batch=4)},
        learner=learner,
    )
    true_ms = 2.0 * table.predict_ms(900)  # the GPU runs twice as slow as the table says
    _serve(sched, 0.0, 40, true_ms)
    assert learner.samples_total(MODEL) == 40
    assert learner.refits(MODEL) >= 2
    assert sched.tables is learner.latest
    learned = sched.tables.get(MODEL)
    assert learned is not None
    assert learned.predict_ms(900) == pytest.approx(true_ms, rel=1e-3)
    # no live data at the other clocks: they moved with the observed one (×2)
    assert learned.predict_ms(300) == pytest.approx(2.0 * table.predict_ms(300), rel=0.02)
    assert learner.error(MODEL) == pytest.approx(0.0, abs=1e-3)  # the new table is right


def _learning_scheduler() -> tuple[Scheduler[None], OnlineTables, list[TableRefit]]:
    """A scheduler whose refits are handed out (as the live dispatcher hands them to a worker
    thread) instead of run as it completes a request."""
    learner = OnlineTables(CLOCKS, gpu="gpu", params=OnlineParams(refit_every_s=1.0))
    sched: Scheduler[None] = Scheduler(
        TableSet([make_model_table()]),
        FixedPolicy(CLOCKS, 900),
        SchedulerConfig(),
        serving={MODEL: ModelServing(max_batch=4)},
        learner=learner,
    )
    handed: list[TableRefit] = []
    sched.refit_offload = handed.append
    return sched, learner, handed


def test_a_refit_handed_out_is_adopted_when_its_fits_have_run() -> None:
    """The core hands the due refit out, one at a time, keeps measuring while it runs, and
    takes its table only when adopted: the same table the refit in place gives."""
    sched, learner, handed = _learning_scheduler()
    before = sched.tables
    true_ms = 2.0 * make_model_table().predict_ms(900)
    t = _serve(sched, 0.0, 40, true_ms)
    assert len(handed) == 1  # due at the first completion, again since, but one at a time
    handed[0].run()
    sched.adopt_refit(handed[0])  # one sample when it was prepared: nothing to fit yet
    assert sched.tables is before and learner.refits(MODEL) == 0
    t = _serve(sched, t, 1, true_ms)
    assert len(handed) == 2
    job = handed[1]
    t = _serve(sched, t, 3, true_ms)  # measured while its fits run; not in them
    assert sched.tables is before
    job.run()
    sched.adopt_refit(job)
    assert sched.tables is learner.latest and learner.refits(MODEL) == 1
    learned = sched.tables.get(MODEL)
    assert learned is not None
    assert learned.predict_ms(900) == pytest.approx(true_ms, rel=1e-3)
    # what the refit in place makes of the same 41 samples
    inline = OnlineTables(CLOCKS, gpu="gpu", params=OnlineParams(refit_every_s=1.0))
    for at_s, ms in job.inputs[0].cells[(1, 900)]:
        inline.observe(ExecutionSample(MODEL, 900, 1, ms, at_s), None)
    again = inline.refit(before, job.now_s)
    assert again is not None and again.get(MODEL) == learned
    sched.adopt_refit(job)  # adopted once only
    assert learner.refits(MODEL) == 1
    _serve(sched, t + 1.0, 1, true_ms)  # the next one is handed out once due
    assert len(handed) == 3


def test_a_refit_made_from_tables_replaced_meanwhile_is_dropped_and_done_again() -> None:
    sched, learner, handed = _learning_scheduler()
    t = _serve(sched, 0.0, 40, 2.0 * make_model_table().predict_ms(900))
    job = handed[0]
    job.run()
    replaced = TableSet([make_model_table()])
    sched.set_tables(replaced)  # e.g. the admin API
    sched.adopt_refit(job)
    assert sched.tables is replaced and learner.refits(MODEL) == 0
    _serve(sched, t + 2.0, 1, 2.0 * make_model_table().predict_ms(900))
    assert len(handed) == 2  # its models are refitted from the tables in force


def test_tables_loaded_from_a_file_become_the_learnings_reference() -> None:
    """Tables the operator loads (the admin API) are what their models' learning moves from
    next; tables a refit made never are."""
    sched, learner, handed = _learning_scheduler()
    t = _serve(sched, 0.0, 40, 2.0 * make_model_table().predict_ms(900))
    assert len(handed) == 1 and handed[0].inputs[0].base is None
    sched.set_tables(TableSet([make_model_table(slower=2.0)]))  # e.g. a refit's
    assert learner.base.get(MODEL) is None
    loaded = TableSet([make_model_table(slower=0.5)])
    sched.set_tables(loaded, reference=loaded)
    assert learner.base.get(MODEL) is loaded.get(MODEL)
    handed[0].run()
    sched.adopt_refit(handed[0])  # made from tables replaced since: dropped
    _serve(sched, t + 2.0, 1, 2.0 * make_model_table().predict_ms(900))
    assert len(handed) == 2 and handed[1].inputs[0].base is loaded.get(MODEL)
