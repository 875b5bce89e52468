"""Placement: which GPU of a node takes a new request (seed 000's gCFS run-queue choice).

Every GPU of a node has its own scheduler (queue, in-flight set, clock policy, tables). When a
request arrives, :class:`Placer` picks one of them, then the request is queued there and never
moves. Three modes:

``spread`` (gCFS)
    The GPU where the request is expected to finish soonest. The expectation counts what would
    run before it there: everything already at Triton, everything waiting at a higher priority
    level, the requests of its own flow ahead of it, and of each other flow at its level as much
    as CFS would serve before it (a flow whose virtual runtime is behind runs until it catches
    up with the new request's, in proportion to its weight); then its own batch, in batches as
    full as the model allows. Times come from the GPU's tables at its top clock (what it can
    do): ranking by the clock a policy targets now pulls work towards GPUs whose clock is
    already high, which keeps them high and costs energy. Finishes within ``TIE_SHARE`` of the
    soonest are ties (tables are estimates); ties go to the GPU with the least work, then to the
    one that took a request longest ago, so that an idle node spreads.
``energy``
    Among the GPUs where the request is expected to finish within ``pack_slo_share`` of the time
    left to its deadline at the clock their policy targets now (packing must not force a clock
    up), the one where it adds the least energy; ``spread`` when no GPU can. A request's energy
    is the table's energy per inference at that clock and the batch it would share the GPU with,
    less what the GPU would draw idle meanwhile (``idle_w``): a GPU that already works, in
    bigger batches, is cheaper than waking one. So low load packs onto few GPUs and the rest
    idle; high load (or a tight SLO) spreads.
``round-robin``
    Each GPU in turn, whatever it holds (the baseline a plain load balancer gives).

Nice weights are honoured across the node by the queues' shared virtual runtimes
(:class:`scheduler.queue.VruntimeLedger`) together with ``spread``'s weighted estimate, which
sends each flow where it would be served soonest, so that every backlogged flow is spread over
the GPUs it can use.

Pure: no I/O and no clock of its own (the caller passes ``now_s``); every GPU is read through
:class:`GpuView`, which :class:`scheduler.core.Scheduler` satisfies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from scheduler.request import Request
from scheduler.view import ModelServing
from scheduler.weights import NICE_0_WEIGHT, weight_for_nice
from time2clock.table import ModelTable


class PlacementMode(StrEnum):
    SPREAD = "spread"
    ENERGY = "energy"
    ROUND_ROBIN = "round-robin"


PLACEMENTS = tuple(m.value for m in PlacementMode)
# Expected finishes within this share of the soonest are ties: the tables are estimates, and two
# GPUs of one model learn slightly different ones.
TIE_SHARE = 0.1
DEFAULT_PLACEMENT = PlacementMode.SPREAD.value


@dataclass(frozen=True)
class PlacementParams:
    """``mode``: one of :data:`PLACEMENTS`. ``pack_slo_share``: in ``energy`` mode, the share of
    the time left to its deadline within which a request must be expected to finish (at the
    GPU's top clock) on a GPU for it to be packed there."""

    mode: str = DEFAULT_PLACEMENT
    pack_slo_share: float = 0.5

    def __post_init__(self) -> None:
        if self.mode not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {self.mode!r}")
        if not 0 < self.pack_slo_share <= 1:
            raise ValueError(f"pack_slo_share must be in (0, 1], got {self.pack_slo_share}")


class RunQueueView(Protocol):
    """What placement reads of a GPU's queue (:class:`scheduler.queue.PriorityCfsQueue`)."""

    def levels(self) -> list[int]: ...

    def waiting_by_model(self, level: int) -> Mapping[str, int]: ...

    def waiting_flows(self, level: int) -> Any: ...  # (client, vruntime, weight, by model)

    def start_vruntime(self, level: int, client_id: str) -> float: ...


class GpuView(Protocol):
    """What placement reads of one GPU's scheduler (:class:`scheduler.core.Scheduler`)."""

    @property
    def queue(self) -> Any: ...  # a RunQueueView

    @property
    def clock_target_mhz(self) -> int | None: ...

    def table_for(self, model: str) -> ModelTable | None: ...

    def serving(self, model: str) -> ModelServing: ...

    def inflight_by_model(self) -> Mapping[str, Sequence[Any]]: ...

    def charge_ms(self, model: str) -> float: ...


@dataclass(frozen=True)
class Estimate:
    """What a request would cost on one GPU: its expected time to completion there at the clock
    its policy targets now (``finish_ms``) and at its top clock (``finish_top_ms``), and the
    energy it adds (``energy_j``; None when the tables measured no energy)."""

    gpu: int
    finish_ms: float
    finish_top_ms: float
    energy_j: float | None
    work: int  # requests at the GPU or waiting there


# When a model has no table, one request is assumed to take this long (the same guess the
# scheduler charges CFS with: a quarter of the default SLO).
def _fallback_ms(default_slo_ms: float) -> float:
    return default_slo_ms / 4.0


_Memo = tuple[ModelTable, int, dict[tuple[int, int, bool], float | None]]


class _TableMemo:
    """Predictions of tables already asked for (a table is immutable; a refit makes a new one).
    Keeps the tables it memoises alive, so that their ids stay theirs; forgets all past
    ``limit`` tables."""

    __slots__ = ("_memo", "limit")

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._memo: dict[int, _Memo] = {}

    def _entry(self, table: ModelTable) -> _Memo:
        entry = self._memo.get(id(table))
        if entry is None or entry[0] is not table:
            if len(self._memo) >= self.limit:
                self._memo.clear()
            entry = self._memo[id(table)] = (table, table.clocks_mhz[-1], {})
        return entry

    def top_clock_mhz(self, table: ModelTable) -> int:
        return self._entry(table)[1]

    def batch_ms(self, table: ModelTable, clock_mhz: int, batch: int) -> float:
        _, _, memo = self._entry(table)
        key = (clock_mhz, batch, False)
        value = memo.get(key)
        if value is None:
            value = memo[key] = table.predict_ms(clock_mhz, batch)
        return value

    def energy_j(self, table: ModelTable, clock_mhz: int, batch: int) -> float | None:
        _, _, memo = self._entry(table)
        key = (clock_mhz, batch, True)
        if key not in memo:
            memo[key] = table.energy_per_inference_j(clock_mhz, batch)
        return memo[key]


class _Times:
    """One GPU's execution times at one clock (None: its top clock), from its tables."""

    __slots__ = ("clock_mhz", "default_ms", "gpu", "memo")

    def __init__(
        self, gpu: GpuView, clock_mhz: int | None, default_ms: float, memo: _TableMemo
    ) -> None:
        self.gpu = gpu
        self.clock_mhz = clock_mhz
        self.default_ms = default_ms
        self.memo = memo

    def clock_for(self, table: ModelTable) -> int:
        return self.clock_mhz if self.clock_mhz is not None else self.memo.top_clock_mhz(table)

    def batch_ms(self, model: str, batch: int) -> float:
        """One execution of ``batch`` requests of ``model``."""
        table = self.gpu.table_for(model)
        if table is None:
            return self.default_ms * batch
        value = self.memo.batch_ms(table, self.clock_for(table), batch)
        return value if math.isfinite(value) else self.default_ms * batch

    def drain_ms(self, model: str, requests: float) -> float:
        """``requests`` of ``model`` run in batches as full as the model allows."""
        if requests <= 0:
            return 0.0
        largest = self.gpu.serving(model).max_batch
        batch = max(1, min(largest, math.ceil(requests - 1e-9)))  # shares add up inexactly
        return requests / batch * self.batch_ms(model, batch)


class Placer:
    """Chooses the GPU for each new request; see the module docstring for the modes.

    ``idle_w``: each GPU's board power with nothing to do, for ``energy`` (None: unknown, taken
    as 0, so only the tables' energy per inference decides). ``default_slo_ms``: as the
    schedulers' (a model with no table is guessed at a quarter of it per request).
    """

    def __init__(
        self,
        params: PlacementParams | None = None,
        *,
        idle_w: Sequence[float | None] | None = None,
        default_slo_ms: float = 100.0,
    ) -> None:
        self.params = params or PlacementParams()
        self.idle_w = list(idle_w or ())
        self.default_ms = _fallback_ms(default_slo_ms)
        self._turn = 0  # round-robin: the next GPU
        self._placed = 0
        self._last_placed: dict[int, int] = {}  # gpu -> when it last took a request (a count)
        self.placed: list[int] = []  # requests placed per GPU
        self._memo = _TableMemo()

    @property
    def mode(self) -> str:
        return self.params.mode

    def place(
        self,
        gpus: Sequence[GpuView],
        request: Request[Any],
        now_s: float,
        *,
        available: Sequence[bool] | None = None,
    ) -> int:
        """The index of the GPU that takes ``request`` (one of those ``available``, default all).

        ``request.level`` must be set (the level its priority puts it in)."""
        candidates = [i for i in range(len(gpus)) if available is None or available[i]]
        if not candidates:
            raise ValueError("no GPU is available")
        if len(candidates) == 1:
            choice = candidates[0]
        elif self.params.mode == PlacementMode.ROUND_ROBIN:
            choice = min(candidates, key=lambda i: (i - self._turn) % len(gpus))
            self._turn = (choice + 1) % len(gpus)
        else:
            estimates = [self.estimate(gpus[i], i, request, now_s) for i in candidates]
            choice = self._choose(estimates, request, now_s)
        while len(self.placed) < len(gpus):
            self.placed.append(0)
        self.placed[choice] += 1
        self._placed += 1
        self._last_placed[choice] = self._placed
        return choice

    def _choose(self, estimates: list[Estimate], request: Request[Any], now_s: float) -> int:
        def spread(candidates: list[Estimate]) -> int:
            soonest = min(e.finish_top_ms for e in candidates)
            near = [e for e in candidates if e.finish_top_ms <= soonest * (1.0 + TIE_SHARE)]
            return min(
                near,
                key=lambda e: (e.work, self._last_placed.get(e.gpu, 0), e.finish_top_ms),
            ).gpu

        if self.params.mode == PlacementMode.ENERGY:
            left_ms = (request.deadline_s - now_s) * 1000.0
            room_ms = self.params.pack_slo_share * left_ms
            fits = [e for e in estimates if e.finish_ms <= room_ms]
            if fits:

                def energy_key(e: Estimate) -> tuple[float, float, int]:
                    energy = e.energy_j if e.energy_j is not None else e.finish_ms
                    return (energy, e.finish_ms, e.gpu)

                return min(fits, key=energy_key).gpu
        return spread(estimates)

    def estimate(self, gpu: GpuView, index: int, request: Request[Any], now_s: float) -> Estimate:
        """``request`` on ``gpu`` (the ``index``-th): see :class:`Estimate`."""
        now_times = _Times(gpu, gpu.clock_target_mhz, self.default_ms, self._memo)
        ahead, work = _ahead(gpu, request, now_times)
        top_times = _Times(gpu, None, self.default_ms, self._memo)
        finish_ms = sum(now_times.drain_ms(m, n) for m, n in ahead.items())
        finish_top_ms = sum(top_times.drain_ms(m, n) for m, n in ahead.items())
        energy = None
        if self.params.mode == PlacementMode.ENERGY:
            energy = self._energy_j(gpu, index, request.model, work, now_times)
        return Estimate(
            gpu=index,
            finish_ms=finish_ms,
            finish_top_ms=finish_top_ms,
            energy_j=energy,
            work=work,
        )

    def _energy_j(
        self, gpu: GpuView, index: int, model: str, sharing: int, times: _Times
    ) -> float | None:
        """Energy the request adds on ``gpu``: energy per inference at the batch it would share
        the GPU with, less the GPU's idle power over its share of that batch's time."""
        table = gpu.table_for(model)
        if table is None:
            return None
        batch = max(1, min(gpu.serving(model).max_batch, sharing + 1))
        per_inference_j = self._memo.energy_j(table, times.clock_for(table), batch)
        if per_inference_j is None:
            return None
        idle = self.idle_w[index] if index < len(self.idle_w) else None
        idle_j = (idle or 0.0) * times.batch_ms(model, batch) / batch / 1000.0
        return per_inference_j - idle_j


def _ahead(gpu: GpuView, request: Request[Any], times: _Times) -> tuple[dict[str, float], int]:
    """Requests (per model, fractions allowed) that would complete no later than ``request`` on
    ``gpu``, itself included; and how many of the model's requests share the GPU now (at
    Triton or waiting)."""
    ahead: dict[str, float] = {}

    def add(counts: Mapping[str, float], share: float = 1.0) -> None:
        for model, n in counts.items():
            ahead[model] = ahead.get(model, 0.0) + n * share

    inflight = gpu.inflight_by_model()
    add({m: len(reqs) for m, reqs in inflight.items()})
    queue = gpu.queue
    level = request.level
    sharing = len(inflight.get(request.model, ()))
    for n in queue.levels():
        waiting = queue.waiting_by_model(n)
        sharing += waiting.get(request.model, 0)
        if n < level:
            add(waiting)
    own_w = weight_for_nice(request.nice)
    start = queue.start_vruntime(level, request.client_id)
    others: list[tuple[float, int, Mapping[str, int], float]] = []
    own_ms = 0.0
    charges: dict[str, float] = {}

    def charge_ms(model: str) -> float:
        """Virtual runtime (at weight 1024) a request of ``model`` costs: what the GPU's
        scheduler charges it."""
        value = charges.get(model)
        if value is None:
            value = charges[model] = gpu.charge_ms(model)
        return value

    for client, vruntime, weight, by_model in queue.waiting_flows(level):
        work_ms = sum(n * charge_ms(m) for m, n in by_model.items())
        if client == request.client_id:
            add(by_model)
            own_ms = work_ms
        else:
            others.append((vruntime, weight, by_model, work_ms))
    own_ms += charge_ms(request.model)
    finish_vruntime = start + own_ms * NICE_0_WEIGHT / own_w
    for vruntime, weight, by_model, work_ms in others:
        if work_ms <= 0:
            continue
        served_ms = (finish_vruntime - vruntime) * weight / NICE_0_WEIGHT
        share = min(1.0, max(0.0, served_ms / work_ms))
        if share > 0:
            add(by_model, share)
    ahead[request.model] = ahead.get(request.model, 0.0) + 1.0
    return ahead, sharing
