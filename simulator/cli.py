"""The simulator's commands: ``simulate | compare | tune | bench | generative``."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from dvfs.__main__ import PIPE_WIDTH
from scheduler.clients import ClientSpec, parse_clients
from scheduler.config import PolicyConfig
from scheduler.core import SchedulerConfig
from scheduler.params import SlackParams
from scheduler.placement import DEFAULT_PLACEMENT, PLACEMENTS, PlacementParams
from scheduler.registry import DEFAULT_POLICY, POLICIES
from simulator.bestfixed import BEST_FIXED, BEST_FIXED_CELL, best_fixed
from simulator.compare import (
    DEFAULT_MIX,
    MATRICES,
    TUNABLE,
    Matrix,
    Row,
    against_best_fixed,
    against_one_gpu,
    against_spread,
    cell_searches,
    one_clock_per_cell,
    plot,
    resolve_capacities,
    run_all,
    tabulate,
    tune,
    write_csv,
)
from simulator.generative import add_parser as add_generative_parser
from simulator.node import run
from simulator.report import (
    TUNE_HEAD,
    compare_markdown,
    tune_cells,
    tune_markdown,
    verdict_cells,
)
from simulator.results import markdown_table, provenance, write_results
from simulator.shapes import SHAPES
from simulator.simulate import ARRIVALS, SimConfig, parse_models
from simulator.workload import DayCycle


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None


def _positive_floats(text: str) -> tuple[float, ...]:
    values = _floats(text)
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated finite numbers > 0, got {text!r}"
        )
    return values


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated whole numbers, got {text!r}"
        ) from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected milliseconds, got {text!r}") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected finite milliseconds >= 0, got {text!r}")
    return value


def _add_clock_change_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--clock-change-ms",
        type=_milliseconds,
        default=None,
        help="how long the simulated GPU takes to land a clock change (default: its profile's, "
        "5 ms, an assumption: docs/simulator.md); the policies plan with the same delay, "
        "as a sidecar given --slack-change-delay-ms (compare/tune: unless --config sets "
        "policy.slack.change_delay_ms)",
    )


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def _gpus_or_names(text: str) -> int | tuple[str, ...]:
    """``--gpus`` of compare: a number of GPUs per node, or (the older spelling of ``--gpu``)
    GPU profiles."""
    return _count(text) if text.strip().isdigit() else _names(text)


def _add_node_options(p: argparse.ArgumentParser, *, many: bool) -> None:
    modes = ", ".join(PLACEMENTS)
    if many:
        p.add_argument(
            "--placements",
            type=_names,
            default=PLACEMENTS,
            help=f"placement modes to compare on a node of --gpus N (default: {modes})",
        )
    else:
        p.add_argument(
            "--placement",
            choices=PLACEMENTS,
            default=DEFAULT_PLACEMENT,
            help=f"which GPU of the node takes each request: {modes} (default {DEFAULT_PLACEMENT})",
        )
    p.add_argument(
        "--pack-slo-share",
        type=float,
        default=PlacementParams.pack_slo_share,
        help="energy placement: pack a request onto a busy GPU only if it is expected to finish "
        "within this share of the time left to its deadline (default "
        f"{PlacementParams.pack_slo_share:g})",
    )


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
    )


def _cmd_simulate(args: argparse.Namespace, console: Console) -> int:
    clients = tuple(parse_clients(args.clients)) if args.clients else (ClientSpec("default"),)
    cfg = SimConfig(
        gpu=args.gpu, policy=args.policy, slo_ms=args.slo_ms, duration_s=args.duration_s,
        seed=args.seed, load=args.load, rate_rps=args.rate, arrival=args.arrival,
        trace=args.trace, clients=clients, models=parse_models(args.models),
        instances=args.instances, max_inflight=args.max_inflight, max_queue=args.max_queue,
        triton_batches=args.triton_batches, triton_batches_alone=args.triton_batches_alone,
        gpus=args.gpus,
        placement=PlacementParams(args.placement, args.pack_slo_share),
        day=_day(args), clock_change_ms=args.clock_change_ms,
        slack=_planned(SlackParams(), args.clock_change_ms),
    )  # fmt: skip
    if args.slo_ms <= 0 or args.duration_s <= 0:
        raise ValueError("--slo-ms and --duration-s must be > 0")
    # best-fixed: the best single clock in hindsight on these arrivals (several runs).
    out = best_fixed(cfg) if args.policy == BEST_FIXED else run(cfg).to_json()
    if not args.json or sys.stdout.isatty():
        node = f"{cfg.gpus}× {out['gpu']} ({cfg.placement.mode})" if cfg.gpus > 1 else out["gpu"]
        view = Table(
            title=f"{out['policy']} on {node}, {out['rate_rps']:.0f} req/s, "
            f"SLO {out['slo_ms']:g} ms, {out['duration_s']:g} s, seed {out['seed']}"
        )
        for col in (
            "requests",
            "completed",
            "rejected",
            "J/inference",
            "oracle J/inf",
            "p50 ms",
            "p99 ms",
            "SLO met",
            "mean batch",
            "mean MHz",
            "clock changes",
        ):
            view.add_column(col, justify="right")
        oracle = (out["oracle_energy_j"] or math.nan) / max(1, out["completed"])
        view.add_row(
            str(out["requests"]),
            str(out["completed"]),
            str(out["rejected"]),
            f"{out['energy_per_inference_j']:.3f}",
            f"{oracle:.3f}",
            f"{out['p50_ms']:.1f}",
            f"{out['p99_ms']:.1f}",
            f"{out['slo_attainment']:.2%}",
            f"{out['mean_batch']:.1f}",
            f"{out['mean_clock_mhz']:.0f}",
            str(out["clock_changes"]),
        )
        console.print(view)
        if len(out["models"]) > 1:
            per_model = Table(title="per model")
            for col in ("model", "completed", "SLO ms", "p99 ms", "SLO met"):
                per_model.add_column(col, justify="right")
            for name, m in out["models"].items():
                per_model.add_row(
                    name,
                    str(m["completed"]),
                    f"{m['slo_ms']:g}",
                    f"{m['p99_ms']:.1f}",
                    f"{m['slo_attainment']:.2%}",
                )
            console.print(per_model)
        if len(out["clients"]) > 1:
            per = Table(
                title="per client (DCT/ideal: completion time over ideal CFS's, seed 000; "
                f"worst pair {_deviation(out['isolation_deviation'])} from ideal)"
            )
            cols = ("client", "completed", "rejected", "p99 ms", "SLO met", "GPU time s")
            for col in (*cols, "DCT/ideal"):
                per.add_column(col, justify="right")
            for name, c in out["clients"].items():
                per.add_row(
                    name,
                    str(c["completed"]),
                    str(c["rejected"]),
                    f"{c['p99_ms']:.1f}",
                    f"{c['slo_attainment']:.2%}",
                    f"{c['service_ms'] / 1000:.2f}",
                    "-" if not math.isfinite(c["dct_over_ideal"]) else f"{c['dct_over_ideal']:.3f}",
                )
            console.print(per)
        if "per_gpu" in out:
            print_node(out, console)
    if args.json:
        print(json.dumps(out))
    return 0


def _deviation(value: float) -> str:
    """Seed 000's isolation metric: the worst pair of clients' distance from ideal CFS."""
    return "-" if not math.isfinite(value) else f"{value:.1%}"


def print_node(out: dict[str, Any], console: Console) -> None:
    """A node's run: what each GPU did."""
    per = Table(title=f"per GPU ({out['placement']} placement)")
    for col in ("GPU", "placed", "completed", "mean batch", "busy", "mean MHz", "energy J"):
        per.add_column(col, justify="right")
    for i, g in enumerate(out["per_gpu"]):
        per.add_row(
            str(i),
            str(g["placed"]),
            str(g["completed"]),
            f"{g['mean_batch']:.1f}",
            f"{g['busy_share']:.0%}",
            f"{g['mean_clock_mhz']:.0f}",
            f"{g['energy_j']:.0f}",
        )
    console.print(per)


