"""The scheduling core: no I/O and no clock of its own, so one code path serves the live gateway
and the simulator. Callers pass the time (``now_s``) into every call and carry out the decisions
it returns (send this request, set this clock)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Generic, overload

from dvfs.energy import EnergyReading
from scheduler.observe import ExecutionObserver
from scheduler.params import SchedulerConfig as SchedulerConfig
from scheduler.policies import ClockPolicy
from scheduler.queue import PriorityCfsQueue, VruntimeLedger
from scheduler.request import Completion, Dispatch, EnqueueResult, P, Request
from scheduler.view import ModelServing, QueuedRequest
from scheduler.waitbound import GUARD_S, WaitBound
from scheduler.weights import NICE_MAX, NICE_MIN, weight_for_nice
from time2clock.online import OnlineTables, TableRefit
from time2clock.online_energy import Composition
from time2clock.table import ModelTable, TableSet

FAIR_FROM = 0.5
RESERVE = 0.1
RATE_WINDOW_S = 1.0


# The second batch of a model kept at Triton (``triton_batches_alone``) goes once the first,
# released into an idle model, is expected this far through its execution: ready when the first
# ends, and not sooner, so that a burst whose clients leave early runs one batch for nobody.
SECOND_BATCH_AT = 0.75


def validate_hints(priority: int, nice: int, slo_ms: float, config: SchedulerConfig) -> str | None:
    """The problem with a request's scheduling hints, or None; names the field and its range."""
    if not 0 <= priority <= config.priority_levels:
        return (
            f"priority must be in 0..{config.priority_levels} (0 = the default level), "
            f"got {priority}"
        )
    if not NICE_MIN <= nice <= NICE_MAX:
        return f"nice must be in {NICE_MIN}..{NICE_MAX}, got {nice}"
    if not (slo_ms > 0 and math.isfinite(slo_ms)):
        return f"slo_ms must be a positive number of milliseconds, got {slo_ms}"
    return None


class Waiting(Sequence[QueuedRequest]):
    """One model's waiting requests, oldest first. A request leaves from anywhere (CFS takes
    each flow's oldest, and flows run at their own pace), so it is taken out in O(1), not by
    a scan of a list that holds the whole queue; the two ends are O(1) too."""

    __slots__ = ("_by_seq",)

    def __init__(self) -> None:
        self._by_seq: dict[int, QueuedRequest] = {}  # in arrival order

    def append(self, request: QueuedRequest) -> None:
        self._by_seq[request.seq] = request

    def remove(self, request: QueuedRequest) -> None:
        del self._by_seq[request.seq]

    def __len__(self) -> int:
        return len(self._by_seq)

    def __iter__(self) -> Iterator[QueuedRequest]:
        return iter(self._by_seq.values())

    @overload
    def __getitem__(self, index: int) -> QueuedRequest: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[QueuedRequest]: ...

    def __getitem__(self, index: int | slice) -> QueuedRequest | Sequence[QueuedRequest]:
        if index == 0 and self._by_seq:  # the oldest: asked at every plan
            return next(iter(self._by_seq.values()))
        if isinstance(index, slice):
            return list(self._by_seq.values())[index]
        n = len(self._by_seq)
        at = index + n if index < 0 else index
        if not 0 <= at < n:
            raise IndexError(f"index {index} out of range for {n} requests waiting")
        values = self._by_seq.values()
        if at == n - 1:
            return next(reversed(values))
        return next(islice(values, at, None))


