"""Reports: perf_analyzer's CSV (same columns, names, order and units) and its console summary,
plus what perf_analyzer cannot tell: energy per inference, the GPU clock, SLO attainment."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from loadgen.classes import RequestClass
from loadgen.measure import StepResult
from scheduler.isolation import ClientUsage, IsolationReport, isolation

PERF_ANALYZER_COLUMNS = (
    "Inferences/Second",
    "Client Send",
    "Network+Server Send/Recv",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "Client Recv",
    "p50 latency",
    "p90 latency",
    "p95 latency",
    "p99 latency",
)
SERVER_COLUMNS = (
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
)
VERBOSE_COLUMNS = ("Avg latency", "request/response", "response wait")
OUR_COLUMNS = (
    "Energy per Inference (J)",
    "Avg GPU Clock (MHz)",
    "SLO Attainment",
    "Rejected Requests",
)


def header(mode: str, verbose: bool) -> list[str]:
    first = "Concurrency" if mode == "concurrency" else "Request Rate"
    return [first, *PERF_ANALYZER_COLUMNS, *(VERBOSE_COLUMNS if verbose else ()), *OUR_COLUMNS]


def _mean_us(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) * 1e6 if finite else 0.0


def row_values(
    step: StepResult, batch_size: int, classes: Sequence[RequestClass]
) -> dict[str, float]:
    """Every column's number for one step (times in µs, as perf_analyzer writes them)."""
    ok = step.ok
    lat_us = np.asarray([s.latency_s * 1e6 for s in ok]) if ok else np.asarray([math.nan])
    send_us = _mean_us([s.sent_s - s.start_s for s in ok])
    recv_us = _mean_us([s.end_s - s.headers_s for s in ok])
    count = step.server_delta("success_count") or 1.0
    server = {
        key: step.server_delta(f"{key}_ns") / count / 1000.0
        for key in ("queue", "compute_input", "compute_infer", "compute_output")
    }
    avg = float(np.mean(lat_us))
    network = max(0.0, avg - send_us - recv_us - sum(server.values()))
    met = 0
    for s in ok:
        slo = classes[s.klass].slo_ms
        met += slo is None or s.latency_s * 1000.0 <= slo
    energy = step.energy_j
    inferences = len(ok) * batch_size
    return {
        "Inferences/Second": step.throughput * batch_size,
        "Client Send": send_us,
        "Network+Server Send/Recv": network,
        "Server Queue": server["queue"],
        "Server Compute Input": server["compute_input"],
        "Server Compute Infer": server["compute_infer"],
        "Server Compute Output": server["compute_output"],
        "Client Recv": recv_us,
        "p50 latency": float(np.percentile(lat_us, 50)),
        "p90 latency": float(np.percentile(lat_us, 90)),
        "p95 latency": float(np.percentile(lat_us, 95)),
        "p99 latency": float(np.percentile(lat_us, 99)),
        "Avg latency": avg,
        "request/response": send_us + recv_us,
        "response wait": avg - send_us - recv_us,
        "Energy per Inference (J)": energy / inferences
        if energy is not None and inferences
        else math.nan,
        "Avg GPU Clock (MHz)": step.clock_mhz if step.clock_mhz is not None else math.nan,
        "SLO Attainment": met / len(ok) if ok else math.nan,
        "Rejected Requests": float(sum(1 for s in step.samples if s.status == 429)),
    }


def write_csv(
    path: Path,
    mode: str,
    verbose: bool,
    steps: Sequence[StepResult],
    batch_size: int,
    classes: Sequence[RequestClass],
) -> None:
    cols = header(mode, verbose)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(cols)
        for step in steps:
            values = row_values(step, batch_size, classes)
            row: list[str] = [f"{step.value:g}"]
            for col in cols[1:]:
                v = values[col]
                if col in ("Energy per Inference (J)", "SLO Attainment"):
                    row.append("" if math.isnan(v) else f"{v:.4f}")
                elif col == "Avg GPU Clock (MHz)" or col == "Inferences/Second":
                    row.append("" if math.isnan(v) else f"{v:.2f}")
                else:
                    row.append(f"{round(v)}")
            writer.writerow(row)


