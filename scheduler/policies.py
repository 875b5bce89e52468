"""Clock policies: each decides, at the core's events, which clock the GPU should run at, and
how many requests of each model to keep at Triton.

A policy reads the scheduler through :class:`scheduler.view.SchedulerView` and returns a clock
(MHz) to set, or None for "no change". ``initial_clock_mhz`` None means "leave the clock to the
GPU" (the device is reset, not locked).
"""

from __future__ import annotations

import bisect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from operator import attrgetter
from typing import ClassVar

import numpy as np
import numpy.typing as npt
from mypy_extensions import mypyc_attr
from scipy.stats import gamma

from scheduler.constraints import Constraints, WorkTable
from scheduler.params import SlackParams as SlackParams
from scheduler.view import QueuedRequest, SchedulerView
from time2clock.table import ModelTable

MIN_HOLD_S = 0.0005  # a hold shorter than this is not worth a timer
_own_deadline_s: Callable[[QueuedRequest], float] = attrgetter("deadline_s")
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


@mypyc_attr(allow_interpreted_subclasses=True)
class ClockPolicy(ABC):
    """One way of choosing the clock; see each subclass for which."""

    name: ClassVar[str]

    def __init__(self, clocks_mhz: list[int]) -> None:
        self.clocks_mhz = sorted(clocks_mhz)

    @abstractmethod
    def initial_clock_mhz(self) -> int | None:
        """The clock to start at; None leaves clocks to the GPU."""

    def attach(self, s: SchedulerView) -> None:  # noqa: B027 (most policies need nothing)
        """The scheduler this policy now serves, before :meth:`initial_clock_mhz` is asked."""

    def release_limit(self, s: SchedulerView, model: str, now_s: float) -> int:
        """How many requests of ``model`` to keep at Triton: by default its release depth, one
        or two full batches (:meth:`scheduler.core.Scheduler.release_depth`); the rest waits in
        the sidecar."""
        return s.release_depth(model, now_s)

    def on_enqueue(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        return None

    def on_dispatch(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        return None

    def on_complete(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        return None

    def on_token(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        """A token of ``request``'s stream went by (streams of generative models only)."""
        return None

    def poll(self, s: SchedulerView, now_s: float) -> int | None:
        """Called when :meth:`wake_at_s` falls due."""
        return None

    def on_energy(self, now_s: float, energy_j: float) -> None:  # noqa: B027 (most need nothing)
        """A new value of the GPU's energy counter (joules since any origin), current since
        ``now_s``; handed over in order, whoever reads the device."""

    def wake_at_s(self) -> float | None:
        """When this policy wants :meth:`poll` called, if at all."""
        return None

    def tables_changed(self) -> None:  # noqa: B027 (most policies derive nothing from tables)
        """A model's table or serving changed: forget anything derived from the old ones."""

    def model_scale(self, model: str) -> float | None:
        """The scale this policy puts on ``model``'s SLO, where it keeps one (a gauge)."""
        return None

    def state(self) -> list[dict[str, object]] | None:
        """What this policy learned and holds, for the admin state (None: nothing)."""
        return None

    def configured_change_delay_ms(self) -> float | None:
        """The clock-change delay this policy was given to plan raises with, where it plans
        with one and may learn the GPU's (:mod:`scheduler.changedelay`); None: it does not."""
        return None

    def plan_change_delay_ms(self, delay_ms: float) -> None:  # noqa: B027 (most plan none)
        """Plan every raise from now on as landing ``delay_ms`` after it is asked for."""

    def _snap_up(self, clock_mhz: float) -> int:
        """The lowest ladder clock at or above ``clock_mhz`` (the top one if none)."""
        i = bisect.bisect_left(self.clocks_mhz, clock_mhz)
        return self.clocks_mhz[min(i, len(self.clocks_mhz) - 1)]


class MaxPolicy(ClockPolicy):
    """Lock the top clock: what a latency-first deployment does today."""

    name = "max"

    def initial_clock_mhz(self) -> int | None:
        return self.clocks_mhz[-1]


class FixedPolicy(ClockPolicy):
    """One clock, forced by an operator (``fixed:MHZ``, the admin API's ``/admin/clock``)."""

    name = "fixed"

    def __init__(self, clocks_mhz: list[int], clock_mhz: int) -> None:
        super().__init__(clocks_mhz)
        if clock_mhz not in self.clocks_mhz:
            raise ValueError(
                f"{clock_mhz} MHz is not a supported clock "
                f"({self.clocks_mhz[0]}..{self.clocks_mhz[-1]} MHz, {len(self.clocks_mhz)} steps)"
            )
        self.clock_mhz = clock_mhz

    def initial_clock_mhz(self) -> int | None:
        return self.clock_mhz


class DefaultPolicy(ClockPolicy):
    """Leave clocks to the GPU's own boost logic (simulated: top while busy, bottom when idle)."""

    name = "default"

    def initial_clock_mhz(self) -> int | None:
        return None


class SeedPolicy(ClockPolicy):
    """Seed 003 exactly as written, on each request's own model's batch-1 curve.

    Before enqueue: the lowest clock at which a request with the current queue ahead of it meets
    its SLO, from the time2clock mean fit (``ceil((Q+1)/C)·y(f) ≤ SLO``). At dequeue: queue delay
    so far + expected time at the current clock; if that breaks the SLO, raise the clock one step,
    meaning the clock it would pick for a queue one longer, and at least the next clock up. A
    model with no table gets the top clock. Seed 003 knows no batching: ``C`` is the batch-1
    curve's concurrency.
    """

    name = "seed"

    def __init__(self, clocks_mhz: list[int]) -> None:
        super().__init__(clocks_mhz)
        self.current_mhz = self.clocks_mhz[0]

    def initial_clock_mhz(self) -> int | None:
        return self.current_mhz

    def on_enqueue(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        table = s.table_for(request.model)
        if table is None:
            self.current_mhz = self.clocks_mhz[-1]
            return self.current_mhz
        curve = table.curve(1)
        clock, _ = curve.clock_for_queue(request.slo_ms, s.queue_len - 1)
        self.current_mhz = self._snap_up(clock)
        return self.current_mhz

    def on_dispatch(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        table = s.table_for(request.model)
        if table is None:
            return None
        curve = table.curve(1)
        delay_ms = (now_s - request.arrival_s) * 1000.0
        if delay_ms + curve.predict_ms(self.current_mhz) <= request.slo_ms:
            return None
        longer, _ = curve.clock_for_queue(request.slo_ms, s.queue_len + 1)
        next_up = self._snap_up(self.current_mhz + 1)
        self.current_mhz = self._snap_up(max(longer, next_up))
        return self.current_mhz


class ModelPlan:
    """One model's predicted execution times at every clock, by batch size (row ``b``, batch 0
    costs nothing), its tail margin per execution, and its energy floor (:meth:`of` makes one
    from a table)."""

    def __init__(
        self,
        max_batch: int,
        times_ms: FloatArray,
        work: WorkTable,
        margin_ms: float,
        floor_mhz: int | None,
        full_batch_floor_mhz: int | None,
    ) -> None:
        self.max_batch = max_batch
        self.times_ms = times_ms
        self.work = work
        self.margin_ms = margin_ms
        self.floor_mhz = floor_mhz
        # Below this clock even a full batch costs more energy per inference, not less.
        self.full_batch_floor_mhz = full_batch_floor_mhz

    @staticmethod
    def of(table: ModelTable, max_batch: int, clocks_mhz: list[int], quantile: str) -> ModelPlan:
        """The plan of ``table`` for batches up to ``max_batch`` at ``clocks_mhz``, with the
        margin of its ``quantile``."""
        times_ms = np.vstack(
            [np.zeros((1, len(clocks_mhz))), table.predict_grid_ms(clocks_mhz, max_batch)]
        )
        return ModelPlan(
            max_batch,
            times_ms,
            WorkTable(times_ms, max_batch),
            table.tail_margin_ms(quantile),
            table.energy_optimal_clock_mhz(),
            table.energy_optimal_clock_mhz(max_batch),
        )

    def with_margin(self, margin_ms: float) -> ModelPlan:
        """The same plan (its tables shared) with another tail margin."""
        return ModelPlan(
            self.max_batch,
            self.times_ms,
            self.work,
            margin_ms,
            self.floor_mhz,
            self.full_batch_floor_mhz,
        )


@mypyc_attr(allow_interpreted_subclasses=True)
class SlackPolicy(ClockPolicy):
    """Ours: the lowest clock at which every request, in flight, queued or about to arrive,
    meets its own deadline at the tail, never below the energy-optimal clock.

    What it fixes in seed 003 (tails over the SLO on GPUs with wide spread, clocks set too low):

    * **Every request, its own deadline, in batches.** Requests are walked in dispatch order
      (priority and CFS included), after those already at Triton. Triton's batcher runs each
      model's requests in batches of up to its ``max_batch``, so ``n`` requests of a model ahead
      (in flight and queued, this one included) take ``⌊n/B⌋·t(f, B) + t(f, n mod B)``, each
      ``t`` from that model's own table at that batch size; the models' times add up (they share
      one GPU). Work already done on what is in flight (the time since the oldest was sent) is
      credited (no more than the time since that model's last completion). The first
      ``lookahead`` queued requests are walked exactly, the rest bounded
      together (earliest deadline, everything queued).
    * **The tail, not the mean.** ``k`` executions in a row take their mean times plus ``q·√k``,
      ``q`` the table's pooled residual quantile (``p99``) of one execution: for one execution
      that is exactly the p99 fit; for many it does not pile up one p99 each.
    * **Requests about to arrive.** ``phantoms`` (16) requests at the back of the queue from a
      Poisson stream at the measured rate ``λ`` (each model in proportion to its own rate): the
      ``j``-th arrives after ``Gamma(j, 1/λ)``, planned at its ``arrival_quantile`` (5%), i.e.
      early, as in a burst, so that the clock is up before a burst's requests queue (``python
      -m scheduler tune --param arrival_quantile --values 0.5,0.1,0.05`` measures the choice
      against ``best-fixed`` on a matrix). ``phantom_margin`` scales the tail margin phantoms
      carry.
    * **Never below the energy-optimal clock.** Below it a slower clock costs more energy per
      inference, not less; the floor is the table's measured optimum (the highest of the models
      present).
    * **Up at once, down after ``hold_s``.** A raise is set immediately and allows
      ``change_delay_ms`` (5 ms, or what the GPU is timed to take where longer:
      :mod:`scheduler.changedelay`) for the change to land; a step down waits until it has been
      enough for ``hold_s`` (50 ms), so a lull costs no clock change. ``safety`` (0.95) keeps 5%
      of every deadline's room for what the model does not know.
    * **Batches worth waiting for.** Below a full batch a model's requests may be held back
      for up to ``batch_hold`` (a quarter) of the tightest one's SLO while more arrive, and go
      together (see :meth:`release_limit`, and docs/design.md, "Batching and many models").
    * **A model with no table gets the top clock** while any of its requests is queued or in
      flight: nothing is known of how fast it runs.

    The clock is the lowest at which every constraint holds, as evaluating each at every clock
    finds it; :mod:`scheduler.constraints`, :meth:`_lookahead` and :meth:`_planned_mhz` say
    how it is found without doing that.
    """

    name = "slack"
    #: Whether a hold re-decided later may end later than first planned (fewer arrivals came
    #: than expected: a smaller batch needs less time).
    extends_holds = True

    def __init__(self, clocks_mhz: list[int], params: SlackParams | None = None) -> None:
        super().__init__(clocks_mhz)
        self.params = params or SlackParams()
        self._configured_delay_ms = self.params.change_delay_ms
        self.current_mhz = self.clocks_mhz[0]
        self._lower_since_s: float | None = None
        self._plans: dict[str, ModelPlan | None] = {}
        self._hints = [0, 0]  # the last plans' answers (clock index: now, after a delay)
        self._at_floor = False  # whether the last plan's clock was its floor
        # Whether deadlines are moved (_slo_scale overridden); if not, each is the request's own.
        self._scaled = type(self)._slo_scale is not SlackPolicy._slo_scale
        self._holds: dict[str, float] = {}  # model -> when to look again at requests held
        self._now_s = 0.0  # the time of the last decision
        self._held_head: dict[str, int] = {}  # model -> the first request of its hold
        self._released_upto: dict[str, int] = {}  # model -> the last request of a batch let go
        # The j-th of a Poisson stream's next arrivals comes after Gamma(j, 1/λ); plan for it
        # arriving early (its arrival_quantile), i.e. for a burst, not for the average spacing.
        self._phantom_gaps = [
            float(gamma.ppf(self.params.arrival_quantile, j))
            for j in range(1, self.params.phantoms + 1)
        ]

    def configured_change_delay_ms(self) -> float | None:
        return self._configured_delay_ms if self.params.learn_change_delay else None

    def plan_change_delay_ms(self, delay_ms: float) -> None:
        if delay_ms != self.params.change_delay_ms:
            self.params = replace(self.params, change_delay_ms=delay_ms)

    def _slo_scale(self, model: str, slo_ms: float) -> float:
        """The share of a request's SLO the plan aims at (1: its SLO; a feedback policy moves
        it, see :mod:`scheduler.adaptive`)."""
        return 1.0

    def _deadline_s(self, r: QueuedRequest) -> float:
        """The deadline the plan aims at for ``r``."""
        scale = self._slo_scale(r.model, r.slo_ms)
        return r.deadline_s if scale == 1.0 else r.arrival_s + scale * r.slo_ms / 1000.0

    def _hold_deadline_s(self, r: QueuedRequest) -> float:
        """The deadline a batch held back for ``r`` is released in time for."""
        return self._deadline_s(r)

    def release_limit(self, s: SchedulerView, model: str, now_s: float) -> int:
        """Hold ``model``'s waiting requests back for a fuller batch while that is safe; else
        let go up to its release depth.

        Energy per inference falls steeply with the batch (dvfs/profiles.py), and Triton's batcher
        only gets what arrives while an instance is busy: at low load, batches of one or two.
        So when nothing of the model is at Triton and fewer than a full batch wait, the sidecar
        waits for more, until the earliest of: a full batch; ``batch_hold`` of the tightest
        waiting request's SLO since it arrived; the last moment the batch expected by then still
        meets the earliest deadline at the energy-optimal clock with the tail margin. While the
        model's requests are at Triton, what arrives goes at once (up to the depth): it piles
        up at Triton's batcher anyway, and holding there too made bursts that cost the live
        stack its tail (docs/design.md, "Batching and many models"). Re-decided at every event.
        """
        depth = s.release_depth(model, now_s)
        before = self._holds.pop(model, None)
        plan = self._plan(s, model)
        waiting = s.queued_of(model)
        n = len(waiting)
        if not self.params.batch_hold or plan is None or n == 0:
            return depth
        if s.inflight_count(model) and not self.params.hold_while_busy:
            return depth
        if waiting[0].seq <= self._released_upto.get(model, -1):
            return depth  # the rest of a batch let go: it goes together
        if n >= plan.max_batch:
            self._released_upto[model] = waiting[plan.max_batch - 1].seq
            return depth
        p = self.params
        rate = s.arrival_rates_rps(now_s).get(model, 0.0)
        by_slo = min(r.deadline_s - r.slo_ms * (1.0 - p.batch_hold) / 1000.0 for r in waiting)
        expected = min(plan.max_batch, n + int(rate * max(0.0, by_slo - now_s)))
        clock = self.clocks_mhz.index(self._snap_up(self._floor_of(plan) or self.clocks_mhz[-1]))
        ahead = s.inflight_count(model)
        full, part = divmod(ahead + expected, plan.max_batch)
        need_ms = (
            full * plan.times_ms[plan.max_batch, clock]
            + plan.times_ms[part, clock]
            + plan.margin_ms * math.sqrt(full + (part > 0))
        )
        if p.hold_while_busy:
            need_ms += self._shared_ms(s, model, clock, need_ms)
        deadline_s = min(self._hold_deadline_s(r) for r in waiting)
        by_deadline = deadline_s - (need_ms / p.safety + self._raise_ahead_ms(clock)) / 1000.0
        until_s = min(by_slo, by_deadline)
        head = waiting[0].seq
        if before is not None and not self.extends_holds and self._held_head.get(model) == head:
            until_s = min(until_s, before)  # the batch's hold, as first planned, at the latest
        self._held_head[model] = head
        if until_s <= now_s + MIN_HOLD_S:
            self._released_upto[model] = waiting[-1].seq
            return depth
        self._holds[model] = float(until_s)
        return s.inflight_count(model)

    def _raise_ahead_ms(self, clock: int) -> float:
        """The time a batch held to run at clock index ``clock`` keeps for the raise to that
        clock to land: the whole clock change (the clock may be lower when the hold ends)."""
        return self.params.change_delay_ms

    def _shared_ms(self, s: SchedulerView, model: str, clock: int, own_ms: float) -> float:
        """How much the other models' work known now (at Triton and queued) delays ``own_ms``
        of ``model``'s at clock index ``clock``: models time-share the GPU, so each delays it
        by its own work or by ``own_ms``, whichever is less (as in :meth:`_feasible`)."""
        counts = {m: len(reqs) for m, reqs in s.inflight_by_model().items() if m != model}
        for m, n in s.queued_by_model().items():
            if m != model:
                counts[m] = counts.get(m, 0) + n
        delay_ms = 0.0
        for m, n in counts.items():
            plan = self._plan(s, m)
            if plan is None or not n:
                continue
            full, part = divmod(n, plan.max_batch)
            work_ms = full * plan.times_ms[plan.max_batch, clock] + plan.times_ms[part, clock]
            delay_ms += min(own_ms, float(work_ms))
        return delay_ms

    def initial_clock_mhz(self) -> int | None:
        return self.current_mhz

    def attach(self, s: SchedulerView) -> None:
        """Idle, the clock rests at the highest energy-optimal clock of the models profiled."""
        self._plans.clear()
        self.current_mhz = self._floor(s, s.tables.models)

    def tables_changed(self) -> None:
        self._plans.clear()

    def _plan(self, s: SchedulerView, model: str) -> ModelPlan | None:
        if model not in self._plans:
            table = s.table_for(model)
            self._plans[model] = (
                None
                if table is None
                else ModelPlan.of(
                    table,
                    # Triton batches only what it is sent: never more than the in-flight cap.
                    min(s.serving(model).max_batch, s.max_inflight),
                    self.clocks_mhz,
                    self.params.quantile,
                )
            )
        return self._plans[model]

    def target_mhz(self, s: SchedulerView, now_s: float) -> int:
        """The clock the requests need now (before hysteresis)."""
        inflight = s.inflight_by_model()
        if not s.queue_len and not inflight:
            return s.energy_floor_mhz(self._floor(s, s.tables.models), now_s)
        queued = self._lookahead(s)
        models = list(dict.fromkeys([*inflight, *(r.model for r in queued)]))
        plans = {m: self._plan(s, m) for m in models}
        if any(p is None for p in plans.values()):
            return self.clocks_mhz[-1]
        rates = {m: r for m, r in s.arrival_rates_rps(now_s).items() if self._plan(s, m)}
        for m in rates:
            if m not in plans:
                models.append(m)
                plans[m] = self._plan(s, m)
        constraints = self._constraints(s, now_s, models, plans, inflight, queued, rates)
        if constraints is None:
            return self.clocks_mhz[-1]  # a model with no table
        return self._planned_mhz(s, now_s, constraints, models)

    def _planned_mhz(
        self,
        s: SchedulerView,
        now_s: float,
        constraints: Constraints,
        models: list[str],
        floor_mhz: int | None = None,
    ) -> int:
        """The lowest clock meeting ``constraints``, never below the floor of ``models`` (the
        energy fit may lower the floor for a while, to measure a clock under it);
        ``floor_mhz``, that floor as the caller already has it (computed here otherwise).

        Where every constraint holds at the floor even after a raise's delay, the lowest clock
        that meets them lies at or below it, and the answer is the floor: no search. So a bound
        may stand in for the plan (:meth:`_lookahead`): where the bound holds at the floor, so
        does the plan; where it does not, the plan is made and searched."""
        floor = (
            floor_mhz
            if floor_mhz is not None
            else s.energy_floor_mhz(self._floor(s, models), now_s)
        )
        if self._at_floor or constraints.exact is not None:
            at = bisect.bisect_right(self.clocks_mhz, floor) - 1
            if at >= 0 and constraints.holds_at(at, True):
                self._at_floor = True
                return floor
            if constraints.exact is not None:
                constraints = constraints.exact()
        clock = max(self._first(constraints), floor)
        self._at_floor = clock == floor  # then the next plan looks at the floor first
        return clock

    def _lookahead(self, s: SchedulerView) -> Sequence[QueuedRequest]:
        """The queued requests the plan walks one by one: the first ``lookahead`` in dispatch
        order, or fewer where the bound on the rest of the queue (its earliest deadline, all
        of each model's requests ahead) makes the walk unneeded. Only while deadlines are the
        requests' own, and only where the models the plan counts, and their order, are what
        the walk would give; :meth:`_constraints` checks that no work table falls as ``n``
        grows, and walks them all where one would.

        * More than ``lookahead`` wait, all of one model: the bound's row has at least as many
          of the model ahead as any walked one, at least its margin, at most its room: where
          it holds, they hold. One is walked (it names the model).
        * Fewer wait, and the last plan's clock was its floor: the bound stands in for the
          walk (one request of each model), and where it holds at the floor, the plan is the
          floor (:meth:`_planned_mhz`); otherwise the walk is made then."""
        limit = self.params.lookahead
        waiting_n = s.queue_len
        if limit > 1 and waiting_n > 1 and not self._scales_deadlines():
            if waiting_n > limit:
                waiting = s.queued_by_model()
                if len(waiting) == 1:
                    (model,) = waiting
                    return [s.queued_of(model)[0]]
            elif self._at_floor:
                waiting = s.queued_by_model()
                inflight = s.inflight_by_model()
                if len(waiting) == 1 or all(m in inflight for m in waiting):
                    return [s.queued_of(m)[0] for m in waiting]
        return s.iter_queue(limit)

    def _scaled_deadlines(self) -> Callable[[QueuedRequest], float]:
        """:meth:`_deadline_s` for one plan: each class's scale looked up once."""
        scales: dict[tuple[str, float], float] = {}

        def deadline_s(r: QueuedRequest) -> float:
            key = (r.model, r.slo_ms)
            scale = scales.get(key)
            if scale is None:
                scale = scales[key] = self._slo_scale(r.model, r.slo_ms)
            return r.deadline_s if scale == 1.0 else r.arrival_s + scale * r.slo_ms / 1000.0

        return deadline_s

    def _scales_deadlines(self) -> bool:
        """Whether this policy moves the deadlines it plans for (:meth:`_slo_scale`)."""
        return self._scaled

    def _floor_of(self, plan: ModelPlan) -> int | None:
        """The clock a model is never run below: its energy-optimal clock at batch 1."""
        return plan.floor_mhz

    def _floor(self, s: SchedulerView, models: list[str]) -> int:
        floors = [
            f
            for m in models
            if (p := self._plan(s, m)) is not None and (f := self._floor_of(p)) is not None
        ]
        return self._snap_up(max(floors)) if floors else self.clocks_mhz[0]

    def _first(self, constraints: Constraints) -> int:
        """The lowest clock meeting every constraint (as it stands, or after a raise's delay).
        The previous plans' answers are where the search looks first (see
        :mod:`scheduler.constraints`): they change how fast the answer is found, not which."""
        idx = self._hints[0] = constraints.first(False, self._hints[0])
        if self.clocks_mhz[idx] > self.current_mhz:
            idx = self._hints[1] = constraints.first(True, self._hints[1])
        return self.clocks_mhz[idx]

    def _feasible(
        self,
        s: SchedulerView,
        now_s: float,
        models: list[str],
        plans: dict[str, ModelPlan | None],
        inflight: Mapping[str, list[QueuedRequest]],
        queued: Sequence[QueuedRequest],
        rates: dict[str, float],
    ) -> tuple[BoolArray, BoolArray]:
        """Per clock, whether every constraint holds: as the clock stands, and if a raise must
        first wait ``change_delay_ms`` (see :meth:`scheduler.constraints.Constraints.evaluate`).
        """
        constraints = self._constraints(s, now_s, models, plans, inflight, queued, rates)
        if constraints is None:
            none = np.zeros(len(self.clocks_mhz), bool)
            return none, none
        return constraints.everywhere()

    def _constraints(
        self,
        s: SchedulerView,
        now_s: float,
        models: list[str],
        plans: dict[str, ModelPlan | None],
        inflight: Mapping[str, list[QueuedRequest]],
        queued: Sequence[QueuedRequest],
        rates: dict[str, float],
    ) -> Constraints | None:
        """Every constraint of the plan; None when a model waiting has no table.

        A constraint is a request (or a bound on several) of model ``M`` with ``n`` of ``M``
        ahead of it, in dispatch order after those in flight: the requests in flight (one per
        model, its earliest deadline), the first ``lookahead`` queued, a bound on the rest of
        each model's queue (the earliest deadline of all), and the ``phantoms`` about to arrive.
        """
        p = self.params
        live = [plan for m in models if (plan := plans[m]) is not None]
        if len(live) < len(models):
            return None
        margin = float(live[0].margin_ms if len(live) == 1 else max(pl.margin_ms for pl in live))
        index = {m: k for k, m in enumerate(models)}
        counts = [0] * len(models)  # per model (index): its requests counted so far
        since = [now_s] * len(models)
        # One constraint per entry of these lists: its model (index), how many of that model
        # are ahead of it (itself included), its room (ms). Plain lists: a plan has a few dozen
        # rows, where numpy's cost per call would be most of the work.
        row_model: list[int] = []
        row_n: list[int] = []
        row_room: list[float] = []
        scaled = self._scaled  # if not, a request's deadline is its own
        deadline = self._scaled_deadlines() if scaled else _own_deadline_s
        for m, reqs in inflight.items():
            k = index[m]
            counts[k] = len(reqs)
            since[k] = max(min(r.dispatch_s for r in reqs), s.last_completion_s(m))
            row_model.append(k)
            row_n.append(counts[k])
            row_room.append((min(map(deadline, reqs)) - now_s) * 1e3)
        inflight_counts = counts.copy()
        if len(models) == 1 and not scaled:  # one model (the common case), rows in one go
            ahead = counts[0]
            row_model += [0] * len(queued)
            row_n += range(ahead + 1, ahead + 1 + len(queued))
            row_room += [(r.deadline_s - now_s) * 1000.0 for r in queued]
            counts[0] = ahead + len(queued)
        else:
            for r in queued:
                k = index[r.model]
                n = counts[k] + 1
                counts[k] = n
                row_model.append(k)
                row_n.append(n)
                row_room.append((deadline(r) - now_s) * 1000.0)
        if s.queue_len > len(queued):
            earliest = s.earliest_deadline_s()
            assert earliest is not None
            waiting = s.queued_by_model()
            if scaled:
                # The bound on the rest: its earliest deadline, moved as the tightest class's is.
                earliest += min(
                    (self._slo_scale(m, s.last_slo_ms(m)) - 1.0) * s.last_slo_ms(m) / 1000.0
                    for m in waiting
                )
            room = (earliest - now_s) * 1000.0
            for m, n in waiting.items():
                k_or_none = index.get(m)
                if k_or_none is None:
                    return None
                k = k_or_none
                counts[k] = inflight_counts[k] + n
                row_model.append(k)
                row_n.append(counts[k])
                row_room.append(room)
        known_rows = len(row_n)  # the rest are phantoms, with their own margin scale
        total_rate = sum(rates.values())
        if total_rate > 0 and self._phantom_gaps:
            ms_per_gap = 1000.0 / total_rate
            # A phantom's room beyond its gap: its model's last SLO, scaled as its class's.
            slo_room = {m: self._slo_scale(m, s.last_slo_ms(m)) * s.last_slo_ms(m) for m in rates}
            if len(rates) == 1:  # every phantom is of the one model arriving
                (m,) = rates
                k, room_m = index[m], slo_room[m]
                base = counts[k]
                for j, gap in enumerate(self._phantom_gaps, start=1):
                    row_model.append(k)
                    row_n.append(base + j)
                    row_room.append(gap * ms_per_gap + room_m)
                counts[k] += len(self._phantom_gaps)
            else:  # each the model most behind its share of the arrivals so far
                given = dict.fromkeys(rates, 0)
                for j, gap in enumerate(self._phantom_gaps, start=1):
                    m = max(rates, key=lambda x: rates[x] * j / total_rate - given[x])
                    given[m] += 1
                    k = index[m]
                    counts[k] += 1
                    row_model.append(k)
                    row_n.append(counts[k])
                    row_room.append(gap * ms_per_gap + slo_room[m])

        # The tail margin: ``k`` executions in a row carry ``margin · √k`` (phantoms scaled).
        if margin == 0.0:
            margins = [0.0] * len(row_n)
        else:
            batches = [plan.max_batch for plan in live]
            margins = []
            for i, (k, n) in enumerate(zip(row_model, row_n, strict=True)):
                full, part = divmod(n, batches[k])
                scale = 1.0 if i < known_rows else p.phantom_margin
                margins.append(margin * scale * math.sqrt(max(full + (part > 0), 1.0)))
        # Work done on what is in flight: at most the time since the model's last completion
        # (all earlier work has left the in-flight set), shared among the models running.
        share = 1.0 / max(1, len(inflight))
        constraints = Constraints(
            work=[plan.work for plan in live],
            row_model=row_model,
            row_n=row_n,
            room_ms=row_room,
            margin_ms=margins,
            inflight=inflight_counts,
            known=counts,
            elapsed_ms=[(now_s - at_s) * 1000.0 * share for at_s in since],
            safety=p.safety,
            change_delay_ms=p.change_delay_ms,
        )
        if len(queued) < min(s.queue_len, p.lookahead):  # the walk was cut short (_lookahead)
            if not all([plan.work.rising for plan in live]):  # where it may not be: walk all
                queued = s.iter_queue(p.lookahead)
                return self._constraints(s, now_s, models, plans, inflight, queued, rates)
            if s.queue_len <= p.lookahead:  # the rows are a bound: the plan, when asked for

                def exact() -> Constraints:
                    walked = s.iter_queue(p.lookahead)
                    plan = self._constraints(s, now_s, models, plans, inflight, walked, rates)
                    assert plan is not None, "the same models as the bound's"
                    return plan

                constraints.exact = exact
        return constraints

    def _decide(self, s: SchedulerView, now_s: float) -> int | None:
        self._now_s = now_s
        target = self.target_mhz(s, now_s)
        if target > self.current_mhz:
            self._lower_since_s = None
            self.current_mhz = target
            return target
        if target == self.current_mhz:
            self._lower_since_s = None
            return None
        if self._lower_since_s is None:
            self._lower_since_s = now_s
            return None
        if now_s >= self._lower_since_s + self.params.hold_s:  # the same sum as in wake_at_s
            self._lower_since_s = None
            self.current_mhz = target
            return target
        return None

    def on_enqueue(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        return self._decide(s, now_s)

    # A dispatch moves a request from the queue to Triton and a completion takes work away:
    # neither can need a faster clock, and a slower one waits ``hold_s`` anyway. So they are not
    # re-planned (a batch's completions arrive together: a plan each cost most of the CPU),
    # except the last completion, which starts the way down to the floor.
    def on_complete(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        if s.queue_len or s.inflight_by_model():
            return None
        return self._decide(s, now_s)

    def poll(self, s: SchedulerView, now_s: float) -> int | None:
        return self._decide(s, now_s)

    def wake_at_s(self) -> float | None:
        # A hold already due that the last decision did not let go (its requests wait behind
        # others the queue serves first) goes at the next event that frees them: asked for
        # now, a poll would find the same and ask again at the same instant, for ever.
        times = [t for t in self._holds.values() if t > self._now_s]
        if self._lower_since_s is not None:
            times.append(self._lower_since_s + self.params.hold_s)
        return min(times, default=None)
