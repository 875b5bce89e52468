"""``python -m time2clock fit | clock | profile | profile-engine | plot``: measure, fit, choose a
clock."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table

from dvfs.__main__ import PIPE_WIDTH
from dvfs.errors import DeviceError
from time2clock.engine import EngineSweepSettings
from time2clock.fit import Samples, fit_model_table, read_measurements, write_measurements
from time2clock.profile import MeasureError
from time2clock.table import ModelTable, TableError, TableSet

DEFAULT_BATCHES = (1, 2, 4, 8)


def _print_table(console: Console, table: ModelTable) -> None:
    view = Table(
        title=f"time2clock {table.model} on {table.gpu}: y = host + 1/(m·x + b) per batch size"
    )
    for col in (
        "batch",
        "m",
        "b",
        "host ms",
        "R²",
        "clocks",
        "ms at lowest",
        "ms at top",
        "p99 margin ms",
        "least J/inference",
        "at MHz",
    ):
        view.add_column(col, justify="right")
    for batch, curve in table.curves.items():
        lo, hi = curve.clocks_mhz[0], curve.clocks_mhz[-1]
        best = curve.energy_optimal_clock_mhz()
        energy = None if best is None else table.energy_per_inference_j(best, batch)
        view.add_row(
            str(batch),
            f"{curve.m:.4g}",
            f"{curve.b:.4g}",
            f"{curve.mean_fit.host_ms:.2f}",
            f"{curve.r2:.4f}",
            f"{len(curve.points)} ({lo}-{hi})",
            f"{curve.predict_ms(lo):.2f}",
            f"{curve.predict_ms(hi):.2f}",
            f"{curve.tail_margin_ms('p99'):.2f}" if "p99" in curve.tail_fits else "-",
            "-" if energy is None else f"{energy:.4f}",
            "-" if best is None else str(best),
        )
    console.print(view)


def _pick_model(tables: TableSet, model: str | None, path: Path) -> ModelTable:
    """The table of ``model``, or the only one when ``model`` is None."""
    if model is None:
        if len(tables) == 1:
            return next(iter(tables))
        raise TableError(
            f"{path} holds tables of {', '.join(tables.models)}: pick one with --model"
        )
    table = tables.get(model)
    if table is None:
        raise TableError(f"{path} has no table of {model!r}; it has: {', '.join(tables.models)}")
    return table


def _cmd_fit(args: argparse.Namespace, console: Console) -> int:
    measured = read_measurements(args.measurements, default_model=args.model or "unknown")
    if args.model is not None:
        if args.model not in measured:
            raise TableError(
                f"{args.measurements} has no measurements of {args.model!r}; "
                f"it has: {', '.join(sorted(measured))}"
            )
        measured = {args.model: measured[args.model]}
    tables = TableSet(
        fit_model_table(
            samples, trim=args.trim, gpu=args.gpu, model=model, concurrency=args.concurrency
        )
        for model, samples in measured.items()
    )
    tables.save(args.output)
    for table in tables:
        _print_table(console, table)
    console.print(f"wrote {args.output}")
    return 0


def _cmd_clock(args: argparse.Namespace, console: Console) -> int:
    if args.slo_ms <= 0:
        raise TableError(f"--slo-ms must be > 0, got {args.slo_ms}")
    if args.batch < 1 or args.queue < 0:
        raise TableError(f"--batch must be >= 1 and --queue >= 0 (got {args.batch}, {args.queue})")
    table = _pick_model(TableSet.load(args.table), args.model, args.table)
    clock, met = table.clock_for_queue(
        args.slo_ms, args.queue, args.batch, args.concurrency, args.quantile
    )
    if not met:
        top_ms = table.completion_ms(clock, args.queue, args.batch, args.concurrency, args.quantile)
        print(
            f"no clock meets {args.slo_ms} ms with {args.queue} queued in batches of "
            f"{args.batch} (the top clock predicts {top_ms:.2f} ms); printing the highest clock",
            file=sys.stderr,
        )
    print(clock)
    return 0


def _cmd_plot(args: argparse.Namespace, console: Console) -> int:
    from time2clock.plot import plot_tables

    tables = TableSet.load(args.table)
    if args.model is not None:
        tables = TableSet([_pick_model(tables, args.model, args.table)])
    samples = None
    if args.measurements:
        default = tables.models[0] if len(tables) == 1 else "unknown"
        samples = read_measurements(args.measurements, default_model=default)
    console.print(f"wrote {plot_tables(tables, args.output, samples)}")
    return 0


def _sim_models(profile: str, wanted: list[str] | None) -> list[tuple[str, int]]:
    """The simulated models to profile, each with its largest batch."""
    from dvfs.profiles import get_profile

    gpu = get_profile(profile)
    if not wanted:
        names = [gpu.default_model]
    elif "all" in wanted:
        names = list(gpu.models)
    else:
        unknown = [m for m in wanted if m not in gpu.models]
        if unknown:
            raise TableError(
                f"sim:{profile} has no model {', '.join(map(repr, unknown))}; "
                f"it has: {', '.join(gpu.models)} (or: all)"
            )
        names = list(dict.fromkeys(wanted))
    return [(name, gpu.models[name].max_batch) for name in names]


def _batches_for(model: str, max_batch: int, given: list[int] | None) -> list[int]:
    """``given`` (default: 1,2,4,8 up to ``max_batch``), checked against ``max_batch``."""
    if given is None:
        return [b for b in DEFAULT_BATCHES if b <= max_batch]
    if given[-1] > max_batch:
        raise TableError(f"--batches {given[-1]} exceeds {model}'s largest batch, {max_batch}")
    return given


def _progress(console: Console, unit: str) -> Progress:
    """A profiling run's bar: what is profiled, done/total ``unit``, time left."""
    return Progress(
        TextColumn("[bold]profiling {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} " + unit),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


def _cmd_profile(args: argparse.Namespace, console: Console) -> int:
    from dvfs.device import Device
    from dvfs.factory import open_device, parse_device_spec
    from time2clock.plot import PlotUnavailableError, plot_tables
    from time2clock.profile import (
        Measurer,
        SimulatedMeasurer,
        TritonMeasurer,
        select_clocks,
        sweep,
        triton_models,
    )

    kind, arg = parse_device_spec(args.device)
    jobs: list[tuple[str, Device, Measurer, list[int]]] = []  # (model, device, measurer, batches)
    if args.triton_url is None:
        if kind != "sim":
            raise TableError("profiling a real GPU needs --triton-url and --model to drive")
        for model, max_batch in _sim_models(arg, args.model):
            sim = SimulatedMeasurer.for_profile(arg, seed=args.seed, model=model)
            jobs.append((model, sim.device, sim, _batches_for(model, max_batch, args.batches)))
        gpu = arg
    else:
        if not args.model:
            raise TableError(
                "--model is required with --triton-url (repeat it for each model, or: all)"
            )
        device = open_device(args.device, seed=args.seed)
        gpu = device.identity.name
        names = triton_models(args.triton_url) if "all" in args.model else args.model
        for model in dict.fromkeys(names):
            triton = TritonMeasurer(
                args.triton_url,
                model,
                input_name=args.input_name,
                shape=args.shape,
                datatype=args.datatype,
            )
            batches = _batches_for(model, max(triton.max_batch(), 1), args.batches or [1])
            jobs.append((model, device, triton, batches))
    tables = TableSet()
    measured: dict[str, Samples] = {}
    with _progress(console, "clock × batch steps") as bar:
        for model, device, measurer, batches in jobs:
            clocks = select_clocks(device.supported_clocks_mhz(), args.clocks)
            task = bar.add_task(
                f"{model} on {gpu}, batches {','.join(map(str, batches))}",
                total=len(clocks) * len(batches),
            )

            def advance(done: int, _total: int, task: TaskID = task) -> None:
                bar.update(task, completed=done)

            result = sweep(
                device,
                measurer,
                clocks,
                batches=batches,
                requests_per_clock=args.requests_per_clock,
                concurrency=args.concurrency,
                progress=advance,
            )
            measured[model] = result.samples
            tables.add(
                fit_model_table(
                    result.samples,
                    trim=args.trim,
                    gpu=gpu,
                    model=model,
                    concurrency=args.concurrency,
                    energy_j=result.energy_per_inference_j,
                )
            )
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_measurements(out / "measurements.csv", measured)
    tables.save(out / "table.json")
    wrote = [out / "measurements.csv", out / "table.json"]
    try:
        wrote.append(plot_tables(tables, out / "fit.png", measured))
    except PlotUnavailableError as err:  # the table is what matters; the plot is optional
        console.print(f"no plot: {err}")
    for table in tables:
        _print_table(console, table)
    console.print(f"wrote {', '.join(map(str, wrote))}")
    return 0


def _cmd_profile_engine(args: argparse.Namespace, console: Console) -> int:
    import asyncio
    import contextlib
    import tempfile

    from dvfs.factory import open_device, parse_device_spec
    from dvfs.simulated import SimulatedDevice
    from loadgen.stream import GenTarget, endpoint_name
    from time2clock.engine import measure_engine_profile
    from time2clock.plot import PlotUnavailableError, plot_engine
    from time2clock.profile import select_clocks

    settings = EngineSweepSettings(
        buckets=tuple(args.buckets),
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        prefill_tokens=args.prefill_tokens,
        prefill_repeats=args.prefill_repeats,
        settle_s=args.settle_s,
    )
    endpoint = endpoint_name(args.endpoint)
    try:
        extra = json.loads(args.extra) if args.extra else {}
    except json.JSONDecodeError as err:
        raise ValueError(f"--extra must be a JSON object: {err}") from None
    if not isinstance(extra, dict):
        raise ValueError(f"--extra must be a JSON object, got {args.extra!r}")
    kind, arg = parse_device_spec(args.device)
    model = args.model
    with contextlib.ExitStack() as stack:
        if args.url is not None:
            if kind == "sim" and args.state_path is None:
                raise ValueError(
                    "a simulated GPU behind --url needs --state-path (the state file the "
                    "engine's simulated GPU runs on)"
                )
            device = (
                SimulatedDevice.attach(args.state_path)
                if args.state_path is not None
                else open_device(args.device, seed=args.seed)
            )
            base_url = args.url.rstrip("/")
        else:
            if kind != "sim":
                raise ValueError("profiling a real GPU needs --url: the engine to drive")
            from api.embedded import EmbeddedTriton
            from api.embedded_llm import SIMLLM
            from dvfs.llm_profiles import LLM_GPUS

            if arg not in LLM_GPUS:
                raise ValueError(
                    f"the embedded engine runs on a simulated GPU with an LLM profile "
                    f"({', '.join('sim:' + g for g in LLM_GPUS)}), not {args.device}"
                )
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            device = SimulatedDevice(arg, state_path=folder / "gpu0.state")
            stack.callback(device.close)
            console.print(f"starting the embedded Triton ({SIMLLM} on {args.device}) ...")
            triton = stack.enter_context(EmbeddedTriton(folder / "gpu0.state"))
            base_url = f"http://{triton.url}"
            endpoint, model = "generate_stream", model or SIMLLM
        if not model:
            raise ValueError("--model is required with --url (the engine's model name)")
        target = GenTarget(base_url, endpoint, model, extra=extra)
        ladder = device.supported_clocks_mhz()
        clocks = select_clocks(ladder, args.clocks)
        gpu = device.identity.name
        with _progress(console, "runs") as bar:
            task = bar.add_task(f"{model} on {gpu}, {len(clocks)} clocks", total=None)

            def advance(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            out = Path(args.output)
            measure = measure_engine_profile(
                out, device, target, clocks, settings, gpu=gpu, progress=advance, seed=args.seed
            )
            prior = asyncio.run(measure)
    wrote = [out]
    try:
        title = f"{model} on {gpu}: engine profile"
        wrote.append(plot_engine(prior, out.with_suffix(".png"), title))
    except PlotUnavailableError as err:  # the profile is what matters; the plot is optional
        console.print(f"no plot: {err}")
    table = Table(title=f"{model} on {gpu}: decode step ms (J) per sequences running")
    table.add_column("clock MHz", justify="right")
    for bucket in sorted(prior.step_ms):
        table.add_column(f"{bucket} seq", justify="right")
    table.add_column(f"prompt of {prior.prefill_tokens} ms (J)", justify="right")
    for clock in sorted(prior.prefill_ms):
        cells = [
            f"{prior.step_ms[b][clock]:.2f} ({prior.step_j[b][clock]:.2f})"
            for b in sorted(prior.step_ms)
        ]
        prompt = f"{prior.prefill_ms[clock]:.1f} ({prior.prefill_j[clock]:.1f})"
        table.add_row(str(clock), *cells, prompt)
    console.print(table)
    console.print(
        f"wrote {', '.join(map(str, wrote))} (use it with: python -m api serve --policy tokens "
        f"--engine-profile {out})"
    )
    return 0


def _batch_list(text: str) -> list[int]:
    try:
        batches = sorted({int(b) for b in text.split(",") if b.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected batch sizes like 1,2,4,8, got {text!r}"
        ) from None
    if not batches or batches[0] < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be integers >= 1, got {text!r}")
    return batches


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m time2clock", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("fit", help="fit a table from a measurements CSV")
    p.add_argument(
        "measurements",
        type=Path,
        help="CSV with clock_mhz,latency_ms per execution (optional columns: batch, model)",
    )
    p.add_argument("-o", "--output", type=Path, required=True, help="table JSON to write")
    p.add_argument("--trim", type=float, default=0.2, help="fraction dropped at each end (0.2)")
    p.add_argument("--gpu", default="unknown")
    p.add_argument(
        "--model",
        default=None,
        help="with a model column: fit only this model; without: the name of the table",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="executions in flight when the data was measured (1; seed 003 used 2)",
    )
    p.set_defaults(run=_cmd_fit)

    p = sub.add_parser("clock", help="lowest clock meeting an SLO with a queue ahead")
    p.add_argument("table", type=Path)
    p.add_argument("--slo-ms", type=float, required=True)
    p.add_argument("--queue", type=int, default=0, help="requests ahead of this one (0)")
    p.add_argument("--batch", type=int, default=1, help="requests per execution (1)")
    p.add_argument("--model", default=None, help="whose table (needed when the file has several)")
    p.add_argument("--concurrency", type=int, default=None, help="default: the table's")
    p.add_argument(
        "--quantile",
        choices=("mean", "p90", "p99"),
        default="mean",
        help="which fit predicts the time (mean, as in seed 003)",
    )
    p.set_defaults(run=_cmd_clock)

    p = sub.add_parser("profile", help="sweep a device's clocks while driving a model, then fit")
    p.add_argument("--device", default="sim:v100", help="sim:<profile> or nvml:<index>")
    p.add_argument(
        "--triton-url",
        default=None,
        help="Triton to drive (host:port); "
        "without it a simulated device is measured directly in virtual time",
    )
    p.add_argument(
        "--model",
        action="append",
        default=None,
        help="a Triton model to profile (repeat for several; 'all': every model Triton has "
        "ready); on a simulated device one of the GPU profile's models, or 'all' "
        "(default: its default model)",
    )
    p.add_argument(
        "--batches",
        type=_batch_list,
        default=None,
        help="batch sizes to sweep, comma-separated "
        "(default: 1,2,4,8 up to the simulated model's largest; 1 on a real Triton)",
    )
    p.add_argument(
        "--shape",
        type=lambda s: [int(d) for d in s.split(",")],
        default=[1, 16],
        help="one request's input shape including the batch dimension, which --batches "
        "replaces, comma-separated (1,16)",
    )
    p.add_argument("--input-name", default="INPUT0", help="the model's input tensor (INPUT0)")
    p.add_argument("--datatype", default="FP32", help="its Triton datatype (FP32, FP16, INT8, ...)")
    p.add_argument(
        "--requests-per-clock", type=int, default=10, help="executions per clock and batch (10)"
    )
    p.add_argument("--concurrency", type=int, default=1, help="executions in flight (1)")
    p.add_argument("--clocks", type=int, default=None, help="how many clocks (default: every one)")
    p.add_argument("--trim", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--out-dir", default="out/profile")
    p.set_defaults(run=_cmd_profile)

    engine = EngineSweepSettings()  # the sweep's defaults
    p = sub.add_parser(
        "profile-engine",
        help="sweep a GPU's clocks while driving an LLM engine's streams: the token policy's "
        "engine profile",
    )
    p.add_argument("--device", default="sim:h100", help="sim:<profile> or nvml:<index> (sim:h100)")
    p.add_argument(
        "--url",
        default=None,
        help="the engine (http://host:port: Triton, or an OpenAI-compatible server); without "
        "it the embedded Triton's simulated engine is started on the simulated --device",
    )
    p.add_argument(
        "--endpoint",
        default="generate_stream",
        help="with --url: generate_stream (Triton), openai-completions or openai-chat "
        "(generate_stream)",
    )
    p.add_argument("--model", default=None, help="the engine's model (the embedded: simllm)")
    p.add_argument(
        "--state-path",
        type=Path,
        default=None,
        help="with --url and a simulated GPU: the state file the engine's GPU runs on",
    )
    p.add_argument(
        "--extra",
        default=None,
        help="JSON fields added to every request body (vLLM: '{\"ignore_eos\": true}', so "
        "that each stream runs to its length)",
    )
    p.add_argument(
        "--buckets",
        type=_batch_list,
        default=list(engine.buckets),
        help="sequences decoding at once, comma-separated (1,2,4,8,16,32,64)",
    )
    for name, default, text in (
        ("prompt-tokens", engine.prompt_tokens, "each decode run's prompt"),
        ("output-tokens", engine.output_tokens, "each decode run's streams"),
        ("prefill-tokens", engine.prefill_tokens, "the lone prompts timed"),
        ("prefill-repeats", engine.prefill_repeats, "lone prompts per clock"),
    ):
        p.add_argument(f"--{name}", type=int, default=default, help=f"{text} ({default})")
    p.add_argument(
        "--settle-s",
        type=float,
        default=engine.settle_s,
        help="wait after locking each clock (0.5)",
    )
    p.add_argument("--clocks", type=int, default=8, help="how many clocks, both ends kept (8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", default="out/engine/engine.json")
    p.set_defaults(run=_cmd_profile_engine)

    p = sub.add_parser("plot", help="plot a table (and its measurements)")
    p.add_argument("table", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--measurements", type=Path, default=None)
    p.add_argument("--model", default=None, help="plot only this model's table")
    p.set_defaults(run=_cmd_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    stream = sys.stderr if args.cmd == "clock" else sys.stdout
    console = Console(stderr=args.cmd == "clock", width=None if stream.isatty() else PIPE_WIDTH)
    try:
        return int(args.run(args, console))
    except (TableError, DeviceError, MeasureError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
