"""``python -m loadgen generative -m MODEL -u HOST:PORT``: streamed load on a generative model,
measured as NVIDIA's aiperf measures it (same option names where it has them, same metrics,
same export files), plus joules per output token and attainment of each token SLO."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dvfs.__main__ import PIPE_WIDTH
from loadgen.generative import (
    RECORD_METRICS,
    SUMMARY_METRICS,
    TokenSloSpec,
    write_csv,
    write_json,
)
from loadgen.genrun import ARRIVALS, GenLoad, GenRun, run_generative
from loadgen.stream import ALIASES, ENDPOINTS, GenTarget, endpoint_name
from loadgen.synthetic import LengthSpec, RequestSource

JSON_EXPORT = "profile_export_aiperf.json"
CSV_EXPORT = "profile_export_aiperf.csv"
RECORDS_EXPORT = "records.jsonl"
CONSOLE_STATS = ("avg", "min", "max", "p99", "p90", "p50", "std")


def base_url(url: str) -> str:
    """``host:port`` or a full URL, as ``http://host:port`` (no trailing slash)."""
    url = url.rstrip("/")
    return url if "://" in url else f"http://{url}"


def extra_input(text: str) -> tuple[str, Any]:
    """aiperf's ``--extra-inputs KEY:VALUE`` (the value read as JSON when it parses)."""
    key, sep, value = text.partition(":")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY:VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadgen generative", description=__doc__)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-u", "--url", default="localhost:8000", help="server (localhost:8000)")
    p.add_argument(
        "--endpoint-type",
        type=endpoint_name,
        default=ENDPOINTS[0],
        help=f"{', '.join(ENDPOINTS)} (also {', '.join(ALIASES)}); default {ENDPOINTS[0]}",
    )
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, default=None, help="closed loop (default 1)")
    load.add_argument("--request-rate", type=float, default=None, help="open loop, requests/s")
    p.add_argument("--arrival-pattern", choices=ARRIVALS, default="poisson", help="(poisson)")
    p.add_argument("--request-count", type=int, default=None, help="requests to send (10)")
    p.add_argument(
        "--benchmark-duration", type=float, default=None, help="seconds to send for, instead"
    )
    p.add_argument("--warmup-request-count", type=int, default=0)
    p.add_argument("--synthetic-input-tokens-mean", type=int, default=550)
    p.add_argument("--synthetic-input-tokens-stddev", type=float, default=0.0)
    p.add_argument(
        "--output-tokens-mean", type=int, default=None, help="max_tokens (default: the server's)"
    )
    p.add_argument("--output-tokens-stddev", type=float, default=0.0)
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument(
        "--extra-inputs",
        type=extra_input,
        action="append",
        default=[],
        help="KEY:VALUE added to every request body (e.g. ignore_eos:true), repeatable",
    )
    p.add_argument("--ttft-ms", type=float, default=None, help="token SLO: time to first token")
    p.add_argument("--tpot-ms", type=float, default=None, help="token SLO: time per output token")
    p.add_argument("--priority", type=int, default=None)
    p.add_argument("--nice", type=int, default=None)
    p.add_argument("--client-id", default="loadgen")
    p.add_argument(
        "--collect-metrics",
        action="store_true",
        help="read the GPU's energy from the server's Prometheus metrics: joules per token",
    )
    p.add_argument("--metrics-url", default=None, help="default: <url>/metrics")
    p.add_argument(
        "--artifact-dir",
        type=Path,
        default=None,
        help="where the exports go (artifacts/<model>-<endpoint>-<load>)",
    )
    p.add_argument("--request-timeout-seconds", type=float, default=600.0)
    return p


def hints_of(args: argparse.Namespace) -> dict[str, object]:
    """The scheduling hints every request carries (the token SLOs included: the sidecar holds
    them and counts attainment too)."""
    hints: dict[str, object] = {"client_id": args.client_id}
    for key in ("priority", "nice", "ttft_ms", "tpot_ms"):
        value = getattr(args, key)
        if value is not None:
            hints[key] = value
    return hints