PLACEMENT_COLUMNS = ("GPU", "mix", "load", "SLO ×", "seed", "policy", "placement", "J/inf",
                     "vs spread", "p99/SLO", "SLO met", "req/s", "× one GPU", "GPUs used",
                     "isolation")  # fmt: skip
ONE_GPU_COLUMNS = ("GPU", "mix", "load", "SLO ×", "seed", "policy", "req/s", "p99/SLO",
                   "SLO met", "refused")  # fmt: skip


def _cell_head(r: Row) -> list[str]:
    """What names a row's cell, as the tables below open with it: GPU, mix, load, SLO ×, seed
    and policy."""
    return [r["gpu"], r["mix"], f"{r['load']:g}", f"{r['slo_mult']:g}", str(r["seed"]), r["policy"]]


def placement_cells(rows: Sequence[Row]) -> list[list[str]]:
    """Each node row against ``spread`` on the same arrivals, as :data:`PLACEMENT_COLUMNS`
    (× one GPU: its throughput over the most one GPU carried, where ``rows`` hold one-GPU runs;
    isolation: seed 000's metric, the worst pair of clients' distance from ideal CFS)."""
    scaled, _ = against_one_gpu(rows)
    return [
        [
            *_cell_head(r),
            r["placement"],
            f"{r['energy_per_inference_j']:.3f}",
            f"{r['vs_spread']:.3f}",
            f"{r['p99_over_slo']:.2f}",
            f"{r['slo_attainment']:.1%}",
            f"{r['throughput_rps']:.0f}",
            "-" if not math.isfinite(s["vs_one_gpu"]) else f"{s['vs_one_gpu']:.2f}",
            str(r["gpus_used"]),
            _deviation(r["isolation_deviation"]),
        ]
        for r, s in zip(against_spread(rows), scaled, strict=True)
    ]


