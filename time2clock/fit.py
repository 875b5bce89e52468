"""Fit a time2clock table from per-request measurements (seed 003's method).

At each clock, drop the lowest and highest ``trim`` fraction of samples and average the rest;
then fit ``y = 1/(m·x + b)`` by least squares of ``1/y`` on ``x``. The trim is what makes the fit
robust: a few slow outliers (GC pauses, a context switch, a copy that waited) would otherwise pull
``1/y`` down at their clock and bend the line.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from time2clock.table import (
    TAIL_QUANTILES,
    ClockPoint,
    InverseLinearFit,
    ModelTable,
    TableError,
    Time2ClockTable,
)

REQUIRED_COLUMNS = ("clock_mhz", "latency_ms")
OPTIONAL_COLUMNS = ("model", "batch")  # absent: the model named by the caller, batch 1

Samples = dict[int, dict[int, list[float]]]
"""Latencies (ms) of executions: ``samples[batch][clock_mhz]``."""


def read_measurements(path: Path, default_model: str = "unknown") -> dict[str, Samples]:
    """Read a measurements CSV: ``{model: {batch: {clock_mhz: [latency_ms, ...]}}}``.

    The header needs ``clock_mhz`` and ``latency_ms`` (one row per execution); ``batch`` (the
    requests in that execution, default 1) and ``model`` (default ``default_model``) are optional.
    """
    if not Path(path).is_file():
        raise TableError(f"no measurements file at {path}")
    samples: dict[str, Samples] = {}
    with Path(path).open(newline="") as handle:
        reader = csv.DictReader(handle)
        found = list(reader.fieldnames or [])
        missing = [c for c in REQUIRED_COLUMNS if c not in found]
        if missing:
            raise TableError(
                f"{path}: missing column(s) {', '.join(missing)}; the header needs "
                f"{', '.join(REQUIRED_COLUMNS)} (found: {', '.join(found) or 'none'})"
            )
        for line, row in enumerate(reader, start=2):
            try:
                clock = float(row["clock_mhz"])
                latency = float(row["latency_ms"])
            except (TypeError, ValueError):
                raise TableError(
                    f"{path}:{line}: clock_mhz and latency_ms must be numbers, got "
                    f"{row['clock_mhz']!r}, {row['latency_ms']!r}"
                ) from None
            if clock <= 0 or not np.isfinite(clock) or latency <= 0 or not np.isfinite(latency):
                raise TableError(
                    f"{path}:{line}: clock_mhz and latency_ms must be positive and finite"
                )
            batch_text = row.get("batch") or "1"
            if not batch_text.strip().isdigit() or int(batch_text) < 1:
                raise TableError(
                    f"{path}:{line}: batch must be an integer >= 1, got {batch_text!r}"
                )
            model = row.get("model") or default_model
            by_clock = samples.setdefault(model, {}).setdefault(int(batch_text), {})
            by_clock.setdefault(round(clock), []).append(latency)
    return samples


def write_measurements(
    path: Path, samples: Mapping[str, Mapping[int, Mapping[int, Sequence[float]]]]
) -> None:
    """Write ``{model: {batch: {clock_mhz: latencies}}}`` as :func:`read_measurements` reads it."""
    with Path(path).open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow((*OPTIONAL_COLUMNS, *REQUIRED_COLUMNS))
        for model in sorted(samples):
            for batch in sorted(samples[model]):
                by_clock = samples[model][batch]
                for clock in sorted(by_clock):
                    for latency in by_clock[clock]:
                        writer.writerow((model, batch, clock, f"{latency:.6f}"))


def trimmed_mean(values: Sequence[float] | np.ndarray[Any, Any], trim: float) -> float:
    """Mean after dropping ``floor(n·trim)`` samples from each end (at least one sample kept)."""
    if not 0.0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim}")
    data = np.sort(np.asarray(values, dtype=float))
    k = min(int(len(data) * trim), (len(data) - 1) // 2)
    return float(data[k : len(data) - k].mean())


def fit_inverse_linear(
    clocks_mhz: Iterable[float], latency_ms: Iterable[float]
) -> InverseLinearFit:
    """Least squares of ``1/y`` on ``x``; R² is that regression's."""
    x = np.asarray(list(clocks_mhz), dtype=float)
    inv = 1.0 / np.asarray(list(latency_ms), dtype=float)
    if len(np.unique(x)) < 2:
        raise TableError("fitting needs measurements at two or more distinct clocks")
    m, b = np.polyfit(x, inv, 1)
    residual = float(np.sum((inv - (m * x + b)) ** 2))
    total = float(np.sum((inv - inv.mean()) ** 2))
    r2 = 1.0 - residual / total if total > 0 else 1.0
    return InverseLinearFit(m=float(m), b=float(b), r2=r2)


