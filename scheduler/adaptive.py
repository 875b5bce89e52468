"""``adaptive``: ``slack``'s plan over a base clock learned from the measured tail, an energy floor
for the batches the load forms, and a deep clock while the GPU is idle.

Three clocks, one for each thing the GPU does:

* **Busy: a base clock learned from the tail.** Each SLO class (model, SLO) has a
  :class:`scheduler.feedback.TailController` that aims the class's p99 of ``latency / SLO`` at
  its setpoint (0.97) by moving the class's base speed: a near miss speeds it up at once,
  completions with room slow it down a little each (faster while far below: over a class's
  first thousand, ``young_descent``; after, only if ``fast_descent`` asks: its extra steps down
  cost extra near misses, ``docs/design.md``). A class starts where one request alone meets the
  setpoint, or at the top clock where its SLO leaves no room for a queue. The base clock of a
  model is the fastest its classes ask for. It is what an operator who locks the
  best single clock in hindsight does, found online and followed as the load moves.
* **Queues: the plan.** Above the base, ``slack``'s plan raises the clock at once when the
  requests queued and at Triton need it (every request's deadline, in dispatch order, batches
  and the time already done), on the mean times of the table (the controller measures the
  tail; a margin on top would count it twice), and with one phantom arrival: the next, planned
  early as ``slack`` plans its own. A raise lands a clock change after it is asked for, so a
  request that arrives behind one running would wait on the base clock's execution; counting
  it raises the running one in time. The base carries the rest of the load to come.
* **Never below the energy floor**: the clock with the least energy per request **above the
  idle power** for the batch the load forms there (``max(1, λ·t(f, b))`` requests per
  execution at the measured arrival rate ``λ``, solved at every clock). A slower clock that
  forms bigger batches costs less per request; one that only stretches a lone request costs
  more. The controller's level never sinks below the floor (no wind-up).
* **Idle: deep.** When nothing is queued or at Triton the clock drops at once to the lowest
  clock from which the next request, arriving now, loses at most ``idle_depth`` (by default
  all) of the room its classes' base speed leaves under the tightest SLO to the clock change
  (it runs at the idle clock until the raise lands) and still meets the setpoint alone,
  weighed against what idling there saves. An idle GPU locked high draws more than one locked
  low; the base clock is back at the next arrival, and the tail controller, which measures the
  wake-ups, holds the base where they leave the tail room.

The knobs are :class:`scheduler.feedback.FeedbackParams`; ``docs/design.md`` ("The adaptive
policy") describes them and ``docs/simulator.md`` what the policy is worth on the simulator's
matrices.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict
from dataclasses import replace
from functools import lru_cache

import numpy as np
import numpy.typing as npt
from mypy_extensions import mypyc_attr

from scheduler.feedback import FeedbackParams, TailController
from scheduler.policies import ModelPlan, SlackParams, SlackPolicy
from scheduler.view import QueuedRequest, SchedulerView
from time2clock.table import ModelTable

MAX_CLASSES = 64  # SLO classes tracked at once (clients choose SLOs: the oldest is forgotten)
TIGHTER = 0.9  # a new table whose plan needs less than this share of the old one's: re-judge
RATE_STEP = 0.1  # the energy floor is found again when the arrival rate moved by this share
WAKE_DECAY = 0.002  # the share of arrivals that wake a quiet model: weight of each (~500)
FloatArray = npt.NDArray[np.float64]


@lru_cache(maxsize=4096)  # asked at every completion; round() to a digit is slow
def slo_class(model: str, slo_ms: float) -> tuple[str, float]:
    """The class a request's attainment counts in: its model and its SLO (to 0.1 ms)."""
    return model, round(slo_ms, 1)


def _need_ms(plan: ModelPlan) -> float:
    """What a plan expects one request alone to need, over the clocks: mean time plus margin."""
    return float(plan.times_ms[1].mean()) + plan.margin_ms


def woken_ms(times_ms: FloatArray, clock: int, delay_ms: float) -> float:
    """How long one request alone takes when it arrives to a GPU idle at clock index ``clock``
    and the raise to the top clock lands ``delay_ms`` later: it runs at the idle clock until
    then and at the top after (all of it at the idle clock if it is done first)."""
    top, idle = float(times_ms[-1]), float(times_ms[clock])
    return top + min(delay_ms, idle) * (1.0 - top / idle)