def one_gpu_cells(rows: Sequence[Row]) -> list[list[str]]:
    """The one-GPU runs beside a node's, as :data:`ONE_GPU_COLUMNS`."""
    return [
        [
            *_cell_head(r),
            f"{r['throughput_rps']:.0f}",
            f"{r['p99_over_slo']:.2f}",
            f"{r['slo_attainment']:.1%}",
            str(r["rejected"]),
        ]
        for r in rows
        if r.get("gpus", 1) == 1
    ]


def client_cells(rows: Sequence[Row]) -> list[list[str]]:
    """Each node row's clients (where it has several): the share of its level's GPU time each
    was served against the share ideal CFS gives it by weight (seed 000's isolation metric is
    the worst pair of these ratios)."""
    out = []
    for r in against_spread(rows):
        clients = r.get("clients") or {}
        if len(clients) < 2:
            continue
        level_ms: dict[int, float] = {}
        for c in clients.values():
            level_ms[c["level"]] = level_ms.get(c["level"], 0.0) + c["served_work_ms"]
        for name, c in clients.items():
            total = level_ms[c["level"]]
            served = c["served_work_ms"] / total if total else math.nan
            ideal = c["ideal_work_ms"] / total if total else math.nan
            out.append(
                [
                    r["mix"],
                    f"{r['load']:g}",
                    r["policy"],
                    r["placement"],
                    name,
                    str(c["nice"]),
                    f"{ideal:.2%}",
                    f"{served:.2%}",
                    "-" if not ideal else f"{served / ideal - 1:+.2%}",
                ]
            )
    return out


CLIENT_COLUMNS = ("mix", "load", "policy", "placement", "client", "nice", "ideal CFS share",
                  "share served", "served vs ideal")  # fmt: skip


def print_placements(rows: Sequence[Row], console: Console) -> None:
    """Each placement against ``spread`` on the same arrivals, per load and policy."""
    view = Table(title="placements on the node (energy per inference vs spread, same arrivals)")
    for col in PLACEMENT_COLUMNS:
        view.add_column(col, justify="right")
    for cells in placement_cells(rows):
        view.add_row(*cells)
    console.print(view)


def _day(args: argparse.Namespace) -> DayCycle:
    return DayCycle(
        shape=args.shape,
        days=args.days,
        trough=args.trough,
        burst_factor=args.burst_factor,
        burst_s=args.burst_s,
        burst_gap_s=args.burst_gap_s,
    )


FULL_SEEDS = (0, 1, 2, 3, 4)
TUNE_SEEDS = (0, 1, 2)  # tune's, without --seeds or --full
MAX_ROWS_SHOWN = 300  # more runs than this: the summary and the results page only