def _cell(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "N/A"
    return f"{value:,.0f}" if unit in ("tokens", "requests") else f"{value:,.2f}"


def console_table(report: Mapping[str, Any], title: str) -> Table:
    """aiperf's console table: per-request metrics with statistics, then the run's figures."""
    table = Table(title=title)
    table.add_column("Metric", justify="right")
    for stat in CONSOLE_STATS:
        table.add_column(stat, justify="right")
    for key, name, unit in RECORD_METRICS:
        entry = report.get(key)
        if entry is not None:
            table.add_row(f"{name} ({unit})", *(_cell(entry[s], unit) for s in CONSOLE_STATS))
    blank = ["N/A"] * (len(CONSOLE_STATS) - 1)
    for key, name, unit in SUMMARY_METRICS:
        if key in ("output_token_throughput", "request_throughput", "request_count"):
            table.add_row(f"{name} ({unit})", _cell(report[key]["avg"], unit), *blank)
    errors = report.get("error_request_count", {}).get("avg", 0.0)
    table.add_row("Error Request Count (requests)", f"{errors:.0f}", *blank)
    joules = report.get("energy_per_output_token")
    if joules is not None:
        table.add_row("Energy Per Output Token (J/token)", f"{joules['avg']:.4f}", *blank)
    att = report.get("slo_attainment")
    if att:
        for key, limit in (("ttft", att.get("ttft_ms")), ("tpot", att.get("tpot_ms"))):
            if key in att:
                table.add_row(
                    f"SLO Attainment {key.upper()} ≤ {limit:g} ms", f"{att[key]:.1%}", *blank
                )
        if "both" in att:
            table.add_row("SLO Attainment (both)", f"{att['both']:.1%}", *blank)
    return table


def write_records(run: GenRun, path: Path) -> Path:
    """One line per request: its times from the run's first send (ms), lengths and error."""
    t0 = min((s.start_s for s in run.streams), default=0.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for s in sorted(run.streams, key=lambda s: s.start_s):
            line: dict[str, Any] = {
                "start_ms": round((s.start_s - t0) * 1000, 3),
                "input_sequence_length": s.input_tokens,
                "output_sequence_length": len(s.token_times_s),
                "token_times_ms": [round((t - s.start_s) * 1000, 3) for t in s.token_times_s],
                "error": s.error,
            }
            handle.write(json.dumps(line) + "\n")
    return path


def exports(run: GenRun, report: Mapping[str, Any], folder: Path) -> list[Path]:
    return [
        write_json(report, folder / JSON_EXPORT),
        write_csv(report, folder / CSV_EXPORT),
        write_records(run, folder / RECORDS_EXPORT),
    ]


def settings_of(args: argparse.Namespace) -> tuple[GenTarget, RequestSource, GenLoad]:
    """The run the options describe (ValueError names a bad one)."""
    url = base_url(args.url)
    target = GenTarget(url, args.endpoint_type, args.model, hints_of(args), dict(args.extra_inputs))
    output = None
    if args.output_tokens_mean is not None:
        output = LengthSpec(args.output_tokens_mean, args.output_tokens_stddev)
    source = RequestSource(
        LengthSpec(args.synthetic_input_tokens_mean, args.synthetic_input_tokens_stddev),
        output,
        seed=args.random_seed,
    )
    count = args.request_count
    if count is None and args.benchmark_duration is None:
        count = 10
    load = GenLoad(
        concurrency=args.concurrency if args.request_rate is None else None,
        request_rate=args.request_rate,
        arrival=args.arrival_pattern,
        request_count=count,
        duration_s=args.benchmark_duration,
        warmup_count=args.warmup_request_count,
        seed=args.random_seed,
    )
    return target, source, load


async def _run(
    args: argparse.Namespace, target: GenTarget, source: RequestSource, load: GenLoad,
    console: Console,
) -> GenRun:  # fmt: skip
    metrics_url = None
    if args.collect_metrics or args.metrics_url:
        metrics_url = args.metrics_url or f"{target.base_url}/metrics"
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(f"{load.label} requests", total=load.request_count)
        return await run_generative(
            target,
            source,
            load,
            metrics_url=metrics_url,
            timeout_s=args.request_timeout_seconds,
            on_done=lambda n: bar.update(task, completed=n),
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)
    try:
        target, source, load = settings_of(args)
        slo = TokenSloSpec(args.ttft_ms, args.tpot_ms)
        run = asyncio.run(_run(args, target, source, load, console))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except aiohttp.ClientError as err:
        print(f"error: cannot read {args.url}'s metrics: {err}", file=sys.stderr)
        return 3
    if not run.records:
        first = run.errors[0] if run.errors else "no request was sent"
        print(f"error: no request succeeded ({len(run.errors)} failed; first: {first})",
              file=sys.stderr)  # fmt: skip
        return 3
    report = run.report(slo if slo.ttft_ms or slo.tpot_ms else None)
    title = f"LLM Metrics: {args.model} via {target.endpoint}, {load.label}"
    console.print(console_table(report, title))
    if run.errors:
        console.print(f"{len(run.errors)} requests failed; first: {run.errors[0]}", markup=False)
    folder = args.artifact_dir or Path("artifacts") / f"{args.model}-{target.endpoint}-{load.label}"
    for path in exports(run, report, folder):
        console.print(f"wrote {path}", markup=False, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
