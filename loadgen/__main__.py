"""``python -m loadgen -m MODEL -u HOST:PORT``: perf_analyzer's options and CSV, plus joules per
inference, the GPU clock and SLO attainment per client class.

``python -m loadgen generative -m MODEL -u HOST:PORT``: streamed load on a generative model,
measured as aiperf measures it (see :mod:`loadgen.genai`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from dvfs.__main__ import PIPE_WIDTH
from loadgen.classes import RequestClass, parse_mix
from loadgen.engine import Recorder, Target, build_payloads, new_session
from loadgen.grpc_client import CLIENTS as GRPC_CLIENTS
from loadgen.grpc_client import GrpcClient, UnreachableError, grpc_payloads
from loadgen.inputs import InputError, build_inputs, parse_shapes
from loadgen.measure import Load, MeasureOptions, StepResult, measure_step
from loadgen.report import console_lines, write_csv


def parse_range(text: str, kind: type = float) -> list[float]:
    """perf_analyzer's ``start[:end[:step]]``, both ends included."""
    parts = text.split(":")
    try:
        values = [kind(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected start[:end[:step]], got {text!r}") from None
    if len(values) > 3 or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive start[:end[:step]], got {text!r}")
    start = values[0]
    end = values[1] if len(values) > 1 else start
    step = values[2] if len(values) > 2 else 1
    if end < start:
        raise argparse.ArgumentTypeError(f"the range {text!r} ends before it starts")
    out, v = [], start
    while v <= end + 1e-9:
        out.append(v)
        v += step
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadgen", description=__doc__)
    p.add_argument("-m", "--model-name", dest="model", required=True)
    p.add_argument("-x", "--model-version", dest="version", default=None)
    p.add_argument(
        "-u", "--url", default="localhost:8000", help="server host:port (localhost:8000)"
    )
    p.add_argument("-i", "--protocol", default="http", choices=("http", "grpc"), help="(http)")
    p.add_argument(
        "--grpc-client",
        default=GRPC_CLIENTS[0],
        choices=GRPC_CLIENTS,
        help="with -i grpc: the sidecar's own HTTP/2 channel, or grpc.aio's (h2)",
    )
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency-range", type=lambda t: parse_range(t, int), default=None)
    load.add_argument("--request-rate-range", type=parse_range, default=None)
    load.add_argument(
        "--request-intervals",
        type=Path,
        default=None,
        help="file of intervals between requests, in µs, one per line (looped)",
    )
    p.add_argument("--request-distribution", choices=("constant", "poisson"), default="constant")
    p.add_argument("-p", "--measurement-interval", type=float, default=5000.0, help="ms (5000)")
    p.add_argument(
        "--measurement-mode", choices=("time_windows", "count_windows"), default="time_windows"
    )
    p.add_argument("--measurement-request-count", type=int, default=50)
    p.add_argument("-s", "--stability-percentage", type=float, default=10.0)
    p.add_argument("-r", "--max-trials", type=int, default=10)
    p.add_argument(
        "--percentile", type=int, default=None, help="stabilise on this latency percentile"
    )
    p.add_argument(
        "--shape", action="append", default=[], help="NAME:DIMS (no batch dim), repeatable"
    )
    p.add_argument("-b", "--batch-size", type=int, default=1)
    p.add_argument("--input-data", default="random", help="zero, random or a JSON file")
    p.add_argument("-f", "--latency-report-file", type=Path, default=None, help="CSV to write")
    p.add_argument("--verbose-csv", action="store_true")
    p.add_argument(
        "--collect-metrics",
        action="store_true",
        help="read energy and clock from the server's Prometheus metrics",
    )
    p.add_argument("--metrics-url", default=None, help="default: http://<url>/metrics (HTTP only)")
    p.add_argument("--slo-ms", type=float, default=None)
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--nice", type=int, default=None)
    p.add_argument("--client-id", default="loadgen")
    p.add_argument(
        "--mix",
        default=None,
        help='client classes: "a:share=0.5,priority=1,slo_ms=30;b:share=0.5,nice=5"',
    )
    p.add_argument("--seed", type=int, default=0, help="for random data, Poisson gaps and the mix")
    # The generative mode is a command of its own; the usage names it first.
    own = p.format_usage().removeprefix("usage: ").replace("%", "%%")
    p.usage = f"%(prog)s {{generative}} ...   (see: %(prog)s generative --help)\n       {own}"
    return p


def _gaps(args: argparse.Namespace, rate: float, rng: np.random.Generator) -> Callable[[], float]:
    if args.request_intervals is not None:
        cycle = itertools.cycle(_intervals(args.request_intervals))
        return lambda: next(cycle)
    if args.request_distribution == "poisson":
        return lambda: float(rng.exponential(1.0 / rate))
    return lambda: 1.0 / rate


def _intervals(path: Path) -> list[float]:
    try:
        values = [float(line) / 1e6 for line in path.read_text().split() if line.strip()]
    except FileNotFoundError:
        raise InputError(f"--request-intervals {path}: no such file") from None
    except ValueError:
        raise InputError(f"--request-intervals {path}: every line must be a number of µs") from None
    if not values or any(v < 0 for v in values):
        raise InputError(f"--request-intervals {path}: needs non-negative intervals")
    return values


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        if resp.status != 200:
            raise InputError(f"{url}: HTTP {resp.status}: {await resp.text()}")
        return await resp.json()


async def run(args: argparse.Namespace, console: Console) -> list[StepResult]:
    rng = np.random.default_rng(args.seed)
    classes: Sequence[RequestClass]
    if args.mix:
        classes = parse_mix(args.mix, args.slo_ms)
    else:
        classes = [RequestClass(args.client_id, 1.0, args.priority, args.nice, args.slo_ms)]
    metrics_url = None
    if args.collect_metrics or args.metrics_url:
        if args.protocol == "grpc" and not args.metrics_url:
            raise InputError("with -i grpc, --collect-metrics needs --metrics-url (HTTP /metrics)")
        metrics_url = args.metrics_url or f"http://{args.url}/metrics"
    opts = MeasureOptions(
        args.measurement_interval,
        args.measurement_mode,
        args.measurement_request_count,
        args.stability_percentage,
        args.max_trials,
        args.percentile,
        metrics_url,
    )
    per_class = [c.concurrency for c in classes if c.concurrency is not None]
    if per_class and (args.request_rate_range or args.request_intervals):
        raise InputError("--mix with concurrency= runs closed loops: leave out the request rate")
    if per_class and args.concurrency_range:
        raise InputError("--mix with concurrency= sets each class's: leave out --concurrency-range")
    if per_class:
        mode, values = "concurrency", [float(sum(per_class))]
    elif args.request_intervals is not None:
        mode, values = "rate", [1.0 / float(np.mean(_intervals(args.request_intervals)))]
    elif args.request_rate_range is not None:
        mode, values = "rate", args.request_rate_range
    else:
        mode, values = "concurrency", args.concurrency_range or [1]
    steps: list[StepResult] = []
    async with new_session() as session, contextlib.AsyncExitStack() as stack:
        via_grpc = None
        if args.protocol == "grpc":
            via_grpc = await stack.enter_async_context(GrpcClient(args.url, args.grpc_client))
            metadata = await via_grpc.metadata(args.model, args.version)
            config = await via_grpc.config(args.model, args.version)
        else:
            base = f"http://{args.url}/v2/models/{args.model}"
            if args.version:
                base += f"/versions/{args.version}"
            metadata = await _get_json(session, base)
            config = await _get_json(session, f"{base}/config")
        inputs = build_inputs(
            metadata,
            config,
            batch_size=args.batch_size,
            shapes=parse_shapes(args.shape),
            input_data=args.input_data,
            rng=rng,
        )
        if via_grpc is not None:
            payloads = grpc_payloads(classes, inputs, args.model, args.version)
        else:
            payloads = build_payloads(classes, inputs=inputs)
        target = Target(
            args.url, args.model, payloads, [c.share for c in classes], args.version, via_grpc
        )
        columns = (
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("steps", total=len(values), status="")
            for i, value in enumerate(values):
                label = f"concurrency {value:g}" if mode == "concurrency" else f"{value:g} req/s"
                bar.update(
                    task, description=f"step {i + 1}/{len(values)} ({label})", status="trial 1"
                )
                rec = Recorder()
                load = Load(session, target, rng, rec)
                if mode == "concurrency":
                    load.closed(int(value), per_class or None)
                else:
                    load.open(_gaps(args, value, rng))
                try:
                    step = await measure_step(
                        session,
                        target,
                        load,
                        rec,
                        opts,
                        value,
                        lambda trial, ok: bar.update(
                            task, status=f"trial {trial}/{opts.max_trials}{' stable' if ok else ''}"
                        ),
                    )
                finally:
                    await load.stop()
                steps.append(step)
                bar.update(task, completed=i + 1)
                for line in console_lines(step, mode, args.batch_size, classes):
                    bar.console.print(line, markup=False, highlight=False)
    if args.latency_report_file:
        write_csv(args.latency_report_file, mode, args.verbose_csv, steps, args.batch_size, classes)
        console.print(f"wrote {args.latency_report_file}")
    _summary(console, steps, mode, args.batch_size)
    return steps


def _summary(console: Console, steps: Sequence[StepResult], mode: str, batch: int) -> None:
    what = "Concurrency" if mode == "concurrency" else "Request Rate"
    console.print("Inferences/Second vs. Client Average Batch Latency", markup=False)
    for s in steps:
        lat = float(np.mean([x.latency_s * 1e6 for x in s.ok])) if s.ok else float("nan")
        console.print(
            f"{what}: {s.value:g}, throughput: {s.throughput * batch:.2f} infer/sec, "
            f"latency {lat:.0f} usec",
            markup=False,
            highlight=False,
        )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["generative"]:
        from loadgen.genai import main as generative

        return generative(argv[1:])
    args = build_parser().parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)
    for name, value in (
        ("-p", args.measurement_interval),
        ("-s", args.stability_percentage),
        ("-r", args.max_trials),
        ("--measurement-request-count", args.measurement_request_count),
    ):
        if value <= 0:
            print(f"error: {name} must be > 0, got {value}", file=sys.stderr)
            return 2
    if args.percentile is not None and not 1 <= args.percentile <= 99:
        print(f"error: --percentile must be in 1..99, got {args.percentile}", file=sys.stderr)
        return 2
    try:
        asyncio.run(run(args, console))
    except (InputError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except aiohttp.ClientConnectionError as err:
        print(f"error: cannot reach {args.url}: {err}", file=sys.stderr)
        return 3
    except UnreachableError as err:
        print(f"error: cannot reach {err}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
