"""Metrics of a generative (streaming) run, computed as NVIDIA's aiperf and genai-perf compute
them, plus what they do not report: joules per output token and attainment of each token SLO.

Per request (a :class:`StreamRecord`: when it was sent, when its first and last tokens came,
how many tokens went in and out):

* ``time_to_first_token``: first token − start;
* ``request_latency``: last token − start;
* ``inter_token_latency``: ``(request_latency − time_to_first_token) / (output_sequence_length
  − 1)``, for requests with at least two output tokens (aiperf's and genai-perf's definition;
  it is also the time per output token, TPOT, that token SLOs hold);
* ``output_token_throughput_per_user``: ``1000 / inter_token_latency`` tokens/s;
* ``input_sequence_length``, ``output_sequence_length``.

Over the run: ``benchmark_duration`` (first start to last token), ``request_count``,
``request_throughput`` and ``output_token_throughput`` (per second of that duration),
``total_isl``, ``total_osl``. Statistics: ``avg``, ``min``, ``max``, ``std`` and the
percentiles ``p1 … p99``, with numpy's default (linear) interpolation.

Exports use aiperf's shapes: ``profile_export_aiperf.json`` (one object per metric with its
``unit`` and statistics) and ``profile_export_aiperf.csv`` (a statistics section with the
columns ``Metric,avg,min,max,p1,p5,p10,p25,p50,p75,p90,p95,p99,std``, then a ``Metric,Value``
section). What we add is namespaced so tools that read aiperf's files ignore it:
``energy_per_output_token`` (J/token) and ``slo_attainment`` per SLO.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)
STAT_COLUMNS = ("avg", "min", "max", *(f"p{p}" for p in PERCENTILES), "std")

# (key, display name, unit): aiperf's names for the per-request metrics, in its CSV order.
RECORD_METRICS = (
    ("request_latency", "Request Latency", "ms"),
    ("time_to_first_token", "Time to First Token", "ms"),
    ("inter_token_latency", "Inter Token Latency", "ms"),
    ("output_token_throughput_per_user", "Output Token Throughput Per User", "tokens/sec/user"),
    ("output_sequence_length", "Output Sequence Length", "tokens"),
    ("input_sequence_length", "Input Sequence Length", "tokens"),
)
SUMMARY_METRICS = (
    ("benchmark_duration", "Benchmark Duration", "sec"),
    ("request_throughput", "Request Throughput", "requests/sec"),
    ("request_count", "Request Count", "requests"),
    ("output_token_throughput", "Output Token Throughput", "tokens/sec"),
    ("total_isl", "Total Input Sequence Length", "tokens"),
    ("total_osl", "Total Output Sequence Length", "tokens"),
)
_CSV_UNITS = {"sec": "sec", "requests": "", "tokens": "tokens"}


@dataclass(frozen=True)
class StreamRecord:
    """One streamed request, timed by the client (seconds on one clock)."""

    start_s: float
    first_token_s: float
    end_s: float
    input_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        if not self.start_s <= self.first_token_s <= self.end_s:
            raise ValueError(
                f"need start <= first token <= end, got {self.start_s}, {self.first_token_s}, "
                f"{self.end_s}"
            )
        if self.output_tokens < 1 or self.input_tokens < 0:
            raise ValueError("a stream has >= 1 output token and >= 0 input tokens")

    @property
    def ttft_ms(self) -> float:
        return (self.first_token_s - self.start_s) * 1000.0

    @property
    def latency_ms(self) -> float:
        return (self.end_s - self.start_s) * 1000.0

    @property
    def itl_ms(self) -> float | None:
        """Inter-token latency (= time per output token); None with one output token."""
        if self.output_tokens < 2:
            return None
        return (self.end_s - self.first_token_s) * 1000.0 / (self.output_tokens - 1)


@dataclass(frozen=True)
class TokenSloSpec:
    """The token SLOs attainment is counted against (ms; None: not set)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None


def stats(values: Sequence[float]) -> dict[str, float]:
    """aiperf's statistics of one metric (empty: every statistic nan)."""
    data = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if data.size == 0:
        return {k: math.nan for k in STAT_COLUMNS}
    out = {"avg": float(data.mean()), "min": float(data.min()), "max": float(data.max())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(data, p))
    out["std"] = float(data.std())
    return out


