"""``python -m time2clock fit | clock | profile | plot``: measure, fit, choose a clock."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from dvfs.__main__ import PIPE_WIDTH
from dvfs.errors import DeviceError
from time2clock.fit import fit_table, read_measurements, write_measurements
from time2clock.table import TableError, Time2ClockTable


def _print_table(console: Console, table: Time2ClockTable) -> None:
    view = Table(
        title=f"time2clock {table.model} on {table.gpu}: "
        f"y = 1/({table.m:.4g}·x + {table.b:.4g}), R² = {table.r2:.4f}"
    )
    for col in ("clock MHz", "n", "trimmed mean ms", "fit ms", "p50 ms", "p99 ms", "std ms"):
        view.add_column(col, justify="right")
    step = max(1, len(table.points) // 20)
    for p in table.points[::step]:
        view.add_row(
            str(p.clock_mhz),
            str(p.n),
            f"{p.trimmed_mean_ms:.2f}",
            f"{table.predict_ms(p.clock_mhz):.2f}",
            f"{p.p50_ms:.2f}",
            f"{p.p99_ms:.2f}",
            f"{p.std_ms:.2f}",
        )
    console.print(view)


def _cmd_fit(args: argparse.Namespace, console: Console) -> int:
    samples = read_measurements(args.measurements)
    table = fit_table(
        samples, trim=args.trim, gpu=args.gpu, model=args.model, concurrency=args.concurrency
    )
    table.save(args.output)
    _print_table(console, table)
    console.print(f"wrote {args.output}")
    return 0


def _cmd_clock(args: argparse.Namespace, console: Console) -> int:
    if args.slo_ms <= 0:
        raise TableError(f"--slo-ms must be > 0, got {args.slo_ms}")
    table = Time2ClockTable.load(args.table)
    clock, met = table.clock_for_queue(args.slo_ms, args.queue, args.concurrency, args.quantile)
    if not met:
        print(
            f"no clock meets {args.slo_ms} ms with {args.queue} queued "
            f"(the top clock predicts {table.predict_ms(clock, args.quantile):.2f} ms per round); "
            "printing the highest clock",
            file=sys.stderr,
        )
    print(clock)
    return 0


def _cmd_plot(args: argparse.Namespace, console: Console) -> int:
    from time2clock.plot import plot_table

    table = Time2ClockTable.load(args.table)
    samples = read_measurements(args.measurements) if args.measurements else None
    console.print(f"wrote {plot_table(table, args.output, samples)}")
    return 0


def _cmd_profile(args: argparse.Namespace, console: Console) -> int:
    from dvfs.device import Device
    from dvfs.factory import open_device, parse_device_spec
    from time2clock.plot import PlotUnavailableError, plot_table
    from time2clock.profile import Measurer, SimulatedMeasurer, TritonMeasurer, select_clocks, sweep

    kind, arg = parse_device_spec(args.device)
    measurer: Measurer
    device: Device
    if args.triton_url is None:
        if kind != "sim":
            raise TableError("profiling a real GPU needs --triton-url and --model to drive")
        sim = SimulatedMeasurer.for_profile(arg, seed=args.seed)
        device, measurer, gpu = sim.device, sim, arg
        model = args.model or "inception-sim"
    else:
        if not args.model:
            raise TableError("--model is required with --triton-url")
        device = open_device(args.device, seed=args.seed)
        measurer = TritonMeasurer(
            args.triton_url,
            args.model,
            input_name=args.input_name,
            shape=args.shape,
            datatype=args.datatype,
        )
        gpu, model = device.identity.name, args.model
    clocks = select_clocks(device.supported_clocks_mhz(), args.clocks)
    with Progress(
        TextColumn("[bold]profiling {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} clocks"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task(f"{model} on {gpu}", total=len(clocks))
        result = sweep(
            device,
            measurer,
            clocks,
            requests_per_clock=args.requests_per_clock,
            concurrency=args.concurrency,
            progress=lambda done, _total: bar.update(task, completed=done),
        )
    samples = result.samples
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_measurements(out / "measurements.csv", samples)
    table = fit_table(
        samples,
        trim=args.trim,
        gpu=gpu,
        model=model,
        concurrency=args.concurrency,
        energy_j=result.energy_per_inference_j,
    )
    table.save(out / "table.json")
    wrote = [out / "measurements.csv", out / "table.json"]
    try:
        wrote.append(plot_table(table, out / "fit.png", samples))
    except PlotUnavailableError as err:  # the table is what matters; the plot is optional
        console.print(f"no plot: {err}")
    _print_table(console, table)
    console.print(f"wrote {', '.join(map(str, wrote))}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m time2clock", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("fit", help="fit a table from a measurements CSV")
    p.add_argument("measurements", type=Path, help="CSV with clock_mhz,latency_ms per request")
    p.add_argument("-o", "--output", type=Path, required=True, help="table JSON to write")
    p.add_argument("--trim", type=float, default=0.2, help="fraction dropped at each end (0.2)")
    p.add_argument("--gpu", default="unknown")
    p.add_argument("--model", default="unknown")
    p.add_argument(
        "--concurrency",
        type=int,
        default=2,
        help="the concurrency the data was measured at (2, as in seed 003)",
    )
    p.set_defaults(run=_cmd_fit)

    p = sub.add_parser("clock", help="lowest clock meeting an SLO with a queue ahead")
    p.add_argument("table", type=Path)
    p.add_argument("--slo-ms", type=float, required=True)
    p.add_argument("--queue", type=int, default=0, help="requests ahead of this one (0)")
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
    p.add_argument("--model", default=None)
    p.add_argument(
        "--shape",
        type=lambda s: [int(d) for d in s.split(",")],
        default=[1, 16],
        help="input shape including the batch dimension, comma-separated (1,16)",
    )
    p.add_argument("--input-name", default="INPUT0", help="the model's input tensor (INPUT0)")
    p.add_argument("--datatype", default="FP32", help="its Triton datatype (FP32, FP16, INT8, ...)")
    p.add_argument("--requests-per-clock", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--clocks", type=int, default=None, help="how many clocks (default: every one)")
    p.add_argument("--trim", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--out-dir", default="out/profile")
    p.set_defaults(run=_cmd_profile)

    p = sub.add_parser("plot", help="plot a table (and its measurements)")
    p.add_argument("table", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--measurements", type=Path, default=None)
    p.set_defaults(run=_cmd_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stream = sys.stderr if args.cmd == "clock" else sys.stdout
    console = Console(stderr=args.cmd == "clock", width=None if stream.isatty() else PIPE_WIDTH)
    try:
        return int(args.run(args, console))
    except (TableError, DeviceError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