def console_lines(
    step: StepResult, mode: str, batch_size: int, classes: Sequence[RequestClass]
) -> list[str]:
    """perf_analyzer's per-step report, then our extras."""
    v = row_values(step, batch_size, classes)
    ok = step.ok
    lat = [s.latency_s * 1e6 for s in ok]
    std = float(np.std(lat)) if lat else math.nan
    server_us = sum(v[k] for k in SERVER_COLUMNS)
    what = (
        f"Request concurrency: {step.value:g}"
        if mode == "concurrency"
        else f"Request Rate: {step.value:g} inference requests per seconds"
    )
    lines = [
        what,
        "  Client: ",
        f"    Request count: {len(ok)}",
        f"    Throughput: {v['Inferences/Second']:.2f} infer/sec",
    ]
    if mode == "rate":
        lines.append(f"    Sent: {step.achieved_rps:.2f} requests/sec (asked {step.value:g})")
    lines += [
        f"    Avg latency: {v['Avg latency']:.0f} usec (standard deviation {std:.0f} usec)",
        f"    p50 latency: {v['p50 latency']:.0f} usec",
        f"    p90 latency: {v['p90 latency']:.0f} usec",
        f"    p95 latency: {v['p95 latency']:.0f} usec",
        f"    p99 latency: {v['p99 latency']:.0f} usec",
        f"    Avg HTTP time: {v['Avg latency']:.0f} usec (send {v['Client Send']:.0f} usec"
        f" + response wait {v['response wait']:.0f} usec + receive {v['Client Recv']:.0f} usec)",
        "  Server: ",
        f"    Inference count: {step.server_delta('inference_count'):.0f}",
        f"    Successful request count: {step.server_delta('success_count'):.0f}",
        f"    Avg request latency: {server_us:.0f} usec (queue {v['Server Queue']:.0f} usec"
        f" + compute input {v['Server Compute Input']:.0f} usec"
        f" + compute infer {v['Server Compute Infer']:.0f} usec"
        f" + compute output {v['Server Compute Output']:.0f} usec)",
        "  Energy and SLO: ",
        f"    Energy per inference: {_fmt(v['Energy per Inference (J)'], '.4f', ' J')}",
        f"    Avg GPU clock: {_fmt(v['Avg GPU Clock (MHz)'], '.0f', ' MHz')}",
        f"    SLO attainment: {_fmt(v['SLO Attainment'] * 100, '.2f', '%')}",
        f"    Rejected (429): {v['Rejected Requests']:.0f}",
    ]
    if not step.stable:
        lines.append(f"  Warning: not stable after {step.trials} windows; the last 3 are reported")
    gpus = sorted({s.gpu for s in ok if s.gpu is not None}, key=lambda g: (len(g), g))
    if len(gpus) > 1:
        lines.append("  Per GPU (as the sidecar says): ")
        for gpu in gpus:
            mine = [s for s in ok if s.gpu == gpu]
            p99 = float(np.percentile([s.latency_s * 1e6 for s in mine], 99))
            lines.append(
                f"    GPU {gpu}: {len(mine)} requests ({len(mine) / len(ok):.1%}), "
                f"{len(mine) / step.duration_s:.1f}/sec, p99 {p99:.0f} usec"
            )
    if len(classes) > 1:
        iso = class_isolation(step, classes)
        lines.append(
            "  Per class (DCT/ideal: completion time over ideal CFS's, seed 000's isolation; "
            f"worst pair {_fmt(iso.deviation * 100, '.1f', '%')} from ideal): "
        )
        for i, c in enumerate(classes):
            mine = [s for s in ok if s.klass == i]
            if not mine:
                lines.append(f"    {c.name}: no completed requests")
                continue
            p99 = float(np.percentile([s.latency_s * 1e6 for s in mine], 99))
            met = sum(c.slo_ms is None or s.latency_s * 1000 <= c.slo_ms for s in mine) / len(mine)
            rate = len(mine) / step.duration_s
            lines.append(
                f"    {c.name}: {len(mine)} requests, {rate:.1f}/sec, p99 {p99:.0f} usec, "
                f"SLO met {met:.2%}, DCT/ideal {_fmt(iso.ratio_of(c.name), '.3f', '')}"
            )
    return lines


def class_isolation(step: StepResult, classes: Sequence[RequestClass]) -> IsolationReport:
    """Seed 000's isolation metric over a mix (:mod:`scheduler.isolation`): each class's
    completions in the step against ideal CFS's split of them by nice, classes grouped by the
    ``priority`` they send. A class with its own closed loop (``concurrency=``) asks for more
    than it can get; any other asks for its share of what was sent."""
    sent = sum(w.sent for w in step.windows)
    served = [0] * len(classes)
    for s in step.ok:
        served[s.klass] += 1
    return isolation(
        [
            ClientUsage(
                c.name,
                c.priority,
                c.nice or 0,
                float(served[i]),
                None if c.concurrency is not None else c.share * sent,
            )
            for i, c in enumerate(classes)
        ]
    )


def _fmt(value: float, spec: str, unit: str) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:{spec}}{unit}"