def _matrix(args: argparse.Namespace, **extra: object) -> Matrix:
    """The matrix the shared ``compare``/``tune`` options describe: ``--matrix``'s, with every
    option given on the command line in place of its own."""
    base = MATRICES[args.matrix]
    node = args.gpus if isinstance(args.gpus, int) else None
    kinds = args.gpu or (args.gpus if isinstance(args.gpus, tuple) else None)
    for mode in getattr(args, "placements", ()):
        PlacementParams(mode)  # a ValueError names the modes
    given: dict[str, object] = {
        "gpus": kinds,
        "mixes": args.mixes,
        "loads": args.loads,
        "slo_multipliers": args.slo_multipliers,
        "duration_s": args.duration_s,
        "node_gpus": node,
        "placements": getattr(args, "placements", None),
        "pack_slo_share": getattr(args, "pack_slo_share", None),
        "clients": tuple(parse_clients(args.clients)) if args.clients else None,
        "clock_change_ms": args.clock_change_ms,
        **extra,
    }
    if args.full and given.get("seeds") is None:
        given["seeds"] = FULL_SEEDS
    if args.shape is not None:
        given["day"] = replace(base.day, shape=args.shape)
    if args.config is not None:
        policy = policy_from_file(args.config, args.clock_change_ms)
        given["slack"], given["feedback"] = policy.slack, policy.feedback
    else:
        given["slack"] = _planned(base.slack, args.clock_change_ms)
    return replace(base, **{k: v for k, v in given.items() if v is not None})  # type: ignore[arg-type]


def _planned(slack: SlackParams, clock_change_ms: float | None) -> SlackParams:
    """``slack`` planning with the GPU's clock-change delay, when ``--clock-change-ms`` gives
    one."""
    return slack if clock_change_ms is None else replace(slack, change_delay_ms=clock_change_ms)


def policy_from_file(path: Path, clock_change_ms: float | None = None) -> PolicyConfig:
    """The clock policy's parameters in a sidecar's TOML file (``python -m api serve
    --config``): its ``[policy.slack]`` and ``[policy.feedback]`` tables tune ``slack`` and
    ``adaptive`` here as they do live; its other keys are checked and left aside. The policies
    plan with ``clock_change_ms`` unless the file sets ``policy.slack.change_delay_ms``.
    ValueError names a bad file, an unknown key or a bad value."""
    from api.config import build, load_file

    leaves = {tuple(key.split(".")): value for key, value in load_file(path).items()}
    if clock_change_ms is not None:
        leaves.setdefault(("policy", "slack", "change_delay_ms"), clock_change_ms)
    try:
        return build(leaves).policy
    except (TypeError, ValueError) as err:  # a value its parameter refuses
        raise ValueError(f"--config {path}: {err}") from None


def _tuned(m: Matrix) -> str:
    """The sidecar's flags for the policy parameters the matrix sets apart from the defaults."""
    from api.config import GatewayConfig, to_flags

    policy = PolicyConfig(slack=m.slack, feedback=m.feedback)
    return " ".join(to_flags(GatewayConfig(policy=policy)))


def _describe(m: Matrix) -> str:
    """One paragraph: what the matrix runs."""
    slo = "a full batch" if m.slo_basis == "full" else "one request"
    load = (
        "what the top clock holds for that mix and SLO"
        if m.load_basis == "capacity"
        else "the rate the top clock serves one request at a time"
    )
    arrivals = (
        "Poisson arrivals"
        if m.arrival != "day"
        else f"{m.day.days:g} compressed days of the `{m.day.shape}` shape (trough "
        f"{m.day.day_shape().trough:.2f} of the peak), bursts of {m.day.burst_factor:g}× for "
        f"{m.day.burst_s:g} s every {m.day.burst_gap_s:g} s on average; the load is the "
        "highest rate of the run (a burst at the peak)"
    )
    node = f"; nodes of {m.node_gpus} GPUs" if m.node_gpus > 1 else ""
    tuned = f" Policy parameters apart from the defaults: `{t}`." if (t := _tuned(m)) else ""
    if m.clock_change_ms is not None:
        tuned += f" The GPUs land a clock change {m.clock_change_ms:g} ms after it is asked for."
    return (
        f"GPUs {', '.join(m.gpus)}{node}; mix {'; '.join(m.mixes)}; loads "
        f"{', '.join(f'{x:g}' for x in m.loads)} of {load}; SLOs "
        f"{', '.join(f'{x:g}' for x in m.slo_multipliers)}× {slo} at the top clock; {arrivals}; "
        f"{m.duration_s:g} s per run; seeds {', '.join(map(str, m.seeds))}; policies "
        f"{', '.join(m.policies)}.{tuned}"
    )