def _wall_ms(top_ms: float, most_ms: float, margin_ms: float) -> float | None:
    """The most a request alone may take, woken (:func:`woken_ms`), where it takes ``top_ms``
    at the top clock: ``most_ms`` less the tail margin; where even the top clock leaves no
    room for the margin, ``most_ms`` on its mean time (its tail is lost whatever the idle
    clock, its mean is not); where even the mean takes more at the top clock, no bound (the
    request is lost, and does not hold the GPU up)."""
    for limit_ms in (most_ms - margin_ms, most_ms):
        if top_ms <= limit_ms:
            return limit_ms
    return None


def _finite(x: float) -> float | None:
    """``x`` rounded, or None where nothing was measured (nan is not JSON)."""
    return round(x, 4) if math.isfinite(x) else None


class EnergyModel:
    """One model's energy per execution at every (batch, clock), from its table's measured
    energy per request, and the floor it gives for an arrival rate.

    The measured points are noisy (a few requests per clock), and the floor is an argmin over
    them: each profiled batch's power ``energy · batch / time`` is fitted with CMOS's law
    ``P(f) = p₀ + p₁·(f / f_max)³`` (static power plus ``f·V²`` with the voltage following
    the clock) by least squares, and energy per execution is that power times the table's
    time; between profiled batches it is interpolated.
    """

    def __init__(self, table: ModelTable, plan: ModelPlan, clocks_mhz: list[int]) -> None:
        self.times_ms = plan.times_ms  # row b: one execution of b requests, ms per clock
        self.max_batch = plan.max_batch
        self.static_w = 0.0
        tabulated = [b for b in table.batches if b <= plan.max_batch] or [1]
        x3 = (np.asarray(clocks_mhz, dtype=float) / clocks_mhz[-1]) ** 3
        grid_ms = table.predict_grid_ms(clocks_mhz, tabulated[-1])
        rows = []
        for b in tabulated:
            energies = table.energy_per_inference_grid_j(clocks_mhz, b)
            if any(e is None for e in energies):
                self.known = False
                return
            time_s = grid_ms[b - 1] / 1000.0
            power_w = np.array([b * float(e) for e in energies if e is not None]) / time_s
            design = np.vstack([np.ones_like(x3), x3]).T
            (p0, p1), *_ = np.linalg.lstsq(design, power_w, rcond=None)
            rows.append((p0 + p1 * x3) * time_s)  # J per execution
            if b == tabulated[0]:
                self.static_w = float(p0)  # busy, whatever the clock
        self.known = True
        per_execution = np.array(rows)
        batches = np.arange(1, plan.max_batch + 1, dtype=float)
        by_clock = [np.interp(batches, tabulated, per_execution[:, i]) for i in range(len(x3))]
        self.execution_j: FloatArray = np.vstack([np.zeros(len(clocks_mhz)), np.array(by_clock).T])

    def _at(self, matrix: FloatArray, batch: FloatArray) -> FloatArray:
        """``matrix[b, clock]`` at a fractional batch per clock (linear between rows)."""
        cols = np.arange(len(batch))
        lo = np.clip(np.floor(batch).astype(int), 1, self.max_batch)
        hi = np.minimum(lo + 1, self.max_batch)
        frac = batch - lo
        out: FloatArray = (1 - frac) * matrix[lo, cols] + frac * matrix[hi, cols]
        return out

    def batch_at(
        self, rate_rps: float, hold_s: float = 0.0, room_s: float | None = None, share: float = 1.0
    ) -> FloatArray:
        """The batch a Poisson load of ``rate_rps`` forms at each clock: the request that
        starts it and those that arrive while it is held or while the one before runs
        (``b = 1 + λ·(hold + t(f, b))``), at most the largest batch.

        The hold is ``hold_s``; with ``room_s`` (the time a request may take in all) it is at
        most what is left of the room once the batch has run (``t(f, b) / share``): a faster
        clock can hold longer and forms bigger batches."""
        batch = np.ones(self.times_ms.shape[1])
        for _ in range(12):
            t_s = self._at(self.times_ms, batch) / 1000.0
            hold = hold_s if room_s is None else np.clip(room_s - t_s / share, 0.0, hold_s)
            batch = np.clip(1.0 + rate_rps * (hold + t_s), 1.0, float(self.max_batch))
        return batch

    def floor_index(
        self,
        rate_rps: float,
        idle_power_w: float,
        tolerance: float = 0.0,
        hold_s: float = 0.0,
        room_s: float | None = None,
        share: float = 1.0,
        drop_j: FloatArray | None = None,
    ) -> int:
        """The lowest clock (index) whose energy per request above ``idle_power_w``, at the
        batch the load forms there (:meth:`batch_at`), is within ``tolerance`` of the least.

        ``drop_j``: what a busy period's end costs at each clock (the GPU idles there until the
        drop to the idle clock lands), charged to a batch at the chance that none arrives
        while it runs (then its end is the busy period's)."""
        batch = self.batch_at(rate_rps, hold_s, room_s, share)
        energy = self._at(self.execution_j, batch)
        time_s = self._at(self.times_ms, batch) / 1000.0
        if drop_j is not None:
            energy = energy + np.exp(-rate_rps * time_s) * drop_j
        above = (energy - idle_power_w * time_s) / batch
        best = float(above.min())
        return int(np.argmax(above <= best + tolerance * abs(best)))