class Scheduler(Generic[P]):
    """One GPU's queue, in-flight set and clock policy; the one owner of its tables."""

    def __init__(
        self,
        tables: TableSet,
        policy: ClockPolicy,
        config: SchedulerConfig | None = None,
        serving: Mapping[str, ModelServing] | None = None,
        learner: OnlineTables | None = None,
        ledger: VruntimeLedger | None = None,
    ) -> None:
        """``learner``: when given, every isolated execution (:mod:`scheduler.observe`) is a
        measurement, and the tables are refitted from them as it says (tables that learn).
        ``ledger``: the virtual runtimes shared with the other GPUs of the node (default: this
        GPU's own)."""
        self._tables = tables
        self.learner = learner
        # Where a refit's fits run, when not here and now: the owner runs the job (on a worker
        # thread: the time and energy fits take milliseconds of Python, tens with a table of
        # many clocks, and would stall every request) and calls :meth:`adopt_refit` back on its
        # own thread.
        self.refit_offload: Callable[[TableRefit], None] | None = None
        self._refitting: TableRefit | None = None
        self._observer = ExecutionObserver()
        self.policy = policy
        self.config = config or SchedulerConfig()
        self.queue: PriorityCfsQueue[P] = PriorityCfsQueue(ledger)
        self.inflight: dict[int, Request[P]] = {}
        self._inflight_by_model: dict[str, list[QueuedRequest]] = {}
        self._inflight_levels: dict[str, dict[int, int]] = {}  # model -> level -> at Triton
        self._queued_of: dict[str, Waiting] = {}
        self._queued_counts: dict[str, int] | None = None  # queued_by_model, until it changes
        self.bound = WaitBound()
        self._serving = dict(serving or {})
        # Derived from the tables, kept until they change: how a model not registered is
        # served, and what a request is charged at a clock (asked at every dispatch).
        self._derived: dict[str, ModelServing] = {}
        self._charges: dict[tuple[str, int | None], float] = {}
        self._depths: dict[str, tuple[int, int]] = {}  # release_depth per model: (levels, alone)
        self._busy_since: dict[str, float] = {}  # model -> when it last had work at Triton again
        self._second_at: dict[str, float] = {}  # model -> when its deeper depth is due
        self._now_s = -math.inf  # the latest dispatch decision's time
        self._last_nice: int | None = None  # the nice value of the latest arrival
        self._last_nice_s = -math.inf  # and that value's latest arrival
        self._other_nice_s = -math.inf  # the latest arrival of any other nice value
        self._weights_mixed_until_s = -math.inf  # two nice values arrived within GUARD_S
        policy.attach(self)
        self.clock_target_mhz: int | None = policy.initial_clock_mhz()
        self._seq = 0
        self._rates: dict[str, tuple[float, float]] = {}  # model -> (rate, at_s)
        self._rates_now: tuple[float, dict[str, float]] = (math.nan, {})  # (at_s, per model)
        self._last_slo_ms: dict[str, float] = {}
        self._last_completion_s: dict[str, float] = {}
        # When any request last completed (-inf: never): one float, so that another thread
        # (the energy reader's) may read it whole.
        self.last_done_s = -math.inf

    def set_policy(self, policy: ClockPolicy) -> None:
        """Swap the clock policy (the admin API does this); its initial clock becomes the target."""
        self.policy = policy
        policy.attach(self)
        self.clock_target_mhz = policy.initial_clock_mhz()
        self._observer.clock_changed(None)
        if self.learner is not None:
            self.learner.clock_unknown()

    # -- tables and serving ---------------------------------------------------------------

    @property
    def tables(self) -> TableSet:
        return self._tables

    def set_tables(self, tables: TableSet, reference: TableSet | None = None) -> None:
        """Replace every model's table (the admin API does this). ``reference``: tables loaded
        from outside (a profile), which their models' learning moves from from now on."""
        if reference is not None and self.learner is not None:
            for table in reference:
                self.learner.base.add(table)
        self._tables = tables
        self._derived.clear()
        self._charges.clear()
        self._depths.clear()
        self.policy.tables_changed()

    def table_for(self, model: str) -> ModelTable | None:
        return self._tables.get(model)

    def serving(self, model: str) -> ModelServing:
        """How Triton serves ``model``: as registered, else its table's largest batch on one
        instance."""
        known = self._serving.get(model) or self._derived.get(model)
        if known is not None:
            return known
        table = self._tables.get(model)
        derived = ModelServing(max_batch=table.max_batch if table is not None else 1)
        if len(self._derived) < 1024:  # models named, bounded
            self._derived[model] = derived
        return derived

    def serving_known(self, model: str) -> ModelServing | None:
        """How Triton serves ``model``, if it was registered (None: not known yet)."""
        return self._serving.get(model)

    def release_depth(self, model: str, now_s: float | None = None) -> int:
        """The most requests of ``model`` worth having at Triton at once: ``triton_batches`` full
        batches (``triton_batches_alone`` while one nice value alone arrived lately, and one
        priority level alone or only this model's requests, at levels its Triton batcher keeps
        apart: :meth:`_ordered`), and no fewer than two per instance. One full batch is what its
        batcher needs to run the batch the policy wants (several instances share it, as they share
        the GPU); a model that runs requests one at a time needs one running and one ready on each
        instance, so that the sidecar's round trip after a completion leaves no instance idle, and
        where that round trip is long (megabytes of input, a Python backend) a batched model needs
        the same: a second batch ready. That one goes only once the first batch sent to an idle
        model is expected :data:`SECOND_BATCH_AT` through its execution (``now_s``; None: the depth
        once due). Everything beyond would wait in Triton's queue, first come first served within a
        level, out of the sidecar's reach. A decoupled model (an LLM engine): the sequences it may
        run at once."""
        depths = self._depths.get(model)
        if depths is None:
            serving = self.serving(model)
            if serving.streams:
                depths = (serving.streams, serving.streams)
            else:
                alone = max(self.config.triton_batches_alone, self.config.triton_batches)
                least = 2 * serving.instances
                depths = (
                    max(self.config.triton_batches * serving.max_batch, least),
                    max(alone * serving.max_batch, least),
                )
            if len(self._depths) < 1024:  # models named, bounded
                self._depths[model] = depths
        if depths[1] == depths[0] or not (self.bound.one_level or self._ordered(model)):
            return depths[0]
        if self._weights_mixed_until_s > (self._now_s if now_s is None else now_s):
            return depths[0]  # shares to keep: what is at Triton runs whoever sent it
        if now_s is None:
            return depths[1]
        due = self._second_due_s(model, now_s)
        if now_s >= due:
            self._second_at.pop(model, None)
            return depths[1]
        if self.inflight_count(model) >= depths[0] and len(self._second_at) < 1024:
            self._second_at[model] = due  # the shallower depth holds requests back: wake then
        return depths[0]

    def _ordered(self, model: str) -> bool:
        """Whether Triton itself serves the levels arriving now in the sidecar's order:
        ``model`` alone had arrivals within ``GUARD_S`` and its batcher keeps their levels
        apart (the level goes to Triton as its ``priority``), so a higher-level request
        released now is batched before the lower levels' requests waiting there."""
        levels = self.bound.levels_of_sole_model(model)
        return levels is not None and self.serving(model).orders(levels)

    def _nice_arrived(self, nice: int, now_s: float) -> None:
        """A request with ``nice`` arrived: with another nice value within ``GUARD_S``, the
        nice weights have shares to keep, and the second batch waits (:meth:`release_depth`).
        The latest arrival of any other value is the previous value's latest: every value
        before it arrived earlier still."""
        if nice != self._last_nice:
            if self._last_nice is not None:
                self._other_nice_s = self._last_nice_s
            self._last_nice = nice
        self._last_nice_s = now_s
        if now_s - self._other_nice_s <= GUARD_S:
            self._weights_mixed_until_s = now_s + GUARD_S

    def _second_due_s(self, model: str, now_s: float) -> float:
        """When ``model``'s second batch may go: :data:`SECOND_BATCH_AT` of a full batch's
        expected time after it last had work at Triton again (now, if it has none), by its
        table at the clock targeted, or by what its requests took lately without one."""
        since = self._busy_since.get(model, now_s)
        table = self._costed(model)
        if table is not None:
            batch_ms = self.charge_ms(model) * table.max_batch
        else:
            batch_ms = self.queue.service_ms(model) or 0.0
        return since + SECOND_BATCH_AT * batch_ms / 1000.0

    def set_serving(self, model: str, serving: ModelServing) -> None:
        self._serving[model] = serving
        self._derived.pop(model, None)
        self._depths.pop(model, None)
        self.policy.tables_changed()

    # -- what policies read (scheduler.view.SchedulerView) --------------------------------

    @property
    def max_inflight(self) -> int:
        return self.config.max_inflight

    @property
    def queue_len(self) -> int:
        return self.queue.size

    def charge_ms(self, model: str) -> float:
        """The GPU time CFS charges a request of ``model`` when it is sent: its share of one
        full batch of its model, by the table at the clock targeted (cached per clock). That
        is the work the request brings, whatever batch it ends up in: how full the batches
        are is the scheduler's and its policy's doing (a rare model, a batch held small for
        a deadline), not the client's, and the sidecar never sees Triton's batches anyway.

        Not its time from dispatch to completion: that counts its wait at Triton behind other
        models' work and other batches, which depends on what else is there, so with two
        models of very different cost the shares drifted from the weights. A model without a
        table, and a stream (its time is its output's length), are charged what their requests
        took from dispatch to completion lately, and completion corrects each charge with the
        time measured."""
        table = self._costed(model)
        if table is None:
            served = self.queue.service_ms(model)
            return served if served is not None else self.config.default_slo_ms / 4
        key = (model, self.clock_target_mhz)
        charge = self._charges.get(key)
        if charge is None:
            clock = self.clock_target_mhz or table.clocks_mhz[-1]
            charge = table.predict_ms(clock, table.max_batch) / table.max_batch
            if len(self._charges) >= 4096:  # (model, clock) pairs: bounded
                self._charges.clear()
            self._charges[key] = charge
        return charge

    def _costed(self, model: str) -> ModelTable | None:
        """The table that says what a request of ``model`` costs the GPU (None: none does)."""
        table = self._tables.get(model)
        return None if table is None or self.serving(model).streams else table

    def iter_queue(self, limit: int) -> list[Request[P]]:
        """The first ``limit`` waiting requests in dispatch order."""
        head = self.queue.peek()
        charge = self.charge_ms(head.model) if head is not None else 0.0
        return self.queue.iter_order(limit, charge)

    def earliest_deadline_s(self) -> float | None:
        return self.queue.earliest_deadline_s()

    def inflight_by_model(self) -> Mapping[str, list[QueuedRequest]]:
        return self._inflight_by_model

    def queued_by_model(self) -> Mapping[str, int]:
        counts = self._queued_counts  # asked several times per event: built once per change
        if counts is None:
            counts = self._queued_counts = {m: len(reqs) for m, reqs in self._queued_of.items()}
        return counts

    def queued_of(self, model: str) -> Sequence[QueuedRequest]:
        """The requests of ``model`` waiting, oldest first."""
        return self._queued_of.get(model, ())

    def inflight_count(self, model: str) -> int:
        return len(self._inflight_by_model.get(model, ()))

    def inflight_levels(self, model: str) -> Mapping[int, int]:
        """How many requests of ``model`` are at Triton, by level."""
        return self._inflight_levels.get(model, {})

    def busy_models(self) -> int:
        """How many models have requests at Triton or waiting for it."""
        inflight, queued = self._inflight_by_model, self._queued_of
        return len(inflight) + sum(1 for m in queued if m not in inflight)

    def arrival_rates_rps(self, now_s: float) -> Mapping[str, float]:
        """Arrivals per second per model, exponentially decayed counts over ``RATE_WINDOW_S``
        (read-only: kept until an arrival or another time, as it is asked several times per
        event)."""
        at_s, rates = self._rates_now
        if at_s != now_s:
            rates = {m: self._rate(m, now_s) for m in self._rates}
            self._rates_now = (now_s, rates)
        return rates

    def arrival_rate_rps(self, now_s: float) -> float:
        """Arrivals per second over every model."""
        return sum(self.arrival_rates_rps(now_s).values())

    def _rate(self, model: str, now_s: float) -> float:
        rate, at_s = self._rates.get(model, (0.0, now_s))
        return rate * math.exp(-(now_s - at_s) / RATE_WINDOW_S)

    def last_slo_ms(self, model: str) -> float:
        return self._last_slo_ms.get(model, self.config.default_slo_ms)

    def last_completion_s(self, model: str) -> float:
        """When a request of ``model`` last completed (-inf: never)."""
        return self._last_completion_s.get(model, -math.inf)

    # -- events ---------------------------------------------------------------------------

    def _clock(self, proposed: int | None, now_s: float) -> int | None:
        """Record a policy's proposal; report it only when it changes the target."""
        if proposed is None or proposed == self.clock_target_mhz:
            return None
        self.clock_target_mhz = proposed
        self._observer.clock_changed(now_s)
        self._occupancy(now_s)
        return proposed

    def enqueue(self, request: Request[P], now_s: float) -> EnqueueResult:
        """Admit ``request`` (or refuse it, with the reason) and say whether to change the clock."""
        problem = validate_hints(request.priority, request.nice, request.slo_ms, self.config)
        if problem is not None:
            return EnqueueResult(accepted=False, reason=problem)
        request.level = self.config.level_of(request.priority)
        refusal = self._admission(request)
        if refusal is not None:
            return EnqueueResult(accepted=False, reason=refusal)
        request.seq = self._seq
        self._seq += 1
        self._rates[request.model] = (self._rate(request.model, now_s) + 1.0 / RATE_WINDOW_S, now_s)
        self._rates_now = (math.nan, {})
        self._last_slo_ms[request.model] = request.slo_ms
        self.queue.push(request)
        waiting = self._queued_of.get(request.model)
        if waiting is None:
            waiting = self._queued_of[request.model] = Waiting()
        waiting.append(request)
        self._queued_counts = None
        self.bound.arrived(request.model, request.level, request.slo_ms, now_s)
        self._nice_arrived(request.nice, now_s)
        return EnqueueResult(
            accepted=True,
            clock_mhz=self._clock(self.policy.on_enqueue(self, request, now_s), now_s),
        )

    def _admission(self, request: Request[P]) -> str | None:
        """Why ``request`` cannot be queued, or None.

        The queue holds at most ``max_queue``. Past ``FAIR_FROM`` of that, a flow that already
        has requests waiting may hold only its weight's share of ``(1 − RESERVE)·max_queue``,
        shared with the other flows that are waiting; the reserve is room for flows with
        nothing waiting (a new client, a higher priority). Without this, under overload the
        queue fills in arrival order and refusals, not CFS, decide who gets the GPU.
        Accepted requests are never evicted.
        """
        limit, waiting = self.config.max_queue, len(self.queue)
        if waiting >= limit:
            return f"queue full ({limit} requests waiting); retry later"
        mine = self.queue.queued_for(request.level, request.client_id)
        if not mine or waiting < FAIR_FROM * limit:
            return None
        weight = weight_for_nice(request.nice)
        share = weight / self.queue.backlogged_weight()
        cap = (1.0 - RESERVE) * limit * share
        if mine >= cap:
            return (
                f"client {request.client_id!r} has its fair share of the queue waiting "
                f"({mine} of {limit}, share {share:.0%} by nice {request.nice}); retry later"
            )
        return None

    def next_dispatch(self, now_s: float) -> Dispatch[P] | None:
        """The next request to send, if one is waiting and Triton should have it now.

        While fewer than ``max_inflight`` requests are at Triton: the first waiting request,
        in queue order, whose model has fewer at Triton than the policy's release limit for it,
        and whose release keeps the wait of every higher level within its SLO
        (:mod:`scheduler.waitbound`). A (model, level) held back blocks nothing behind it,
        however many of its requests wait ahead (:meth:`PriorityCfsQueue.first_sendable`):
        a held-back model at the head would otherwise starve the others.
        """
        self._now_s = now_s
        if len(self.inflight) >= self.config.max_inflight or not self.queue_len:
            return None
        request = self._next_sendable(now_s)
        if request is None:
            return None
        if request.model not in self._inflight_by_model:
            self._busy_since[request.model] = now_s
        self.queue.take(request, self.charge_ms(request.model))
        request.charge_final = self._costed(request.model) is not None
        self._unqueue(request)
        request.dispatch_s = now_s
        self.inflight[request.seq] = request
        self._inflight_by_model.setdefault(request.model, []).append(request)
        levels = self._inflight_levels.setdefault(request.model, {})
        levels[request.level] = levels.get(request.level, 0) + 1
        self.bound.released(request.model, request.level, now_s)
        self._observer.on_dispatch(
            request.model,
            request.seq,
            self.clock_target_mhz,
            self.serving(request.model).max_batch,
            now_s,
        )
        self._occupancy(now_s)
        clock = self._clock(self.policy.on_dispatch(self, request, now_s), now_s)
        return Dispatch(request=request, clock_mhz=clock)

    def _next_sendable(self, now_s: float) -> Request[P] | None:
        limits: dict[str, int] = {}  # model -> the policy's release limit
        room: dict[tuple[str, int], bool] = {}  # (model, level) -> may go now

        def sendable(model: str, level: int) -> bool:
            ok = room.get((model, level))
            if ok is None:
                limit = limits.get(model)
                if limit is None:
                    limit = limits[model] = self.policy.release_limit(self, model, now_s)
                ok = room[(model, level)] = self._ahead_at_triton(
                    model, level
                ) < limit and self.bound.allows(self, model, level, now_s)
            return ok

        return self.queue.first_sendable(sendable)

    def _ahead_at_triton(self, model: str, level: int) -> int:
        """What counts against a request's release limit: its model's requests at Triton of
        its level and higher. Lower levels there do not hold a higher one back: it
        goes ahead of them in Triton's priority queue (and with none configured, it would
        wait for them in the sidecar all the same). A decoupled model's streams all count."""
        if self.serving(model).streams:
            return self.inflight_count(model)
        levels = self._inflight_levels.get(model)
        if not levels:
            return 0
        return sum(n for at, n in levels.items() if at <= level)

    def on_complete(
        self, request: Request[P], service_s: float, now_s: float, *, measured: bool = True
    ) -> Completion[P]:
        """``request`` finished after ``service_s`` at Triton (queue there included);
        ``measured`` False: it failed or was never sent (its time is no measurement)."""
        if self.inflight.pop(request.seq, None) is None:
            raise KeyError(f"request {request.seq} is not in flight")
        same_model = self._inflight_by_model[request.model]
        same_model.remove(request)
        if not same_model:
            del self._inflight_by_model[request.model]
            del self._inflight_levels[request.model]
            self._busy_since.pop(request.model, None)
            self._second_at.pop(request.model, None)
        else:
            levels = self._inflight_levels[request.model]
            levels[request.level] -= 1
            if not levels[request.level]:
                del levels[request.level]
        used_ms = service_s * 1000.0  # 0: never sent, nothing used
        if request.charge_final and used_ms > 0:
            used_ms = request.charged_ms  # its GPU time, charged in full when it was sent
        self.queue.settle(request, used_ms, record=used_ms > 0)
        self._last_completion_s[request.model] = now_s
        self.last_done_s = now_s
        self._occupancy(now_s)
        sample = self._observer.on_complete(request.seq, now_s, measured=measured)
        if sample is not None and self.learner is not None:
            self.learner.observe(sample, self._tables.get(sample.model))
        if self.learner is not None and self.learner.due(now_s):
            self._refit(self.learner, now_s)
        return Completion(
            request=request,
            clock_mhz=self._clock(self.policy.on_complete(self, request, now_s), now_s),
        )

    def _refit(self, learner: OnlineTables, now_s: float) -> None:
        """Refit the tables: here and now, or, with :attr:`refit_offload`, its fits
        handed to it (one refit at a time) and adopted by :meth:`adopt_refit`."""
        if self.refit_offload is None:
            refitted = learner.refit(self._tables, now_s)
            if refitted is not None:
                self.set_tables(refitted)
            return
        if self._refitting is not None:
            return
        self._refitting = job = learner.prepare_refit(self._tables, now_s)
        self.refit_offload(job)

    def adopt_refit(self, job: TableRefit) -> None:
        """Adopt the refit ``job`` handed to :attr:`refit_offload`, once its fits have run
        (or failed: then it has none)."""
        if job is not self._refitting or self.learner is None:
            return
        self._refitting = None
        refitted = self.learner.finish_refit(job, self._tables)
        if refitted is not None:
            self.set_tables(refitted)

    def on_token(self, request: Request[P], now_s: float) -> int | None:
        """A token of ``request``'s stream went by; a clock to set, if any."""
        return self._clock(self.policy.on_token(self, request, now_s), now_s)

    # -- energy (what the online fit attributes the GPU's energy counter to) ------------------

    def _occupancy(self, now_s: float) -> None:
        if self.learner is None:
            return
        # What is at Triton, as time2clock.online_energy.composition makes it (every list of
        # _inflight_by_model holds a request: an emptied one is deleted).
        busy: Composition = tuple(sorted([(m, len(v)) for m, v in self._inflight_by_model.items()]))
        self.learner.record_occupancy(now_s, self.clock_target_mhz, busy)

    def on_energy(self, reading: EnergyReading, update_interval_s: float | None) -> None:
        """A new value of the GPU's energy counter (whoever reads the device hands it here, in
        order, with the counter's refresh interval as learned): to the energy fit and to the
        policy."""
        if self.learner is not None:
            self.learner.on_energy(reading, update_interval_s)
        self.policy.on_energy(reading.as_of_s, reading.energy_j)

    def energy_floor_mhz(self, floor_mhz: int, now_s: float) -> int:
        """The energy floor a policy should hold now: ``floor_mhz``, or a lower clock while
        the energy fit probes one (the deadlines still set the clock above it)."""
        return floor_mhz if self.learner is None else self.learner.floor_mhz(floor_mhz, now_s)

    def cancel(self, request: Request[P]) -> bool:
        """Forget a waiting ``request`` (abandoned by its client, or timed out); True if it was
        waiting. A request already dispatched is not recalled: it completes as usual."""
        if not self.queue.remove(request):
            return False
        self._unqueue(request)
        return True

    def drain(self) -> list[Request[P]]:
        """Take every waiting request out of the queue (shutting down); none is charged."""
        drained = []
        while (request := self.queue.pop(0.0)) is not None:
            self.queue.settle(request, 0.0, record=False)
            drained.append(request)
        self._queued_of.clear()
        self._queued_counts = None
        return drained

    def _unqueue(self, request: Request[P]) -> None:
        same_model = self._queued_of[request.model]
        same_model.remove(request)
        if not same_model:
            del self._queued_of[request.model]
        self._queued_counts = None

    def poll(self, now_s: float) -> int | None:
        """Run the policy's timer (hysteresis); a clock to set, if any."""
        return self._clock(self.policy.poll(self, now_s), now_s)

    def wake_at_s(self) -> float | None:
        """When to look again without an event: the policy's timer, or a model's second batch
        falling due (:meth:`release_depth`)."""
        wake = self.policy.wake_at_s()
        if self._second_at:
            for model in [m for m, at in self._second_at.items() if at <= self._now_s]:
                del self._second_at[model]  # looked at since it fell due
            due = min(self._second_at.values(), default=None)
            if due is not None and (wake is None or due < wake):
                return due
        return wake