def placements_markdown(rows: Sequence[Row]) -> str:
    """``placements.md``'s body: the placements against ``spread``, the one-GPU runs beside
    them, and the clients' shares against ideal CFS's, where ``rows`` have them."""
    parts = [markdown_table(PLACEMENT_COLUMNS, placement_cells(rows))]
    if ones := one_gpu_cells(rows):
        parts += [
            "One GPU of the same profile, same policies, mix and SLOs (× one GPU above: a node "
            "row's req/s over the most one GPU carried at any of these loads):",
            markdown_table(ONE_GPU_COLUMNS, ones),
        ]
    if clients := client_cells(rows):
        parts += [
            "Each client's share of its level's GPU time (served while arrivals ran) against "
            "ideal CFS's by weight:",
            markdown_table(CLIENT_COLUMNS, clients),
        ]
    return "\n\n".join(parts)


def _cmd_compare(args: argparse.Namespace, console: Console) -> int:
    matrix = _matrix(args, policies=args.policies, seeds=args.seeds)
    # Where the figures come from, before this command writes anything into the tree.
    prov = provenance(["python -m scheduler", *(args.argv or [])])
    configs = matrix.configs()
    if args.one_gpu_loads and matrix.node_gpus > 1:
        alone = replace(matrix, node_gpus=1, loads=args.one_gpu_loads)
        configs += alone.configs()
    configs = resolve_capacities(configs, jobs=args.jobs)
    with _progress(console) as bar:
        task = bar.add_task("simulating", total=len(configs))
        results = run_all(configs, jobs=args.jobs, progress=lambda n: bar.advance(task, n))
        searches = cell_searches(configs, results)
        if searches:
            task = bar.add_task("one clock per cell", total=len(searches))
            results += one_clock_per_cell(
                searches, jobs=args.jobs, progress=lambda n: bar.advance(task, n)
            )
        every = tabulate(results)
    one_gpu = [r for r in every if r["gpus"] == 1] if matrix.node_gpus > 1 else []
    rows = [r for r in every if r["gpus"] == matrix.node_gpus]
    out = Path(args.out_dir)
    write_csv(rows + one_gpu, out / "compare.csv")
    summary = [
        s
        for baseline in (BEST_FIXED, BEST_FIXED_CELL)
        if any(r["policy"] == baseline for r in rows)
        for s in against_best_fixed(rows, baseline)
    ]
    md, js = write_results(
        "compare",
        title=f"compare: the {matrix.name} matrix",
        markdown=compare_markdown(rows, _describe(matrix)),
        data={"summary": summary, "rows": rows},
        directory=out,
        prov=prov,
    )
    if len(rows) <= MAX_ROWS_SHOWN:
        print_rows(rows, matrix, console)
    else:
        console.print(f"{len(rows)} runs: per cell in {md}")
    if summary:
        print_summary(summary, console)
    if matrix.node_gpus > 1:
        print_placements(rows + one_gpu, console)
        placed, _ = write_results(
            "placements",
            title=f"placements on a node of {matrix.node_gpus} simulated GPUs",
            markdown=placements_markdown(rows + one_gpu),
            data={"rows": against_one_gpu(against_spread(rows) + one_gpu)[0], "one_gpu": one_gpu},
            directory=out,
            prov=prov,
        )
        console.print(f"wrote {placed} and {placed.with_suffix('.json')}")
    # On a node, each placement is a series of its own beside the policies.
    shown = rows if matrix.node_gpus == 1 else [
        {**r, "policy": f"{r['policy']} {r['placement']}"} for r in rows
    ]  # fmt: skip
    plot(shown, out / "compare.png")
    console.print(f"wrote {out / 'compare.csv'}, {out / 'compare.png'}, {md} and {js}")
    return 0


