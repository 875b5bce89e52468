"""What a higher priority level may have to wait behind at Triton, and the cap that puts on the
lower levels' requests there.

The sidecar decides who goes next only for what it still holds; what it has released runs as
Triton's batcher makes it, and a batch that runs is never preempted. So a request of a higher
level that arrives now waits, at worst, for an execution of everything of its model already at
Triton to finish, and then runs in a batch with whatever else Triton holds (``2·t(n + h)``, ``n``
the model's lower-level requests at Triton, ``h`` the higher level's own batch, ``t`` the
model's table at the clock targeted); and while other
models run at the same time, the GPU is shared by all of them (``× G``, the models with work
at Triton or waiting for it).

A level is *protected* for ``GUARD_S`` after its last arrival, with the tightest SLO its recent
requests named and its arrival rate. Its batch ``h`` is what it has at Triton plus the request
arriving, or the requests arriving within half its SLO if those are more. A lower-level request
is released only while that bound, with it at Triton, stays within ``SAFETY`` of the protected
SLO; otherwise it waits in the sidecar's queue. The bound is a worst case already (a whole
execution to wait for, then one of its own, at their mean times), so no tail margin is added:
on a noisy host the margin measures the host, which holding the lower levels back does not
quiet. So a flood of lower priority gets smaller batches while a higher level is active, and
full ones when it is not. A lower level is never held with nothing of its own at Triton: one
of its requests may always run, so no level starves outright.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from time2clock.table import ModelTable

GUARD_S = 2.0  # a level stays protected this long after its last arrival
RATE_WINDOW_S = 1.0  # the arrival rate's decay
SAFETY = 0.95  # share of the protected SLO the bound may use


class BoundView(Protocol):
    """What the bound reads of the scheduler."""

    @property
    def clock_target_mhz(self) -> int | None: ...

    def table_for(self, model: str) -> ModelTable | None: ...

    def inflight_levels(self, model: str) -> Mapping[int, int]: ...

    def busy_models(self) -> int: ...

    def inflight_count(self, model: str) -> int: ...


@dataclass(slots=True)
class _Class:
    """Arrivals of one (model, level): decayed rate, tightest recent SLO, last arrival."""

    rate_rps: float
    rate_at_s: float
    slo_ms: float
    slo_at_s: float
    last_s: float


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


class WaitBound:
    """The protected (higher) levels of one GPU's traffic, and whether a release keeps their
    wait bounded (see the module docstring)."""

    def __init__(self) -> None:
        self._classes: dict[tuple[str, int], _Class] = {}
        self._protected: list[tuple[str, int, _Class]] = []
        self._highest = 0  # the highest level protected; 0: fewer than two levels seen

    def arrived(self, model: str, level: int, slo_ms: float, now_s: float) -> None:
        """A request of ``level`` for ``model`` arrived with ``slo_ms``."""
        c = self._classes.get((model, level))
        if c is None:
            self._classes[(model, level)] = _Class(1.0 / RATE_WINDOW_S, now_s, slo_ms, now_s, now_s)
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
        for key in [k for k, c in self._classes.items() if now_s - c.last_s > GUARD_S]:
            del self._classes[key]
        self._protected = [(m, lvl, c) for (m, lvl), c in self._classes.items()]
        levels = {lvl for _, lvl, _ in self._protected}
        # Only a level above another one seen has anything to be protected from.
        self._highest = min(levels) if len(levels) > 1 else 0

    def protected(self) -> list[tuple[str, int, float]]:
        """(model, level, tightest SLO ms) of every level seen within ``GUARD_S``."""
        return [(m, lvl, c.slo_ms) for m, lvl, c in self._protected]

    def allows(self, s: BoundView, model: str, level: int, now_s: float) -> bool:
        """Whether one more request of ``model`` at ``level`` may go to Triton now."""
        if not self._highest or level <= self._highest:
            return True
        for a, protected_level, c in self._protected:
            if a != model or protected_level >= level or now_s - c.last_s > GUARD_S:
                continue  # other models only share the GPU: counted in the bound as such
            table = s.table_for(a)
            if table is None:
                continue  # nothing known of how long its batches run: no bound to keep
            lower = higher = 0
            for lvl, n in s.inflight_levels(a).items():
                if lvl > protected_level:
                    lower += n
                else:
                    higher += n
            if not lower:
                continue  # a level is never held with nothing of its own at Triton
            if self._need_ms(s, table, a, lower + 1, higher, c, now_s) > SAFETY * c.slo_ms:
                return False
        return True

    def _need_ms(
        self,
        s: BoundView,
        table: ModelTable,
        model: str,
        lower: int,
        higher: int,
        c: _Class,
        now_s: float,
    ) -> float:
        """The bound on the latency of a protected request of ``model`` with ``lower``
        lower-level and ``higher`` protected-level requests of it at Triton, beside every
        model running now. The protected level's part is what it has at Triton and the one
        arriving, or its expected batch if that is more."""
        rate = c.rate_rps * math.exp(-(now_s - c.rate_at_s) / RATE_WINDOW_S)
        expected = min(table.max_batch, math.ceil(rate * c.slo_ms / 2000.0))
        batch = max(higher + 1, expected)
        models = s.busy_models()
        clock = s.clock_target_mhz or table.clocks_mhz[-1]
        return 2.0 * max(1, models) * execution_ms(table, clock, lower + batch)