def per_request(records: Sequence[StreamRecord]) -> dict[str, list[float]]:
    """Each per-request metric's values (ITL and per-user throughput only where defined)."""
    itl = [r.itl_ms for r in records]
    return {
        "request_latency": [r.latency_ms for r in records],
        "time_to_first_token": [r.ttft_ms for r in records],
        "inter_token_latency": [v for v in itl if v is not None],
        "output_token_throughput_per_user": [1000.0 / v for v in itl if v is not None and v > 0],
        "output_sequence_length": [float(r.output_tokens) for r in records],
        "input_sequence_length": [float(r.input_tokens) for r in records],
    }


def _within(value_ms: float | None, limit_ms: float) -> bool:
    return value_ms is None or value_ms <= limit_ms


def slo_attainment(records: Sequence[StreamRecord], slo: TokenSloSpec) -> dict[str, float]:
    """Share of requests within each token SLO set, and within all of them (``both``).

    A request with one output token has no TPOT and counts as within the TPOT SLO.
    """
    if not records:
        return {}
    out: dict[str, float] = {}
    ok_all = np.ones(len(records), dtype=bool)
    if slo.ttft_ms is not None:
        ok = np.asarray([r.ttft_ms <= slo.ttft_ms for r in records])
        out["ttft"] = float(ok.mean())
        ok_all &= ok
    if slo.tpot_ms is not None:
        limit = slo.tpot_ms
        ok = np.asarray([_within(r.itl_ms, limit) for r in records])
        out["tpot"] = float(ok.mean())
        ok_all &= ok
    if out:
        out["both"] = float(ok_all.mean())
    return out


def summarize(
    records: Sequence[StreamRecord],
    *,
    energy_j: float | None = None,
    slo: TokenSloSpec | None = None,
) -> dict[str, Any]:
    """The run's report as ``profile_export_aiperf.json`` holds it, plus our additions."""
    out: dict[str, Any] = {}
    values = per_request(records)
    for key, _, unit in RECORD_METRICS:
        out[key] = {"unit": unit, **stats(values[key])}
    duration_s = max(r.end_s for r in records) - min(r.start_s for r in records) if records else 0.0
    total_osl = sum(r.output_tokens for r in records)
    total_isl = sum(r.input_tokens for r in records)
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: math.nan)
    summary = {
        "benchmark_duration": duration_s,
        "request_throughput": per_s(len(records)),
        "request_count": float(len(records)),
        "output_token_throughput": per_s(total_osl),
        "total_isl": float(total_isl),
        "total_osl": float(total_osl),
    }
    for key, _, unit in SUMMARY_METRICS:
        out[key] = {"unit": unit, "avg": summary[key]}
    if energy_j is not None:
        out["energy_per_output_token"] = {
            "unit": "J/token",
            "avg": energy_j / total_osl if total_osl else math.nan,
        }
        out["energy"] = {"unit": "J", "avg": energy_j}
    if slo is not None:
        out["slo_attainment"] = {
            "unit": "fraction",
            "ttft_ms": slo.ttft_ms,
            "tpot_ms": slo.tpot_ms,
            **slo_attainment(records, slo),
        }
    return out


def _finite(value: Any) -> Any:
    """nan/inf as null, as JSON needs."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def write_json(report: Mapping[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(dict(report)), indent=2) + "\n")
    return path


def _display(name: str, unit: str) -> str:
    shown = _CSV_UNITS.get(unit, unit)
    return f"{name} ({shown})" if shown else name


def csv_rows(report: Mapping[str, Any]) -> Iterable[list[str]]:
    """The rows of ``profile_export_aiperf.csv``: statistics, a blank line, summary values."""
    yield ["Metric", *STAT_COLUMNS]
    for key, name, unit in RECORD_METRICS:
        entry = report.get(key)
        if entry is not None:
            yield [_display(name, unit), *(f"{entry[c]:.2f}" for c in STAT_COLUMNS)]
    yield []
    yield ["Metric", "Value"]
    for key, name, unit in SUMMARY_METRICS:
        entry = report.get(key)
        if entry is not None:
            yield [_display(name, unit), f"{entry['avg']:.2f}"]
    if "energy_per_output_token" in report:
        joules = report["energy_per_output_token"]["avg"]
        yield ["Energy Per Output Token (J/token)", f"{joules:.4f}"]
    att = report.get("slo_attainment")
    if att:
        for key in ("ttft", "tpot", "both"):
            if key in att:
                yield [f"SLO Attainment {key.upper()} (fraction)", f"{att[key]:.4f}"]


def write_csv(report: Mapping[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        for row in csv_rows(report):
            writer.writerow(row)
    return path