def print_rows(rows: Sequence[Row], matrix: Matrix, console: Console) -> None:
    """Every run: its energy against ``max``, ``best-fixed`` and the bound, and its tail."""
    view = Table(
        title=f"{matrix.name} matrix ({matrix.duration_s:g} s per run, seeds "
        f"{','.join(map(str, matrix.seeds))}); ratios are energy per inference"
    )
    for col in (
        "GPU",
        "mix",
        "load",
        "SLO ×",
        "seed",
        "policy",
        "J/inf",
        "vs max",
        "vs best-fixed",
        "vs bound",
        "closed",
        "p99/SLO",
        "SLO met",
        "MHz",
        "isolation",
    ):
        view.add_column(col, justify="right")
    for r in rows:
        miss = r["p99_over_slo"] > 1
        view.add_row(
            r["gpu"],
            r["mix"],
            f"{r['load']:g}",
            f"{r['slo_mult']:g}",
            str(r["seed"]),
            r["policy"] if r["gpus"] == 1 else f"{r['policy']} {r['placement']}",
            f"{r['energy_per_inference_j']:.3f}",
            f"{r['vs_max']:.2f}",
            f"{r['vs_best_fixed']:.3f}",
            f"{r['vs_oracle']:.2f}",
            f"{r['closed']:.2f}",
            f"[red]{r['p99_over_slo']:.2f}[/red]" if miss else f"{r['p99_over_slo']:.2f}",
            f"{r['slo_attainment']:.1%}",
            f"{r['mean_clock_mhz']:.0f}",
            _deviation(r["isolation_deviation"]),
        )
    console.print(view)


def print_summary(summary: Sequence[Row], console: Console) -> None:
    """:func:`simulator.compare.against_best_fixed`'s rows, a table per baseline."""
    for baseline in dict.fromkeys(s["baseline"] for s in summary):
        _print_summary([s for s in summary if s["baseline"] == baseline], baseline, console)


def _print_summary(summary: Sequence[Row], baseline: str, console: Console) -> None:
    what = "one clock per cell" if baseline == BEST_FIXED_CELL else "the best single clock"
    view = Table(title=f"over the (cell, seed) pairs where {what} ({baseline}) meets p99")
    for col in (
        "policy",
        "pairs",
        "meets p99",
        f"≤ {baseline} J",
        "both",
        f"vs {baseline} mean",
        "worst",
        "vs max",
        "vs bound",
        "closed mean",
        "least",
    ):
        view.add_column(col, justify="right")
    for s in summary:
        view.add_row(
            s["policy"],
            *verdict_cells(s),
            f"{s['mean_vs_max']:.2f}",
            f"{s['mean_vs_oracle']:.2f}",
            f"{s['mean_closed']:.2f}",
            f"{s['least_closed']:.2f}",
        )
    console.print(view)


def _cmd_tune(args: argparse.Namespace, console: Console) -> int:
    matrix = _matrix(args)
    prov = provenance(["python -m scheduler", *(args.argv or [])])
    seeds = args.seeds or (FULL_SEEDS if args.full else TUNE_SEEDS)
    pairs = len(replace(matrix, seeds=seeds, policies=("max",)).configs())
    with _progress(console) as bar:
        task = bar.add_task(f"tuning {args.param}", total=pairs * (2 + len(args.values)))
        rows = tune(
            matrix,
            args.param,
            args.values,
            seeds,
            policy=args.policy,
            jobs=args.jobs,
            progress=lambda n: bar.advance(task, n),
        )
    whole = [r for r in rows if r["cell"] is None]
    view = Table(
        title=f"{args.policy} {args.param} over the {matrix.name} matrix, seeds "
        f"{','.join(map(str, seeds))}: pairs where best-fixed meets its p99 SLO"
    )
    for col in TUNE_HEAD:
        view.add_column(col, justify="right")
    for r in whole:
        view.add_row(*tune_cells(r))
    console.print(view if whole else "best-fixed meets the p99 SLO in none of these pairs")
    md, js = write_results(
        f"tune-{args.policy}-{args.param}",
        title=f"tune: {args.policy}'s {args.param} over the {matrix.name} matrix",
        markdown=tune_markdown(
            rows,
            _describe(replace(matrix, seeds=seeds, policies=("max", BEST_FIXED))),
            f"`{args.policy}` with `{args.param}` at each value, its other parameters as the "
            "matrix has them, beside `max` and `best-fixed` on the same arrivals.",
        ),
        data={"rows": rows},
        directory=Path(args.out_dir),
        prov=prov,
    )
    console.print(f"wrote {md} and {js}")
    return 0


