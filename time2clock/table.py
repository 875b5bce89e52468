"""The time2clock tables: per-clock latency statistics and the fits ``y = h + 1/(m·x + b)``.

x is the graphics clock in MHz, y the inference time in ms. The mean fit is seed 003's law
``1/(m·x + b)``; the tail fits (p90, p99) are the same law fitted to per-clock quantiles, for
policies that must keep the tail, not the mean, under the SLO. ``h`` (``host_ms``) is the part of
each execution spent at the host with the GPU idle, the same at every clock: 0 in a profiled
table (the profile cannot tell it from the law), measured by the online fit where the GPU
reports its busy time (:mod:`time2clock.online`), so that the law describes the GPU's own part.

Three levels: a :class:`Time2ClockTable` is one such curve (one batch size at one concurrency);
a :class:`ModelTable` holds every curve profiled for one (GPU, model), one per batch size; a
:class:`TableSet` holds the tables of every model behind one GPU and is what a file stores
(format version 2; version-1 files, one curve without a batch size, still load).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

FORMAT_VERSION = 1  # one curve per file (Time2ClockTable.save); read by TableSet.load too
TABLE_FORMAT_VERSION = 2  # a TableSet: every model of one GPU, one curve per batch size
SUPPORTED_VERSIONS = (FORMAT_VERSION, TABLE_FORMAT_VERSION)
LAW = "latency_ms = host_ms + 1 / (m * clock_mhz + b)"
TAIL_QUANTILES = ("p90", "p99")

log = logging.getLogger(__name__)


class TableError(ValueError):
    """A time2clock table that cannot be read or used; the message says what is wrong."""


@dataclass(frozen=True)
class InverseLinearFit:
    """``y = host_ms + 1/(m·x + b)``, by least squares of ``1/(y − host_ms)`` on ``x``; ``r2``
    is that regression's. ``host_ms``: a part of every execution's time that the clock does not
    change (0: the law alone)."""

    m: float
    b: float
    r2: float
    host_ms: float = 0.0

    def predict_ms(self, clock_mhz: float) -> float:
        denom = self.m * clock_mhz + self.b
        return self.host_ms + 1.0 / denom if denom > 0 else math.inf

    def predict_array_ms(self, clocks_mhz: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """:meth:`predict_ms` at every clock of ``clocks_mhz``: the same operations, so the
        same values (infinite where the law has none)."""
        denom = self.m * clocks_mhz + self.b
        with np.errstate(divide="ignore", invalid="ignore"):
            out: npt.NDArray[np.float64] = np.where(denom > 0, 1.0 / denom, np.inf) + self.host_ms
        return out

    def clock_for_budget_mhz(self, budget_ms: float, clocks_mhz: list[int]) -> tuple[int, bool]:
        """The lowest clock of ``clocks_mhz`` at which the predicted time fits ``budget_ms``.

        Closed form ``f = (1/(budget − host) − b)/m``, rounded up to the ladder. Returns
        ``(clock, met)``; when no clock meets the budget, the highest clock and ``False``.
        """
        if budget_ms <= self.host_ms or budget_ms <= 0 or not clocks_mhz:
            return clocks_mhz[-1], False
        if self.m <= 0:
            # Latency does not fall with clock: the lowest clock is as fast as any.
            return clocks_mhz[0], self.predict_ms(clocks_mhz[0]) <= budget_ms
        f = (1.0 / (budget_ms - self.host_ms) - self.b) / self.m
        for clock in clocks_mhz:
            if clock >= f - 1e-9:
                return clock, True
        return clocks_mhz[-1], False


def _fit_json(fit: InverseLinearFit) -> dict[str, float]:
    """A fit as a table file stores it (``host_ms`` only where it is not 0)."""
    data = asdict(fit)
    if not fit.host_ms:
        del data["host_ms"]
    return data


def _fit_from_json(data: Mapping[str, Any]) -> InverseLinearFit:
    host_ms = float(data.get("host_ms", 0.0))
    if not (host_ms >= 0.0 and math.isfinite(host_ms)):
        raise ValueError(f"host_ms must be a finite time >= 0, got {host_ms}")
    return InverseLinearFit(float(data["m"]), float(data["b"]), float(data["r2"]), host_ms)


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
    """What profiling one (GPU, model) pair at one concurrency and one batch size taught us.

    ``batch`` is the number of requests in every execution measured for this curve: its times
    are those of one execution, and its ``energy_per_inference_j`` is per request (per batch
    element), not per execution.
    """

    gpu: str
    model: str
    trim: float
    concurrency: int
    mean_fit: InverseLinearFit
    points: tuple[ClockPoint, ...]
    tail_fits: dict[str, InverseLinearFit] = field(default_factory=dict)
    residual_quantiles_ms: dict[str, float] = field(default_factory=dict)
    batch: int = 1

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
        """This curve alone, as a version-1 file stores it (with its batch size)."""
        return {
            "version": FORMAT_VERSION,
            "law": LAW,
            "gpu": self.gpu,
            "model": self.model,
            **self.curve_json(),
        }

    def curve_json(self) -> dict[str, Any]:
        """The curve's own fields, as a :class:`ModelTable` stores each of its curves."""
        return {
            "batch": self.batch,
            "trim": self.trim,
            "concurrency": self.concurrency,
            **_fit_json(self.mean_fit),
            "clocks_mhz": self.clocks_mhz,
            "tail_fits": {q: _fit_json(f) for q, f in self.tail_fits.items()},
            "residual_quantiles_ms": dict(self.residual_quantiles_ms),
            "points": [asdict(p) for p in self.points],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Time2ClockTable:
        try:
            points = tuple(ClockPoint(**p) for p in data["points"])
            table = cls(
                gpu=str(data["gpu"]),
                model=str(data["model"]),
                trim=float(data["trim"]),
                concurrency=int(data["concurrency"]),
                mean_fit=_fit_from_json(data),
                points=points,
                tail_fits={q: _fit_from_json(f) for q, f in data.get("tail_fits", {}).items()},
                residual_quantiles_ms={
                    q: float(v) for q, v in data.get("residual_quantiles_ms", {}).items()
                },
                batch=int(data.get("batch", 1)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise TableError(f"not a time2clock table: {err!r}") from err
        if not table.points or table.clocks_mhz != sorted(set(table.clocks_mhz)):
            raise TableError("a time2clock table needs points at distinct clocks, ascending")
        if table.concurrency < 1:
            raise TableError(f"concurrency must be >= 1, got {table.concurrency}")
        if table.batch < 1:
            raise TableError(f"batch must be >= 1, got {table.batch}")
        return table

    def save(self, path: Path) -> None:
        """Write this one curve as a version-1 file (a :class:`TableSet` writes version 2)."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Time2ClockTable:
        """Read a version-1 file (one curve); :meth:`TableSet.load` reads every version."""
        data = _read_json(path)
        version = data.get("version")
        if version not in (None, FORMAT_VERSION):
            raise TableError(
                f"{path}: Time2ClockTable.load reads format version {FORMAT_VERSION} (one curve); "
                f"found version {version!r}: load it with TableSet.load"
            )
        return cls.from_json(data)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise TableError(f"no time2clock table at {path}") from None
    except OSError as err:
        raise TableError(f"cannot read the time2clock table {path}: {err}") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TableError(f"{path} is not JSON: {err}") from err
    if not isinstance(data, dict):
        raise TableError(f"{path}: a time2clock table is a JSON object")
    return data


@dataclass(frozen=True)
class ModelTable:
    """Every curve profiled for one (GPU, model): one :class:`Time2ClockTable` per batch size.

    A prediction is for one execution of ``batch`` requests. Between profiled batch sizes it is
    interpolated linearly in the batch, since the time of a batch grows smoothly with its size;
    above the largest it is extrapolated from the last two curves (never falling); below the
    smallest, the smallest curve is used, which overestimates rather than promises too much.
    """

    gpu: str
    model: str
    curves: Mapping[int, Time2ClockTable]

    def __post_init__(self) -> None:
        if not self.curves:
            raise TableError(f"the table of {self.model} on {self.gpu} has no curves")
        for batch, curve in self.curves.items():
            if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
                raise TableError(f"{self.model}: batch sizes are integers >= 1, got {batch!r}")
            if curve.batch != batch:
                raise TableError(
                    f"{self.model}: the curve filed under batch {batch} was measured "
                    f"at batch {curve.batch}"
                )
            if (curve.gpu, curve.model) != (self.gpu, self.model):
                raise TableError(
                    f"the table of {self.model} on {self.gpu} holds a curve of "
                    f"{curve.model} on {curve.gpu}"
                )
        object.__setattr__(self, "curves", dict(sorted(self.curves.items())))

    @property
    def batches(self) -> list[int]:
        return list(self.curves)

    @property
    def max_batch(self) -> int:
        return self.batches[-1]

    @property
    def clocks_mhz(self) -> list[int]:
        """The clocks of the smallest batch's curve (the one every profile has)."""
        return self.curves[self.batches[0]].clocks_mhz

    def curve(self, batch: int = 1) -> Time2ClockTable:
        """The curve of the smallest profiled batch ``>= batch`` (the largest when none is)."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        for b, curve in self.curves.items():
            if b >= batch:
                return curve
        return self.curves[self.max_batch]

    def predict_ms(self, clock_mhz: float, batch: int = 1, quantile: str | None = None) -> float:
        """Predicted time (ms) of one execution of ``batch`` requests at ``clock_mhz``."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        if batch in self.curves:
            return self.curves[batch].predict_ms(clock_mhz, quantile)
        batches = self.batches
        if batch < batches[0]:
            return self.curves[batches[0]].predict_ms(clock_mhz, quantile)
        if batch > batches[-1]:
            hi = batches[-1]
            t_hi = self.curves[hi].predict_ms(clock_mhz, quantile)
            if len(batches) == 1 or math.isinf(t_hi):
                return t_hi * batch / hi
            lo = batches[-2]
            t_lo = self.curves[lo].predict_ms(clock_mhz, quantile)
            slope = max((t_hi - t_lo) / (hi - lo), 0.0) if math.isfinite(t_lo) else 0.0
            return t_hi + slope * (batch - hi)
        hi = next(b for b in batches if b > batch)
        lo = batches[batches.index(hi) - 1]
        t_lo = self.curves[lo].predict_ms(clock_mhz, quantile)
        t_hi = self.curves[hi].predict_ms(clock_mhz, quantile)
        if math.isinf(t_lo) or math.isinf(t_hi):
            return math.inf
        return t_lo + (t_hi - t_lo) * (batch - lo) / (hi - lo)

    def predict_grid_ms(
        self, clocks_mhz: Sequence[float], max_batch: int, quantile: str | None = None
    ) -> npt.NDArray[np.float64]:
        """:meth:`predict_ms` of every batch from 1 to ``max_batch`` (rows) at every clock
        (columns): the same floating-point operations in the same order, so the same values,
        a row at a time instead of one value at a time (a plan needs a few thousand)."""
        x = np.asarray(clocks_mhz, dtype=np.float64)
        own: dict[int, npt.NDArray[np.float64]] = {}
        for b, curve in self.curves.items():
            own[b] = curve.fit_for(quantile).predict_array_ms(x)
        batches = self.batches
        rows = []
        for batch in range(1, max_batch + 1):
            if batch in own:
                rows.append(own[batch])
            elif batch < batches[0]:
                rows.append(own[batches[0]])
            elif batch > batches[-1]:
                hi = batches[-1]
                t_hi = own[hi]
                if len(batches) == 1:
                    rows.append(t_hi * batch / hi)
                    continue
                lo = batches[-2]
                t_lo = own[lo]
                with np.errstate(invalid="ignore"):
                    slope = np.where(
                        np.isfinite(t_lo), np.maximum((t_hi - t_lo) / (hi - lo), 0.0), 0.0
                    )
                    extended = t_hi + slope * (batch - hi)
                rows.append(np.where(np.isinf(t_hi), t_hi * batch / hi, extended))
            else:
                hi = next(b for b in batches if b > batch)
                lo = batches[batches.index(hi) - 1]
                t_lo, t_hi = own[lo], own[hi]
                with np.errstate(invalid="ignore"):
                    between = t_lo + (t_hi - t_lo) * (batch - lo) / (hi - lo)
                rows.append(np.where(np.isinf(t_lo) | np.isinf(t_hi), np.inf, between))
        return np.array(rows, dtype=np.float64).reshape(len(rows), x.size)  # none: 0 rows

    def tail_margin_ms(self, quantile: str, batch: int = 1) -> float:
        """How far the ``quantile`` of one execution lies above the mean fit, for ``batch``."""
        return self.curve(batch).tail_margin_ms(quantile)

    def energy_per_inference_j(self, clock_mhz: float, batch: int = 1) -> float | None:
        """Measured energy per request at the measured clock nearest ``clock_mhz``, if any."""
        return self.energy_per_inference_grid_j([clock_mhz], batch)[0]

    def energy_per_inference_grid_j(
        self, clocks_mhz: Sequence[float], batch: int = 1
    ) -> list[float | None]:
        """:meth:`energy_per_inference_j` at each of ``clocks_mhz``: the measured clock nearest
        each (the lower of two as near; of points at one clock, the first), found by bisection
        over the measured clocks rather than a pass over every point per clock (a plan's energy
        model asks at every clock of the ladder)."""
        first: dict[float, float] = {}
        for p in self.curve(batch).points:
            if p.energy_per_inference_j is not None:
                first.setdefault(p.clock_mhz, p.energy_per_inference_j)
        if not first:
            return [None] * len(clocks_mhz)
        xs = sorted(first)
        out: list[float | None] = []
        for clock in clocks_mhz:
            i = bisect.bisect_left(xs, clock)
            if i == 0 or i == len(xs):
                nearest = xs[min(i, len(xs) - 1)]
            else:
                lo, hi = xs[i - 1], xs[i]
                nearest = lo if clock - lo <= hi - clock else hi
            out.append(first[nearest])
        return out

    def energy_optimal_clock_mhz(self, batch: int = 1) -> int | None:
        """The measured clock with the least energy per request at ``batch``, if measured."""
        return self.curve(batch).energy_optimal_clock_mhz()

    def completion_ms(
        self,
        clock_mhz: float,
        queue: int = 0,
        batch: int = 1,
        concurrency: int | None = None,
        quantile: str | None = None,
    ) -> float:
        """Predicted time until a request with ``queue`` requests ahead of it completes.

        The ``queue + 1`` requests run as executions of ``batch`` (the last one holds what is
        left), ``concurrency`` executions at a time (default: the curve's; 1 for tables
        profiled one execution at a time), each round taking its largest execution's time.
        """
        c = self.curve(batch).concurrency if concurrency is None else concurrency
        if queue < 0 or batch < 1 or c < 1:
            raise ValueError(
                f"queue must be >= 0, batch and concurrency >= 1 (got {queue}, {batch}, {c})"
            )
        requests = queue + 1
        executions = math.ceil(requests / batch)
        rounds = math.ceil(executions / c)
        rest = requests - (executions - 1) * batch  # requests in the last execution
        last_round_alone = executions - (rounds - 1) * c == 1
        last_batch = rest if last_round_alone else batch
        full_ms = self.predict_ms(clock_mhz, batch, quantile) if rounds > 1 else 0.0
        return (rounds - 1) * full_ms + self.predict_ms(clock_mhz, last_batch, quantile)

    def clock_for_queue(
        self,
        slo_ms: float,
        queue: int = 0,
        batch: int = 1,
        concurrency: int | None = None,
        quantile: str | None = None,
    ) -> tuple[int, bool]:
        """Lowest table clock at which :meth:`completion_ms` fits ``slo_ms``; ``(clock, met)``.

        When no clock does, the highest clock and ``False``.
        """
        clocks = self.clocks_mhz
        for clock in clocks:
            if self.completion_ms(clock, queue, batch, concurrency, quantile) <= slo_ms:
                return clock, True
        return clocks[-1], False

    # -- persistence ----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "model": self.model,
            "curves": {str(b): c.curve_json() for b, c in self.curves.items()},
        }

    @classmethod
    def from_json(cls, data: Any) -> ModelTable:
        if not isinstance(data, dict) or not isinstance(data.get("curves"), dict):
            raise TableError("a model's table is a JSON object with gpu, model and curves")
        gpu, model = str(data.get("gpu", "unknown")), str(data.get("model", "unknown"))
        curves: dict[int, Time2ClockTable] = {}
        for key, curve in data["curves"].items():
            try:
                batch = int(key)
            except ValueError:
                raise TableError(f"{model}: curves are keyed by batch size, got {key!r}") from None
            if not isinstance(curve, dict):
                raise TableError(f"{model}: the curve of batch {batch} is not a JSON object")
            try:
                curves[batch] = Time2ClockTable.from_json(
                    {**curve, "gpu": gpu, "model": model, "batch": curve.get("batch", batch)}
                )
            except TableError as err:
                raise TableError(f"{model}, batch {batch}: {err}") from err
        return cls(gpu=gpu, model=model, curves=curves)

    @classmethod
    def single(cls, curve: Time2ClockTable) -> ModelTable:
        """A model table of one curve (a version-1 file, or a hand-made table)."""
        return cls(gpu=curve.gpu, model=curve.model, curves={curve.batch: curve})


class TableSet:
    """The tables of every model behind one GPU; the one owner of tables in the scheduler."""

    def __init__(self, tables: Iterable[ModelTable] = ()) -> None:
        self._tables: dict[str, ModelTable] = {}
        for table in tables:
            self.add(table)

    def get(self, model: str) -> ModelTable | None:
        return self._tables.get(model)

    def add(self, table: ModelTable) -> None:
        """Add ``table``, replacing any table of the same model."""
        others = {t.gpu for name, t in self._tables.items() if name != table.model}
        if others and table.gpu not in others:
            log.warning(
                "the time2clock table of %s was profiled on %s, the others on %s",
                table.model,
                table.gpu,
                ", ".join(sorted(others)),
            )
        self._tables[table.model] = table

    @property
    def models(self) -> list[str]:
        return sorted(self._tables)

    @property
    def gpu(self) -> str:
        """The GPU the tables were profiled on (names joined by ``,`` if they differ)."""
        return ",".join(sorted({t.gpu for t in self._tables.values()}))

    def __len__(self) -> int:
        return len(self._tables)

    def __contains__(self, model: object) -> bool:
        return model in self._tables

    def __iter__(self) -> Iterator[ModelTable]:
        return iter([self._tables[name] for name in self.models])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TableSet) and self._tables == other._tables

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"TableSet(gpu={self.gpu!r}, models={self.models!r})"

    # -- persistence ----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "version": TABLE_FORMAT_VERSION,
            "law": LAW,
            "gpu": self.gpu,
            "models": {t.model: t.to_json() for t in self},
        }

    def save(self, path: Path) -> None:
        """Write every model's table to ``path`` (format version 2)."""
        if not self._tables:
            raise TableError(f"not writing {path}: the table set has no models")
        Path(path).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "the table") -> TableSet:
        """Read a version-2 or version-1 object; ``source`` names it in errors and warnings."""
        version = data.get("version")
        if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
            raise TableError(
                f"{source}: time2clock table format version {version!r} is not supported "
                f"(supported: {', '.join(map(str, SUPPORTED_VERSIONS))}); "
                "re-profile with `python -m time2clock profile`"
            )
        if version == FORMAT_VERSION:
            try:
                curve = Time2ClockTable.from_json(data)
            except TableError as err:
                raise TableError(f"{source} (version 1): {err}") from err
            log.warning(
                "%s is a version-1 time2clock table: one curve of %s, without batch sizes; "
                "it is used as the batch-1 curve. Re-profile with `python -m time2clock profile "
                "--batches 1,2,4,8` for a curve per batch size",
                source,
                curve.model,
            )
            return cls([ModelTable.single(curve)])
        models = data.get("models")
        if not isinstance(models, dict) or not models:
            raise TableError(f"{source} (version 2): no models; expected an object of tables")
        tables = []
        for name, entry in models.items():
            try:
                table = ModelTable.from_json(entry)
            except TableError as err:
                raise TableError(f"{source}: model {name!r}: {err}") from err
            if table.model != name:
                raise TableError(f"{source}: the table filed as {name!r} is of {table.model!r}")
            tables.append(table)
        return cls(tables)

    @classmethod
    def load(cls, path: Path) -> TableSet:
        """Read a table file of any supported version (version 1 with a warning)."""
        return cls.from_json(_read_json(path), source=str(path))

    @classmethod
    def load_many(cls, paths: Iterable[Path]) -> TableSet:
        """Several files into one set; two files with a table of the same model are an error."""
        merged = cls()
        origin: dict[str, Path] = {}
        for path in paths:
            for table in cls.load(path):
                if table.model in origin:
                    raise TableError(
                        f"{path} and {origin[table.model]} both hold a table of {table.model!r}"
                    )
                origin[table.model] = path
                merged.add(table)
        return merged
