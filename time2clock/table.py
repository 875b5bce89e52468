"""The time2clock table: per-clock latency statistics and the fits ``y = 1/(m·x + b)``.

x is the graphics clock in MHz, y the inference time in ms. The mean fit is seed 003's; the tail
fits (p90, p99) are the same law fitted to per-clock quantiles, for policies that must keep the
tail, not the mean, under the SLO.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
TAIL_QUANTILES = ("p90", "p99")


class TableError(ValueError):
    """A time2clock table that cannot be read or used; the message says what is wrong."""


@dataclass(frozen=True)
class InverseLinearFit:
    """``y = 1/(m·x + b)``, by least squares of ``1/y`` on ``x``; ``r2`` is that regression's."""

    m: float
    b: float
    r2: float

    def predict_ms(self, clock_mhz: float) -> float:
        denom = self.m * clock_mhz + self.b
        return 1.0 / denom if denom > 0 else math.inf

    def clock_for_budget_mhz(self, budget_ms: float, clocks_mhz: list[int]) -> tuple[int, bool]:
        """The lowest clock of ``clocks_mhz`` at which the predicted time fits ``budget_ms``.

        Closed form ``f = (1/budget − b)/m``, rounded up to the ladder. Returns ``(clock, met)``;
        when no clock meets the budget, the highest clock and ``False``.
        """
        if budget_ms <= 0 or not clocks_mhz:
            return clocks_mhz[-1], False
        if self.m <= 0:
            # Latency does not fall with clock: the lowest clock is as fast as any.
            return clocks_mhz[0], self.predict_ms(clocks_mhz[0]) <= budget_ms
        f = (1.0 / budget_ms - self.b) / self.m
        for clock in clocks_mhz:
            if clock >= f - 1e-9:
                return clock, True
        return clocks_mhz[-1], False


@dataclass(frozen=True)
class ClockPoint:
    """Statistics of the requests measured at one clock."""

    clock_mhz: int
    n: int
    trimmed_mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    energy_per_inference_j: float | None = None


@dataclass(frozen=True)
class Time2ClockTable:
    """What profiling one (GPU, model) pair at one concurrency taught us."""

    gpu: str
    model: str
    trim: float
    concurrency: int
    mean_fit: InverseLinearFit
    points: tuple[ClockPoint, ...]
    tail_fits: dict[str, InverseLinearFit] = field(default_factory=dict)
    residual_quantiles_ms: dict[str, float] = field(default_factory=dict)

    @property
    def m(self) -> float:
        return self.mean_fit.m

    @property
    def b(self) -> float:
        return self.mean_fit.b

    @property
    def r2(self) -> float:
        return self.mean_fit.r2

    @property
    def clocks_mhz(self) -> list[int]:
        return [p.clock_mhz for p in self.points]

    def fit_for(self, quantile: str | None = None) -> InverseLinearFit:
        """The mean fit (``None`` or ``"mean"``) or a tail fit (``"p90"``, ``"p99"``)."""
        if quantile in (None, "mean"):
            return self.mean_fit
        try:
            return self.tail_fits[quantile]
        except KeyError:
            raise TableError(
                f"table has no {quantile!r} fit; it has: mean, {', '.join(sorted(self.tail_fits))}"
            ) from None

    def energy_optimal_clock_mhz(self) -> int | None:
        """The measured clock with the least energy per inference, if energy was measured."""
        measured = [p for p in self.points if p.energy_per_inference_j is not None]
        if not measured:
            return None
        return min(measured, key=lambda p: (p.energy_per_inference_j, p.clock_mhz)).clock_mhz

    def tail_margin_ms(self, quantile: str) -> float:
        """How far the ``quantile`` of one request's time lies above the mean fit (ms)."""
        if quantile in self.residual_quantiles_ms:
            return self.residual_quantiles_ms[quantile]
        top = self.clocks_mhz[-1]
        return self.fit_for(quantile).predict_ms(top) - self.mean_fit.predict_ms(top)

    def predict_ms(self, clock_mhz: float, quantile: str | None = None) -> float:
        return self.fit_for(quantile).predict_ms(clock_mhz)

    def lowest_clock_mhz(self, budget_ms: float, quantile: str | None = None) -> tuple[int, bool]:
        """Lowest table clock whose predicted time fits ``budget_ms``; ``(clock, met)``."""
        return self.fit_for(quantile).clock_for_budget_mhz(budget_ms, self.clocks_mhz)

    def clock_for_queue(
        self,
        slo_ms: float,
        queue: int = 0,
        concurrency: int | None = None,
        quantile: str | None = None,
    ) -> tuple[int, bool]:
        """Lowest clock at which a request with ``queue`` ahead of it completes within ``slo_ms``.

        Completion is ``ceil((queue+1)/C)·y(f)``: requests go to the GPU ``C`` at a time, and
        ``y`` was measured with ``C`` in flight.
        """
        c = self.concurrency if concurrency is None else concurrency
        if queue < 0 or c < 1:
            raise ValueError(f"queue must be >= 0 and concurrency >= 1 (got {queue}, {c})")
        rounds = math.ceil((queue + 1) / c)
        return self.lowest_clock_mhz(slo_ms / rounds, quantile)

    # -- persistence ----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "law": "latency_ms = 1 / (m * clock_mhz + b)",
            "gpu": self.gpu,
            "model": self.model,
            "trim": self.trim,
            "concurrency": self.concurrency,
            "m": self.m,
            "b": self.b,
            "r2": self.r2,
            "clocks_mhz": self.clocks_mhz,
            "tail_fits": {q: asdict(f) for q, f in self.tail_fits.items()},
            "residual_quantiles_ms": dict(self.residual_quantiles_ms),
            "points": [asdict(p) for p in self.points],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Time2ClockTable:
        try:
            points = tuple(ClockPoint(**p) for p in data["points"])
            table = cls(
                gpu=str(data["gpu"]),
                model=str(data["model"]),
                trim=float(data["trim"]),
                concurrency=int(data["concurrency"]),
                mean_fit=InverseLinearFit(float(data["m"]), float(data["b"]), float(data["r2"])),
                points=points,
                tail_fits={
                    q: InverseLinearFit(float(f["m"]), float(f["b"]), float(f["r2"]))
                    for q, f in data.get("tail_fits", {}).items()
                },
                residual_quantiles_ms={
                    q: float(v) for q, v in data.get("residual_quantiles_ms", {}).items()
                },
            )
        except (KeyError, TypeError, ValueError) as err:
            raise TableError(f"not a time2clock table: {err!r}") from err
        if not table.points or table.clocks_mhz != sorted(set(table.clocks_mhz)):
            raise TableError("a time2clock table needs points at distinct clocks, ascending")
        if table.concurrency < 1:
            raise TableError(f"concurrency must be >= 1, got {table.concurrency}")
        return table

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Time2ClockTable:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise TableError(f"no time2clock table at {path}") from None
        except json.JSONDecodeError as err:
            raise TableError(f"{path} is not JSON: {err}") from err
        if not isinstance(data, dict):
            raise TableError(f"{path}: a time2clock table is a JSON object")
        return cls.from_json(data)
