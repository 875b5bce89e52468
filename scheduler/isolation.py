"""Seed 000's performance-isolation metric: how far each client's completion time is from what
an ideal CFS (Linux's, on a CPU) would give it, by nice weight.

The seed defines, for two tasks ``i`` and ``j`` under a scheduler ``mod``, the ratio of their
completion times ``DCT_i / DCT_j``, and measures isolation as how close that ratio comes to the
one ideal CFS gives (``mod`` = CPU). Here a client's work is what it had served over a run;
ideal CFS shares the GPU time its level received among its clients by weighted max-min fairness
(a client asking for less than its weighted share gets what it asks for, the rest is shared by
weight among the others, as CFS does with flows that are not always runnable). Completion time
goes as the inverse of the service rate, so for each client

    ``ratio_i = DCT_i / DCT*_i = ideal_i / served_i``  (1: exactly as ideal CFS; 2: twice as slow)

and for a pair, the seed's metric ``(DCT_i / DCT_j) / (DCT*_i / DCT*_j) = ratio_i / ratio_j``.
A level's deviation is the worst pair's ``max ratio / min ratio − 1`` (the seed's gCFS reached at
most 24%). Strict priority sits above CFS, so clients are compared only within their level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.weights import weight_for_nice


@dataclass(frozen=True)
class ClientUsage:
    """One client over a run: its level and nice, the work it had ``served`` and the work it
    asked for (``demand``; None: more than it could ever get, a closed loop), in one unit (GPU
    time, or requests of one model)."""

    name: str
    level: int
    nice: int
    served: float
    demand: float | None = None


@dataclass(frozen=True)
class ClientIsolation:
    name: str
    level: int
    nice: int
    served: float
    ideal: float
    ratio: float  # DCT / ideal DCT: ideal / served


@dataclass(frozen=True)
class IsolationReport:
    clients: tuple[ClientIsolation, ...]
    deviation_by_level: dict[int, float]  # worst pair's max ratio / min ratio − 1

    @property
    def deviation(self) -> float:
        """The worst level's deviation (nan: no level has two clients with service)."""
        finite = [d for d in self.deviation_by_level.values() if math.isfinite(d)]
        return max(finite, default=math.nan)

    def ratio_of(self, name: str) -> float:
        """A client's completion time over ideal CFS's (nan: not in the report)."""
        return next((c.ratio for c in self.clients if c.name == name), math.nan)

    def to_json(self) -> dict[str, object]:
        return {
            "deviation": _finite(self.deviation),
            "deviation_by_level": {str(k): _finite(v) for k, v in self.deviation_by_level.items()},
            "clients": {
                c.name: {
                    "level": c.level,
                    "nice": c.nice,
                    "served": c.served,
                    "ideal": round(c.ideal, 6),
                    "dct_over_ideal": _finite(c.ratio),
                }
                for c in self.clients
            },
        }


def _finite(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None


def ideal_shares(capacity: float, clients: Sequence[ClientUsage]) -> list[float]:
    """Weighted max-min fair split of ``capacity``: clients asking for less than their weighted
    share get what they ask; the rest is split by weight (water-filling)."""
    ideal = [0.0] * len(clients)
    open_ = set(range(len(clients)))
    left = capacity
    while open_ and left > 1e-12:
        weight = sum(weight_for_nice(clients[i].nice) for i in open_)
        fair = {i: left * weight_for_nice(clients[i].nice) / weight for i in open_}
        sated = {
            i for i in open_ if (d := clients[i].demand) is not None and d - ideal[i] <= fair[i]
        }
        if not sated:
            for i in open_:
                ideal[i] += fair[i]
            break
        for i in sated:
            demand = clients[i].demand
            assert demand is not None
            left -= demand - ideal[i]
            ideal[i] = demand
        open_ -= sated
    return ideal


def isolation(clients: Sequence[ClientUsage]) -> IsolationReport:
    """Each client's completion time against ideal CFS's, and each level's worst pair."""
    out: list[ClientIsolation] = []
    deviation: dict[int, float] = {}
    for level in sorted({c.level for c in clients}):
        mine = [c for c in clients if c.level == level]
        ideal = ideal_shares(sum(c.served for c in mine), mine)
        ratios = []
        for c, share in zip(mine, ideal, strict=True):
            ratio = share / c.served if c.served > 0 else (math.inf if share > 0 else math.nan)
            out.append(ClientIsolation(c.name, level, c.nice, c.served, share, ratio))
            if not math.isnan(ratio):
                ratios.append(ratio)
        deviation[level] = max(ratios) / min(ratios) - 1.0 if len(ratios) >= 2 else math.nan
    return IsolationReport(tuple(out), deviation)
