"""What a higher priority level may have to wait behind at Triton, and the cap that puts on the
lower levels' requests there.

The sidecar decides who goes next only for what it still holds; what it has released runs as
Triton's batcher makes it, and a batch that runs is never preempted. So a request of a higher
level that arrives now waits for one of the model's instances to come free, and then runs in
a batch, beside whatever else runs then. Batches that run side by side share the GPU, so each
lasts about ``T = G·t(R)``: ``t`` the model's table at the clock targeted, ``R`` every request
of the model at Triton (``n`` of the lower levels, ``h`` of the higher one's own batch), ``G``
the models with work at Triton or waiting for it (other models time-share the GPU).

With ``I`` instances whose batches start at evenly spaced moments, one comes free every
``T/I``: the higher request waits at most that long, then runs for ``T``, so its latency is at
most ``(1 + 1/I)·T`` (``2·T`` with one instance: a whole batch to wait for, then its own).
The spacing does not happen by itself: lower-level requests released all at once form one
batch, and two batches released together end together. So while a higher level is protected,
a model with several instances gets its lower-level requests in *chunks*: at most ``⌈n/I⌉``
within any spacing ``d``. Batches starting at least ``d`` apart leave an instance free within
``T − (I−1)·d``, so ``d = (2·T − budget) / (I − 1)``, with ``T`` for what would be at Triton
with the release: at the cap the even spacing ``T/I``; below it, batches are shorter and need
less (a fixed ``T/I`` at the cap's ``T`` held chunks back after shorter batches had ended, and
the instance that came free started on what little was there).

A level is *protected* for ``GUARD_S`` after its last arrival, with the tightest SLO its recent
requests named and its arrival rate. Its batch ``h`` is what it has at Triton plus the request
arriving, or the requests arriving within one gap if those are more. A lower-level request is
released only while the bound, with it at Triton, stays within ``SAFETY`` of the protected SLO
and its chunk has room; otherwise it waits in the sidecar's queue. The bound counts mean times
(a whole gap to wait, a whole batch to run), so no tail margin is added: on a noisy host the
margin measures the host, which holding the lower levels back does not quiet. So a flood of
lower priority gets smaller batches while a higher level is active, and full ones when it is
not. A lower level is never held with nothing of its own at Triton: one of its requests may
always run, so no level starves outright.

What this cannot beat: a higher level whose SLO is near one full batch's time leaves the lower
levels batches of a fraction of the largest, and smaller batches serve fewer requests per
second (docs/priority.md says how much).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from scheduler.view import ModelServing
from time2clock.table import ModelTable

GUARD_S = 2.0  # a level stays protected this long after its last arrival
RATE_WINDOW_S = 1.0  # the arrival rate's decay
SAFETY = 0.95  # share of the protected SLO the bound may use
_PLAN_CACHE = 4096  # (model, clock, budget) plans kept


class BoundView(Protocol):
    """What the bound reads of the scheduler."""

    @property
    def clock_target_mhz(self) -> int | None: ...

    def table_for(self, model: str) -> ModelTable | None: ...

    def serving(self, model: str) -> ModelServing: ...

    def inflight_levels(self, model: str) -> Mapping[int, int]: ...

    def busy_models(self) -> int: ...


@dataclass(slots=True)
class _Class:
    """Arrivals of one (model, level): decayed rate, tightest recent SLO, last arrival."""

    rate_rps: float
    rate_at_s: float
    slo_ms: float
    slo_at_s: float
    last_s: float


@dataclass(frozen=True, slots=True)
class Cap:
    """What the lower levels of a model may keep at Triton under one protected level: at most
    ``lower`` requests; beyond ``unstaggered`` (what holds the bound without the spacing),
    released in chunks of at most ``chunk`` within any ``gap_s``."""

    lower: int
    unstaggered: int
    chunk: int
    gap_s: float


def execution_ms(table: ModelTable, clock_mhz: float, requests: int) -> float:
    """Predicted time of ``requests`` of one model running at once: one execution up to the
    table's largest batch, proportionally longer beyond it (instances running side by side fill
    the GPU as one larger batch would, no faster)."""
    if requests <= 0:
        return 0.0
    largest = table.max_batch
    if requests <= largest:
        return table.predict_ms(clock_mhz, requests)
    return table.predict_ms(clock_mhz, largest) * requests / largest


def bound_ms(execution: float, instances: int, models: int) -> float:
    """The longest a higher-level request waits and runs when every batch of its model lasts
    ``execution`` ms alone on the GPU: a gap between two instances coming free, then its own
    batch, each stretched by the ``models`` sharing the GPU."""
    return max(1, models) * execution * (1.0 + 1.0 / max(1, instances))


class WaitBound:
    """The protected (higher) levels of one GPU's traffic, and whether a release keeps their
    wait bounded (see the module docstring)."""

    def __init__(self) -> None:
        self._classes: dict[tuple[str, int], _Class] = {}
        self._protected: list[tuple[str, int, _Class]] = []
        self._highest = 0  # the highest level protected; 0: fewer than two levels seen
        self._sole: tuple[str, tuple[int, ...]] | None = None  # one model's levels, alone
        self._released: dict[str, deque[tuple[float, int]]] = {}  # model -> (time, level)
        self._largest: dict[tuple[str, float, float], tuple[ModelTable, int]] = {}
        # At most the earliest last arrival of any class (none expires before it is
        # GUARD_S old), and whether a class came since the levels were last worked out: an
        # arrival that adds or expires no class leaves them as they were.
        self._oldest_s = math.inf
        self._changed = False

    def arrived(self, model: str, level: int, slo_ms: float, now_s: float) -> None:
        """A request of ``level`` for ``model`` arrived with ``slo_ms``."""
        c = self._classes.get((model, level))
        if c is None:
            self._classes[(model, level)] = _Class(1.0 / RATE_WINDOW_S, now_s, slo_ms, now_s, now_s)
            self._changed = True
        else:
            c.rate_rps = c.rate_rps * math.exp(-(now_s - c.rate_at_s) / RATE_WINDOW_S)
            c.rate_rps += 1.0 / RATE_WINDOW_S
            c.rate_at_s = now_s
            if slo_ms <= c.slo_ms or now_s - c.slo_at_s > GUARD_S:
                c.slo_ms, c.slo_at_s = slo_ms, now_s
            c.last_s = now_s
        self.refresh(now_s)

    def refresh(self, now_s: float) -> None:
        """Forget levels whose last arrival is older than ``GUARD_S``."""
        if not self._changed and now_s - self._oldest_s <= GUARD_S:
            return  # no class came or expired: nothing below would change
        for key in [k for k, c in self._classes.items() if now_s - c.last_s > GUARD_S]:
            del self._classes[key]
        self._oldest_s = min((c.last_s for c in self._classes.values()), default=math.inf)
        self._changed = False
        self._protected = [(m, lvl, c) for (m, lvl), c in self._classes.items()]
        levels = {lvl for _, lvl, _ in self._protected}
        # Only a level above another one seen has anything to be protected from.
        self._highest = min(levels) if len(levels) > 1 else 0
        models = {m for m, _, _ in self._protected}
        self._sole = (models.pop(), tuple(sorted(levels))) if len(models) == 1 else None
        if not self._highest:
            self._released.clear()

    @property
    def one_level(self) -> bool:
        """Whether fewer than two priority levels arrived within ``GUARD_S``: no level has
        anything to be protected from."""
        return not self._highest

    def levels_of_sole_model(self, model: str) -> tuple[int, ...] | None:
        """The levels that arrived within ``GUARD_S``, lowest number (highest level) first,
        when ``model`` alone had arrivals then; None when another model had some too (or none
        came)."""
        sole = self._sole
        return sole[1] if sole is not None and sole[0] == model else None

    def protected(self) -> list[tuple[str, int, float]]:
        """(model, level, tightest SLO ms) of every level seen within ``GUARD_S``."""
        return [(m, lvl, c.slo_ms) for m, lvl, c in self._protected]

    def released(self, model: str, level: int, now_s: float) -> None:
        """A request of ``model`` at ``level`` went to Triton (the chunks count these)."""
        if not self._highest or level <= self._highest:
            return
        recent = self._released.get(model)
        if recent is None:
            recent = self._released[model] = deque()
        recent.append((now_s, level))
        while recent and now_s - recent[0][0] > GUARD_S:
            recent.popleft()

    def allows(self, s: BoundView, model: str, level: int, now_s: float) -> bool:
        """Whether one more request of ``model`` at ``level`` may go to Triton now."""
        if not self._highest or level <= self._highest:
            return True
        for a, protected_level, c in self._protected:
            if a != model or protected_level >= level or now_s - c.last_s > GUARD_S:
                continue  # other models only share the GPU: counted in the bound as such
            lower, higher = _split(s.inflight_levels(a), protected_level)
            if not lower:
                continue  # a level is never held with nothing of its own at Triton
            cap = self._cap(s, a, higher, c, now_s, lower + 1)
            if cap is None:
                continue  # nothing known of how long its batches run: no bound to keep
            if lower + 1 > cap.lower:
                return False
            if lower + 1 > cap.unstaggered and (
                self._since(a, protected_level, now_s - cap.gap_s) >= cap.chunk
            ):
                return False
        return True

    def cap(self, s: BoundView, model: str, protected_level: int, now_s: float) -> Cap | None:
        """The cap that ``protected_level`` of ``model`` puts on its lower levels now (None:
        that level is not protected, or the model has no table)."""
        c = self._classes.get((model, protected_level))
        if c is None or now_s - c.last_s > GUARD_S:
            return None
        return self._cap(s, model, _split(s.inflight_levels(model), protected_level)[1], c, now_s)

    def _cap(
        self,
        s: BoundView,
        model: str,
        higher: int,
        c: _Class,
        now_s: float,
        at: int | None = None,
    ) -> Cap | None:
        table = s.table_for(model)
        if table is None:
            return None
        instances = max(1, s.serving(model).instances)
        models = max(1, s.busy_models())
        clock = s.clock_target_mhz or table.clocks_mhz[-1]
        budget_ms = SAFETY * c.slo_ms
        # Its own batch: at Triton already and arriving, or what arrives within one gap.
        gap_bound_s = budget_ms / 1000.0 / (instances + 1)
        rate = c.rate_rps * math.exp(-(now_s - c.rate_at_s) / RATE_WINDOW_S)
        own = max(higher + 1, min(table.max_batch, math.ceil(rate * gap_bound_s)))
        per_execution_ms = budget_ms / bound_ms(1.0, instances, models)
        largest = self._largest_within(model, table, clock, per_execution_ms)
        most = largest - own
        unstaggered = most
        if instances > 1:
            alone_ms = budget_ms / bound_ms(1.0, 1, models)
            unstaggered = self._largest_within(model, table, clock, alone_ms) - own
        gap_s = _spacing_s(
            models * execution_ms(table, clock, max(1, largest if at is None else at + own)),
            budget_ms,
            instances,
        )
        return Cap(most, unstaggered, max(1, math.ceil(most / instances)), gap_s)

    def _largest_within(
        self, model: str, table: ModelTable, clock: float, execution_budget_ms: float
    ) -> int:
        """The most requests of ``model`` that run at once within ``execution_budget_ms``
        (0: not even one), up to four full batches; remembered per table, clock and budget."""
        key = (model, clock, round(execution_budget_ms, 3))
        known = self._largest.get(key)
        if known is not None and known[0] is table:
            return known[1]
        lo, hi = 0, 4 * table.max_batch  # execution_ms grows with the requests: bisect
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if execution_ms(table, clock, mid) <= execution_budget_ms:
                lo = mid
            else:
                hi = mid - 1
        if len(self._largest) >= _PLAN_CACHE:
            self._largest.clear()
        self._largest[key] = (table, lo)
        return lo

    def _since(self, model: str, protected_level: int, since_s: float) -> int:
        """Requests of ``model`` below ``protected_level`` released after ``since_s``."""
        count = 0
        for at_s, level in reversed(self._released.get(model, ())):
            if at_s <= since_s:
                break
            count += level > protected_level
        return count


def _spacing_s(execution: float, budget_ms: float, instances: int) -> float:
    """How far apart (s) the lower levels' batches must start for a higher request to wait
    and run within ``budget_ms`` when every batch lasts ``execution`` ms: with ``I`` instances
    starting batches at least ``d`` apart, an instance comes free within ``execution − (I−1)·d``,
    so ``d ≥ (2·execution − budget) / (I − 1)``; at the cap that is the even spacing
    ``execution / I``, below it less."""
    if instances <= 1:
        return 0.0
    return max(0.0, 2.0 * execution - budget_ms) / (instances - 1) / 1000.0


def _split(levels: Mapping[int, int], protected_level: int) -> tuple[int, int]:
    """(below ``protected_level``, at it or above) of a model's requests at Triton."""
    lower = higher = 0
    for level, n in levels.items():
        if level > protected_level:
            lower += n
        else:
            higher += n
    return lower, higher