def _cmd_bench(args: argparse.Namespace, console: Console) -> int:
    from simulator.bench import run
    from simulator.results import write_results

    lines = run()
    for line in lines:
        print(line)
    md, _ = write_results(
        "core",
        title="The scheduler core's cost (python -m scheduler bench)",
        markdown="CPU time of this process per request.\n\n```\n" + "\n".join(lines) + "\n```",
        data={"lines": lines},
        directory=args.results_dir,
    )
    print(f"written to {md} (and .json)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m scheduler", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("simulate", help="one simulated run")
    p.add_argument("--gpu", default="v100", help="the GPU's profile (every GPU of the node's)")
    p.add_argument("--gpus", type=_count, default=1, help="GPUs of the node (default 1)")
    _add_node_options(p, many=False)
    p.add_argument(
        "--policy",
        default=DEFAULT_POLICY,
        help=", ".join(POLICIES) + f", fixed:MHZ, {BEST_FIXED} (best single clock in hindsight)",
    )
    p.add_argument(
        "--models",
        default="resnet50",
        help="model mix, name:share[:slo_ms],... (resnet50, bert-large); default resnet50",
    )
    p.add_argument("--instances", type=int, default=2, help="Triton instances per model (2)")
    _add_clock_change_option(p)
    rate = p.add_mutually_exclusive_group()
    rate.add_argument(
        "--load",
        type=float,
        default=None,
        help="fraction of what the top clock holds for this mix and SLO: the highest rate at "
        "which max keeps every model's p99 within its SLO (default 0.5; a node: per GPU); with "
        "--arrival day, the day's highest rate",
    )
    rate.add_argument(
        "--rate", type=float, default=None, help="requests per second (day: the highest)"
    )
    p.add_argument("--arrival", choices=ARRIVALS, default="poisson")
    p.add_argument("--trace", type=Path, default=None, help="arrival times, seconds, one per line")
    _day_options(p, DayCycle())
    p.add_argument("--slo-ms", type=float, default=100.0, help="SLO of models that name none")
    p.add_argument("--duration-s", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--clients",
        default=None,
        help='e.g. "a:nice=-5,share=0.33;b:nice=0,share=0.33;c:priority=1,slo_ms=80"',
    )
    p.add_argument("--max-inflight", type=int, default=256, help="a cap on requests at Triton")
    p.add_argument("--max-queue", type=int, default=1000)
    p.add_argument(
        "--triton-batches",
        type=int,
        default=SchedulerConfig.triton_batches,
        help="full batches of each model kept at Triton, as the sidecar's --triton-batches",
    )
    p.add_argument(
        "--triton-batches-alone",
        type=int,
        default=SchedulerConfig.triton_batches_alone,
        help="full batches kept at Triton while one nice value alone arrives and one priority "
        "level alone or one model's alone at levels Triton orders, as the sidecar's "
        "--triton-batches-alone",
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON line last")
    p.set_defaults(run=_cmd_simulate)

    for name, helptext in (
        ("compare", "a policy matrix: table, CSV, plot and a results page"),
        ("tune", "sweep one parameter of slack or adaptive over the matrix and seeds"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument(
            "--matrix",
            choices=tuple(MATRICES),
            default="default",
            help="default: the mix at loads 0.3-0.9; steady: one model, tight SLOs, Poisson; "
            "varying: compressed days with bursts (docs/simulator.md); the options below "
            "replace the matrix's own",
        )
        p.add_argument(
            "--gpu",
            type=_names,
            default=None,
            help=f"GPU profiles, comma-separated (default {','.join(Matrix.gpus)})",
        )
        p.add_argument(
            "--gpus",
            type=_gpus_or_names,
            default=None,
            help="GPUs per node (a number; load is then a fraction of the node's capacity), or "
            "GPU profiles as --gpu takes them",
        )
        if name == "compare":
            _add_node_options(p, many=True)
        p.add_argument(
            "--mixes",
            type=lambda t: tuple(x.strip() for x in t.split(";") if x.strip()),
            default=None,
            help=f"model mixes separated by ';' (default matrix: {DEFAULT_MIX})",
        )
        p.add_argument("--loads", type=_positive_floats, default=None)
        p.add_argument(
            "--slo-multipliers",
            type=_positive_floats,
            default=None,
            help="each model's SLO as a multiple of its full batch's (steady: one request's) "
            "time at the top clock",
        )
        p.add_argument("--duration-s", type=float, default=None)
        p.add_argument(
            "--shape",
            default=None,
            help=f"varying matrix: the day's shape (diurnal, {', '.join(SHAPES)} or a file)",
        )
        p.add_argument("--full", action="store_true", help=f"seeds {FULL_SEEDS} (5 of each)")
        p.add_argument(
            "--clients",
            default=None,
            help="client classes in every cell, as simulate's (the isolation column compares "
            "their service with ideal CFS's)",
        )
        p.add_argument("--jobs", type=int, default=None, help="processes (default: all cores)")
        _add_clock_change_option(p)
        p.add_argument(
            "--config",
            type=Path,
            default=None,
            help="a sidecar's TOML file (python -m api serve --config): its [policy.slack] and "
            "[policy.feedback] tables tune slack and adaptive as they do live",
        )
        if name == "compare":
            p.add_argument(
                "--policies",
                type=_names,
                default=None,
                help=f"any of {', '.join(POLICIES)}, fixed:MHZ, {BEST_FIXED}",
            )
            p.add_argument("--seeds", type=_ints, default=None, help="e.g. 0,1,2,3,4")
            p.add_argument(
                "--one-gpu-loads",
                type=_floats,
                default=(),
                help="with --gpus N: also run one GPU at these loads (its own capacity's), to "
                "give each node row's throughput over the most one GPU carried",
            )
            p.add_argument("-o", "--out-dir", default="out/compare")
            p.set_defaults(run=_cmd_compare)
        else:
            p.add_argument(
                "--policy",
                choices=tuple(TUNABLE),
                default="slack",
                help="whose parameter: slack's ([policy.slack]) or adaptive's "
                "([policy.feedback]); default slack",
            )
            p.add_argument(
                "--param",
                required=True,
                help="a numeric field of the policy's parameters, e.g. arrival_quantile "
                "(slack) or setpoint (adaptive)",
            )
            p.add_argument("--values", type=_floats, required=True)
            p.add_argument(
                "--seeds",
                type=_ints,
                default=None,
                help=f"e.g. 0,1,2,3,4 (default {','.join(map(str, TUNE_SEEDS))})",
            )
            p.add_argument("-o", "--out-dir", default="out/tune")
            p.set_defaults(run=_cmd_tune)

    for p in sub.choices.values():
        p.set_defaults(argv=None)

    p = sub.add_parser("bench", help="the core's cost per decision and the simulator's speed")
    p.add_argument("--results-dir", type=Path, default=Path("results"))
    p.set_defaults(run=_cmd_bench)
    add_generative_parser(sub)
    return parser


def _day_options(p: argparse.ArgumentParser, d: DayCycle) -> None:
    g = p.add_argument_group("--arrival day: compressed days with bursts")
    g.add_argument(
        "--shape",
        default=d.shape,
        help=f"the day's shape: diurnal (synthetic), {', '.join(SHAPES)} (production shapes, "
        "sources in simulator/shapes.py) or a file of relative rates, one per equal slice",
    )
    g.add_argument("--days", type=float, default=d.days, help=f"days in the run ({d.days:g})")
    g.add_argument(
        "--trough", type=float, default=d.trough, help=f"diurnal's low over its peak ({d.trough})"
    )
    g.add_argument("--burst-factor", type=float, default=d.burst_factor)
    g.add_argument("--burst-s", type=float, default=d.burst_s, help="how long a burst lasts")
    g.add_argument(
        "--burst-gap-s", type=float, default=d.burst_gap_s, help="mean time between bursts"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    if args.cmd == "simulate" and args.load is None and args.rate is None:
        args.load = 0.5
    to_stderr = bool(getattr(args, "json", False))
    stream = sys.stderr if to_stderr else sys.stdout
    console = Console(stderr=to_stderr, width=None if stream.isatty() else PIPE_WIDTH)
    try:
        return int(args.run(args, console))
    except (ValueError, KeyError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