def tail_fits(
    clocks_mhz: Sequence[int], mean_fit: InverseLinearFit, quantiles_ms: Mapping[str, float]
) -> dict[str, InverseLinearFit]:
    """Fits of the p90 and p99 latency, from the spread pooled over every clock.

    Ten or twenty requests at one clock cannot show its p99 (their top sample is nearer p95),
    but a sweep has thousands of requests in all. The spread at one clock is about the same
    across clocks (seed 003 reports one std per GPU), so the residuals around each clock's own
    center are pooled (``quantiles_ms``, from :func:`residual_quantiles`), their quantile added
    to the mean fit at each measured clock, and the law fitted to that.
    """
    clocks = sorted(clocks_mhz)
    return {
        name: fit_inverse_linear(clocks, [mean_fit.predict_ms(c) + shift_ms for c in clocks])
        for name, shift_ms in quantiles_ms.items()
    }


def residual_quantiles(
    samples: Mapping[int, Sequence[float]], trim: float = 0.2
) -> dict[str, float]:
    """Quantiles (ms) of latency minus its clock's own center (the trimmed mean the mean fit
    goes through), pooled over every clock: the spread of one execution.

    Not minus the fit: where the law misses one clock (a profile's lowest, often, where what
    is not the GPU's work weighs most), that clock's error would become the margin at every
    clock (the embedded default's emulated model at its lowest clock is such a case: its p99
    margin came out larger than its executions at the clocks in use). The fit's error is its
    ``r2``'s to report.
    """
    residuals = np.concatenate(
        [
            np.asarray(v, dtype=float) - trimmed_mean(np.asarray(v, dtype=float), trim)
            for v in samples.values()
            if len(v)
        ]
    )
    return {q: float(np.quantile(residuals, int(q[1:]) / 100.0)) for q in TAIL_QUANTILES}


def fit_table(
    samples: Mapping[int, Sequence[float]],
    *,
    trim: float = 0.2,
    gpu: str = "unknown",
    model: str = "unknown",
    concurrency: int = 2,
    energy_j: Mapping[int, float] | None = None,
    batch: int = 1,
) -> Time2ClockTable:
    """Build a :class:`Time2ClockTable` from latencies (ms) grouped by clock (MHz).

    ``batch``: the requests in each measured execution. ``energy_j`` (optional): energy per
    inference (per request, not per execution) measured at each clock, in joules.
    """
    if not 0.0 <= trim < 0.5:
        raise TableError(f"--trim must be in [0, 0.5), got {trim}")
    if concurrency < 1:
        raise TableError(f"concurrency must be >= 1, got {concurrency}")
    if batch < 1:
        raise TableError(f"batch must be >= 1, got {batch}")
    points = []
    for clock in sorted(samples):
        data = np.asarray(samples[clock], dtype=float)
        if data.size == 0:
            continue
        points.append(
            ClockPoint(
                clock_mhz=int(clock),
                n=int(data.size),
                trimmed_mean_ms=trimmed_mean(data, trim),
                p50_ms=float(np.quantile(data, 0.5)),
                p90_ms=float(np.quantile(data, 0.9)),
                p99_ms=float(np.quantile(data, 0.99)),
                std_ms=float(data.std(ddof=1)) if data.size > 1 else 0.0,
                min_ms=float(data.min()),
                max_ms=float(data.max()),
                energy_per_inference_j=None if energy_j is None else energy_j.get(clock),
            )
        )
    clocks = [p.clock_mhz for p in points]
    mean_fit = fit_inverse_linear(clocks, [p.trimmed_mean_ms for p in points])
    quantiles_ms = residual_quantiles(samples, trim)
    return Time2ClockTable(
        gpu=gpu,
        model=model,
        trim=trim,
        concurrency=concurrency,
        mean_fit=mean_fit,
        points=tuple(points),
        tail_fits=tail_fits(clocks, mean_fit, quantiles_ms),
        residual_quantiles_ms=quantiles_ms,
        batch=batch,
    )


def fit_model_table(
    samples: Mapping[int, Mapping[int, Sequence[float]]],
    *,
    trim: float = 0.2,
    gpu: str,
    model: str,
    concurrency: int = 1,
    energy_j: Mapping[int, Mapping[int, float]] | None = None,
) -> ModelTable:
    """Fit one curve per batch size (seed 003's method for each): ``samples[batch][clock]``.

    ``energy_j[batch][clock]`` (optional): energy per request measured there, in joules.
    """
    curves = {}
    for batch in sorted(samples):
        try:
            curves[batch] = fit_table(
                samples[batch],
                trim=trim,
                gpu=gpu,
                model=model,
                concurrency=concurrency,
                energy_j=None if energy_j is None else energy_j.get(batch),
                batch=batch,
            )
        except TableError as err:
            raise TableError(f"{model}, batch {batch}: {err}") from err
    if not curves:
        raise TableError(f"no measurements of {model} to fit")
    return ModelTable(gpu=gpu, model=model, curves=curves)