class _Speeds:
    """One plan's levels: each clock's speed over the top clock's, as a log (<= 0; ascending
    with the clock), as an array and as a list, and the level of each clock asked for (the
    floor's, at every completion), so that the lookups at every event are plain Python."""

    def __init__(self, plan: ModelPlan) -> None:
        times = plan.times_ms[1]
        self.plan = plan
        self.levels: FloatArray = np.log(times[-1] / times)
        self._ascending: list[float] = self.levels.tolist()
        self._of_mhz: dict[int, float] = {}

    def clock_at(self, level: float) -> int:
        """The lowest clock (index) at least as fast as ``level`` (``searchsorted`` on the
        array, by bisection on the list: the same index)."""
        ascending = self._ascending
        return min(bisect.bisect_left(ascending, level - 1e-12), len(ascending) - 1)

    def level_of(self, clock_mhz: int, clocks_mhz: list[int]) -> float:
        """The level of ``clock_mhz``, a clock of the ladder ``clocks_mhz``."""
        level = self._of_mhz.get(clock_mhz)
        if level is None:
            level = self._of_mhz[clock_mhz] = self._ascending[clocks_mhz.index(clock_mhz)]
        return level


@mypyc_attr(allow_interpreted_subclasses=True)
class AdaptivePolicy(SlackPolicy):
    """A base clock from the measured tail, ``slack``'s plan above it, an energy floor below it
    and a deep clock when idle (see the module docstring)."""

    name = "adaptive"
    # The raise for a held batch is set a clock change before its hold ends: a hold that then
    # moved later would leave the GPU raised with nothing to run.
    extends_holds = False

    def __init__(
        self,
        clocks_mhz: list[int],
        params: SlackParams | None = None,
        feedback: FeedbackParams | None = None,
    ) -> None:
        fb = feedback or FeedbackParams()
        plan = replace(
            params or SlackParams(),
            phantoms=fb.phantoms,
            batch_hold=fb.batch_hold,
            hold_while_busy=fb.hold_while_busy,
        )
        super().__init__(clocks_mhz, plan)
        self._raise_plans: dict[str, ModelPlan] = {}  # model -> its plan with the raise margin
        self._speeds: dict[str, _Speeds] = {}  # model -> its plan's levels
        self.feedback = fb
        self.controllers: OrderedDict[tuple[str, float], TailController] = OrderedDict()
        self._need_before: dict[str, float] = {}  # model -> its plan's need, before new tables
        self._energy: dict[str, EnergyModel | None] = {}
        self._floors: dict[str, tuple[float, int]] = {}  # model -> (rate, floor clock index)
        self._now_s = 0.0
        self._idle_since_s: float | None = None
        self._idle_gap_s: float | None = None  # mean idle period, decayed
        self._done_s: dict[tuple[str, float], float] = {}  # class -> its last completion
        # model -> the share of its arrivals that found the GPU idle and its classes quiet
        self._woken: dict[str, float] = {}

    # -- levels, clocks and floors, per model -----------------------------------------------

    def _speeds_of(self, s: SchedulerView, model: str) -> _Speeds | None:
        """``model``'s levels (see :meth:`_levels`), computed once per plan: asked at every
        event."""
        plan = self._plan(s, model)
        if plan is None:
            return None
        known = self._speeds.get(model)
        if known is None or known.plan is not plan:
            known = self._speeds[model] = _Speeds(plan)
        return known

    def _levels(self, s: SchedulerView, model: str) -> FloatArray | None:
        """Each clock's speed relative to the top clock's, as a log (<= 0), for ``model``."""
        speeds = self._speeds_of(s, model)
        return None if speeds is None else speeds.levels

    def energy_floor_mhz(self, s: SchedulerView, model: str) -> int | None:
        """The energy floor of ``model`` at its arrival rate now (see the module docstring);
        None without a table."""
        plan = self._plan(s, model)
        if plan is None:
            return None
        if model not in self._energy:
            table = s.table_for(model)
            energy = EnergyModel(table, plan, self.clocks_mhz) if table is not None else None
            self._energy[model] = energy if energy is not None and energy.known else None
        energy = self._energy[model]
        if energy is None:
            return plan.floor_mhz
        # Attaching, the scheduler has measured no rate yet.
        rate = 0.0 if self._attaching else s.arrival_rates_rps(self._now_s).get(model, 0.0)
        known = self._floors.get(model)
        if known is None or abs(rate - known[0]) > RATE_STEP * max(known[0], 1.0):
            known = self._floors[model] = (
                rate,
                energy.floor_index(
                    rate,
                    self.feedback.idle_power_w or 0.0,
                    self.feedback.floor_tolerance,
                    *self._hold_room_s(s, model, plan),
                    self.params.safety,
                    self._drop_j(),
                ),
            )
        return self.clocks_mhz[known[1]]

    def _drop_j(self) -> FloatArray | None:
        """At each clock, the energy idling there for a clock change costs over idling at the
        lowest clock (:meth:`_idle_power_w`): the end of each busy period, until the drop to
        the idle clock lands. None where the idle power at the top clock is not known."""
        if not self.feedback.count_drop or self._idle_power_w(self.clocks_mhz[0]) is None:
            return None
        lowest = self._idle_power_w(self.clocks_mhz[0]) or 0.0
        extra_w = np.array([(self._idle_power_w(c) or 0.0) - lowest for c in self.clocks_mhz])
        out: FloatArray = extra_w * self.params.change_delay_ms / 1000.0
        return out

    def _hold_room_s(
        self, s: SchedulerView, model: str, plan: ModelPlan
    ) -> tuple[float, float | None]:
        """The longest hold of ``model``'s requests and the time a held batch may take in all
        (its SLO at the setpoint, less the tail margin and the raise to the floor found last,
        :meth:`_raise_ahead_ms`): what the energy floor's batch counts on
        (:meth:`EnergyModel.batch_at`). Attaching, none."""
        if self._attaching or not self.params.batch_hold:
            return 0.0, None
        slo_s = s.last_slo_ms(model) / 1e3
        known = self._floors.get(model)
        lead_ms = self.params.change_delay_ms if known is None else self._raise_ahead_ms(known[1])
        room_s = self.feedback.setpoint * slo_s - (lead_ms + plan.margin_ms) / 1e3
        return self.params.batch_hold * slo_s, room_s

    def base_mhz(self, s: SchedulerView, model: str) -> int | None:
        """The clock ``model``'s classes ask for: the fastest of their base speeds (None: no
        class of it has completed yet)."""
        speeds = self._speeds_of(s, model)
        mine = [c.level for (m, _), c in self.controllers.items() if m == model]
        if speeds is None or not mine:
            return None
        return self.clocks_mhz[speeds.clock_at(max(mine))]

    def _model_floor(self, s: SchedulerView, model: str) -> int | None:
        floors = [f for f in (self.energy_floor_mhz(s, model), self.base_mhz(s, model)) if f]
        return max(floors) if floors else None

    def _floor(self, s: SchedulerView, models: list[str]) -> int:
        floors = [f for m in models if (f := self._model_floor(s, m)) is not None]
        return self._snap_up(max(floors)) if floors else self.clocks_mhz[0]

    def _floor_of(self, plan: ModelPlan) -> int | None:
        """The clock a batch held back is planned to run at (``release_limit``): its model's
        energy floor, not the base clock. The base rises when the tail nears the SLO; a hold
        planned at the base would stretch to absorb the faster clock and the tail would stay
        where it was (a loop that ends at the top clock)."""
        model = next((m for m, p in self._plans.items() if p is plan), None)
        if model is None or self._view is None:
            return None
        floor = self.energy_floor_mhz(self._view, model)
        # While the energy fit probes a lower floor, the batch runs there: plan it there.
        return None if floor is None else self._view.energy_floor_mhz(floor, self._now_s)

    def _hold_deadline_s(self, r: QueuedRequest) -> float:
        """Holds end in time for the controller's setpoint, not the SLO: a batch held to its
        last moment lands its tail where the controller aims."""
        return r.arrival_s + self.feedback.setpoint * r.slo_ms / 1000.0

    _view: SchedulerView | None = None
    _rest_mhz: int | None = None  # the idle clock chosen last
    _attaching = False
    _not_resting = False  # set while _decide plans, having found the GPU not resting

    def attach(self, s: SchedulerView) -> None:
        self._view = s
        self._energy.clear()
        self._floors.clear()
        self._attaching = True
        try:
            super().attach(s)
        finally:
            self._attaching = False
        self._floors.clear()

    def tables_changed(self) -> None:
        """Remember what each model's plan needed, to compare with its new table's."""
        for model, plan in self._plans.items():
            if plan is not None:
                self._need_before[model] = _need_ms(plan)
        self._energy.clear()
        self._floors.clear()
        super().tables_changed()

    def _plan(self, s: SchedulerView, model: str) -> ModelPlan | None:
        """The model's plan; when a new table makes it markedly faster (a refit that found the
        model faster), its classes are judged afresh (what they measured was under the old
        one)."""
        known = self._plans.get(model)
        if known is not None and not self._need_before:  # asked many times per event
            return known
        fresh = model not in self._plans
        plan = super()._plan(s, model)
        before = self._need_before.pop(model, None)
        if fresh and plan is not None and before is not None and _need_ms(plan) < TIGHTER * before:
            for (m, _), controller in self.controllers.items():
                if m == model:
                    controller.rebase()
        return plan

    # -- idle ---------------------------------------------------------------------------------

    def _idle_power_w(self, clock_mhz: float) -> float | None:
        """Idle power at ``clock_mhz`` from the two readings (lowest and top clock), on the
        same cubic law as busy power; None when they are not known."""
        lo, hi = self.feedback.idle_power_w, self.feedback.idle_power_top_w
        if lo is None or hi is None:
            return None
        return lo + (hi - lo) * (clock_mhz / self.clocks_mhz[-1]) ** 3

    def _raise_ahead_ms(self, clock: int) -> float:
        """A batch held to run at clock index ``clock`` waits for no clock change where the GPU
        rests while holding (``rest_while_holding``) at a clock at least as fast, as it does
        where a wake-up from deeper would cost more than idling there saves (a clock change
        that is slow against the SLO's room): the hold may then run to the last moment the
        batch needs at that clock. Else the whole clock change, as ``slack`` keeps."""
        rest = self._rest_mhz
        if self.feedback.rest_while_holding and rest is not None and rest >= self.clocks_mhz[clock]:
            return 0.0
        return self.params.change_delay_ms

    def idle_clock_mhz(self, s: SchedulerView) -> int:
        """The clock to idle at (:meth:`_choose_idle_mhz`), remembered as the clock the GPU
        rests at (:meth:`_raise_ahead_ms`)."""
        clock = self._rest_mhz = self._choose_idle_mhz(s)
        return clock

    def _choose_idle_mhz(self, s: SchedulerView) -> int:
        """The clock to idle at, never above the busy floor (as the energy fit may lower it
        for a while: a GPU resting at the floor a probe is under would lower to the probe only
        while busy, after ``hold_s``, and a load that leaves the GPU idle between requests
        would never run there).

        Candidates: every clock from which the next request, arriving now, loses at most
        ``idle_depth`` of the tightest SLO to the raise (``change_delay_ms`` at the idle clock
        instead of the busy one), scaled by how far its classes' base speed is below the top
        clock's (a class at the top clock has no room for a wake-up), and still meets the
        setpoint with the plan's tail margin alone, raised to the top clock once the change
        lands (:func:`woken_ms`: with a clock change slower than the request, all of it runs
        at the idle clock; and a class quiet for ``quiet_s``, whose base says nothing of the
        next request, may take no more than this; where even the top clock leaves no room
        for the margin, on the mean time alone, and where it misses on its mean, no bound:
        :func:`_wall_ms`). Among them, when the
        GPU's idle power is known: the one with the least expected energy over an idle period
        (its mean, measured) and the wake-up after it (the extra busy time at the static busy
        power, as the first request runs at the idle clock until the raise lands); else the
        lowest.
        """
        if self._untabled_recently(s):
            return self.clocks_mhz[-1]
        models = [m for m in s.tables.models if self._plan(s, m) is not None]
        busy = self._snap_up(s.energy_floor_mhz(self._floor(s, models), self._now_s))
        if not models:
            return busy
        # The room a wake-up may take: a share of the SLO, none while a class asks for the
        # top clock (its tail has no room) and more as its base speed falls.
        budget_ms = self.feedback.idle_depth * min(
            s.last_slo_ms(m) * (1.0 - self._recent_scale(m)) for m in models
        )
        delay_ms = self.params.change_delay_ms
        b = self.clocks_mhz.index(busy)
        # Each model's times alone, and the most a request alone may take (:func:`woken_ms`).
        alone = [
            (p.times_ms[1], self.feedback.setpoint * s.last_slo_ms(m), p.margin_ms)
            for m in models
            if (p := self._plan(s, m)) is not None
        ]
        walls = [
            (t, wall_ms)
            for t, most_ms, margin_ms in alone
            if (wall_ms := _wall_ms(float(t[-1]), most_ms, margin_ms)) is not None
        ]
        static_w = max(
            (e.static_w for m in models if (e := self._energy.get(m)) is not None), default=None
        )
        best, best_j = busy, math.inf
        for i, clock in enumerate(self.clocks_mhz[: b + 1]):
            lost_ms = max(delay_ms * (1.0 - t[b] / t[i]) for t, _, _ in alone)
            if lost_ms > budget_ms or any(woken_ms(t, i, delay_ms) > ms for t, ms in walls):
                continue
            idle_w = self._idle_power_w(clock)
            if idle_w is None or static_w is None or self._idle_gap_s is None:
                return clock
            joules = idle_w * self._idle_gap_s + max(0.0, static_w - idle_w) * lost_ms / 1e3
            if joules < best_j:
                best, best_j = clock, joules
        return best

    def _idle(self, s: SchedulerView) -> bool:
        return not s.queue_len and not s.inflight_by_model()

    def _resting(self, s: SchedulerView, now_s: float) -> bool:
        """Whether the GPU has nothing to run until a hold ends: nothing at Triton and every
        model queued held back for a fuller batch, none of the holds due within a clock
        change (the raise for a held batch is set that long before it goes)."""
        if self._idle(s):
            return True
        if s.inflight_by_model() or not self.feedback.rest_while_holding:
            return False
        lead_s = self.params.change_delay_ms / 1000.0
        for model in s.queued_by_model():
            if self.release_limit(s, model, now_s) > 0:
                return False
            until = self._holds.get(model)
            if until is None or until - lead_s <= now_s:
                return False
        return True

    def wake_at_s(self) -> float | None:
        """As ``slack``'s, a clock change before each hold ends (the raise for the batch held
        lands as it goes), and, idle, when a class falls quiet (the idle clock may drop)."""
        lead_s = self.params.change_delay_ms / 1000.0
        times = [t - lead_s for t in self._holds.values() if t - lead_s > self._now_s]
        if self._idle_since_s is not None:  # idle: look again when a class falls quiet
            quiet = [t + self.feedback.quiet_s for t in self._done_s.values()]
            times += [t for t in quiet if t > self._now_s]
        own = super().wake_at_s()
        if own is not None:
            times.append(own)
        return min(times, default=None)

    def target_mhz(self, s: SchedulerView, now_s: float) -> int:
        """The plan's clock for the requests at Triton and queued, never below the floor of
        the models among them (a model with no request now does not hold the clock up)."""
        self._now_s = now_s
        if not self._not_resting and self._resting(s, now_s):
            return self.idle_clock_mhz(s)
        inflight = s.inflight_by_model()
        queued = self._lookahead(s)
        models = list(dict.fromkeys([*inflight, *(r.model for r in queued)]))
        plans = {m: self._plan(s, m) for m in models}
        if any(p is None for p in plans.values()):
            return self.clocks_mhz[-1]
        rates = {m: r for m, r in s.arrival_rates_rps(now_s).items() if m in plans}
        # While the energy fit probes under the floor, the base (the tail's clock) is under it
        # too: the plan then counts the table's p99 margin, as a hold does, not the mean.
        floor = self._floor(s, models)
        probed = s.energy_floor_mhz(floor, now_s)
        if probed < floor:
            raising = {m: p for m, p in plans.items() if p is not None}
        else:
            raising = {m: self._raise_plan(m, p) for m, p in plans.items() if p is not None}
        constraints = self._constraints(s, now_s, models, dict(raising), inflight, queued, rates)
        if constraints is None:
            return self.clocks_mhz[-1]  # a model with no table
        return self._planned_mhz(s, now_s, constraints, models, probed)

    def _raise_plan(self, model: str, plan: ModelPlan) -> ModelPlan:
        """``plan`` with the margin the raises plan for (``raise_quantile``: the mean by
        default, the controller measuring the tail); holds keep the table's p99 margin, as a
        batch held to its last moment has no room left for the tail."""
        known = self._raise_plans.get(model)
        if known is None or known.times_ms is not plan.times_ms:
            table = self._view.table_for(model) if self._view is not None else None
            q = self.feedback.raise_quantile
            known = plan.with_margin(
                0.0 if q == "mean" or table is None else table.tail_margin_ms(q)
            )
            self._raise_plans[model] = known
        return known

    def _decide(self, s: SchedulerView, now_s: float) -> int | None:
        """As ``slack``'s, except that the drop to the idle clock is at once (no hysteresis: an
        idle GPU has no request to slow down)."""
        self._now_s = now_s
        if not self._resting(s, now_s):
            self._not_resting = True  # target_mhz need not ask again
            try:
                return super()._decide(s, now_s)
            finally:
                self._not_resting = False
        self._lower_since_s = None
        if self._idle_since_s is None:
            self._idle_since_s = now_s
        idle = self.idle_clock_mhz(s)
        if idle == self.current_mhz:
            return None
        self.current_mhz = idle
        return idle

    # -- the tail -----------------------------------------------------------------------------

    def controller(self, model: str, slo_ms: float) -> TailController:
        """The class's controller (created at its first completion)."""
        key = slo_class(model, slo_ms)
        controller = self.controllers.get(key)
        if controller is None:
            controller = self.controllers[key] = TailController(self.feedback)
            if len(self.controllers) > MAX_CLASSES:
                gone, _ = self.controllers.popitem(last=False)
                self._done_s.pop(gone, None)
        else:
            self.controllers.move_to_end(key)
        return controller

    def _start_level(self, s: SchedulerView, model: str, slo_ms: float) -> float:
        """Where a new class starts: the clock at which one request alone meets the setpoint
        with the table's p99 margin (what the plan alone would have run it at); the top clock
        where no clock runs ``start_queue`` requests back to back within it (an SLO with no room
        for a queue: its first requests to queue would pass it before the controller moves)."""
        plan = self._plan(s, model)
        levels = self._levels(s, model)
        table = s.table_for(model)
        if plan is None or levels is None or table is None:
            return 0.0
        margin_ms = table.tail_margin_ms("p99") if "p99" in table.curve(1).tail_fits else 0.0
        room_ms = self.feedback.setpoint * slo_ms - margin_ms
        if not (self.feedback.start_queue * plan.times_ms[1] <= room_ms).any():
            return 0.0
        fits = plan.times_ms[1] <= room_ms
        return float(levels[int(np.argmax(fits))]) if fits.any() else 0.0

    def on_complete(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        self._now_s = now_s
        key = slo_class(request.model, request.slo_ms)
        self._done_s[key] = now_s
        fresh = key not in self.controllers
        controller = self.controller(request.model, request.slo_ms)
        if fresh:
            controller.level = self._start_level(s, request.model, request.slo_ms)
        speeds = self._speeds_of(s, request.model)
        floor = self.energy_floor_mhz(s, request.model)
        floor_level = (
            speeds.level_of(self._snap_up(floor), self.clocks_mhz)
            if speeds is not None and floor is not None
            else -math.inf
        )
        latency_ms = (now_s - request.arrival_s) * 1000.0
        rose = controller.observe(now_s, latency_ms, request.slo_ms, floor_level)
        if rose or self._resting(s, now_s):  # the base rose, or the GPU rests: plan again
            return self._decide(s, now_s)
        return None

    def on_enqueue(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        self._now_s = now_s
        since_s = self._idle_since_s
        if since_s is not None:  # an idle period ends: its length, decayed mean
            gap = now_s - since_s
            self._idle_gap_s = (
                gap if self._idle_gap_s is None else 0.9 * self._idle_gap_s + 0.1 * gap
            )
            self._idle_since_s = None
        if self.feedback.rare_wakes:  # the share of arrivals that wake a quiet model
            model = request.model
            woke = since_s is not None and self._quiet(model)
            share = self._woken.get(model, 0.0)
            self._woken[model] = share + WAKE_DECAY * (float(woke) - share)
        return super().on_enqueue(s, request, now_s)

    def _untabled_recently(self, s: SchedulerView) -> bool:
        """Whether a model with no table completed a request within ``quiet_s``: it runs at
        the top clock, and what a wake-up would cost it is unknown, so the GPU idles there
        (its executions then run at one clock, and its table can be learned from them)."""
        return any(
            self._recent(done_s) and self._plan(s, model) is None
            for (model, _), done_s in self._done_s.items()
        )

    def _recent(self, done_s: float) -> bool:
        """Whether a completion at ``done_s`` is within ``quiet_s`` of now (the wake-up set
        for the moment it falls quiet counts as quiet)."""
        return self._now_s - done_s < self.feedback.quiet_s - 1e-9

    def _quiet(self, model: str) -> bool:
        """Whether ``model``'s classes have completed requests, none within ``quiet_s``."""
        done = [done_s for (m, _), done_s in self._done_s.items() if m == model]
        return bool(done) and not any(self._recent(done_s) for done_s in done)

    def _recent_scale(self, model: str) -> float:
        """The base speed ``model``'s classes that completed within ``quiet_s`` ask for (1
        before any completed; 0 once all have been quiet that long: their tail says nothing
        of a request that comes after a pause). Where requests after such pauses are more
        than the share of misses the target allows (``rare_wakes``), they reach the tail the
        classes measure, and the base speed they ask for stays."""
        if model not in {m for m, _ in self.controllers}:
            return 1.0
        mine = [(key, c) for key, c in self.controllers.items() if key[0] == model]
        recent = [c.scale for key, c in mine if self._recent(self._done_s.get(key, -math.inf))]
        if recent:
            return max(recent)
        if self.feedback.rare_wakes and self._woken.get(model, 0.0) > 1.0 - self.feedback.target:
            return max(c.scale for _, c in mine)
        return 0.0

    def model_scale(self, model: str) -> float | None:
        """The base speed ``model``'s classes ask for, over the top clock's (the fastest of
        them; None: none has completed yet)."""
        scales = [c.scale for (m, _), c in self.controllers.items() if m == model]
        return max(scales, default=None)

    def state(self) -> list[dict[str, object]]:
        """Each class's base speed and clock and what its window measured, for the admin
        state."""
        out: list[dict[str, object]] = []
        for (model, slo_ms), c in self.controllers.items():
            speeds = self._speeds_of(self._view, model) if self._view is not None else None
            out.append(
                {
                    "model": model,
                    "slo_ms": slo_ms,
                    "scale": round(c.scale, 4),
                    "base_mhz": None
                    if speeds is None
                    else self.clocks_mhz[speeds.clock_at(c.level)],
                    "attainment": _finite(c.attainment()),
                    "tail_over_slo": _finite(c.tail_ratio()),
                    "completions": c.completions,
                    "near_misses": c.near_misses,
                    "rebases": c.rebases,
                }
            )
        return out
