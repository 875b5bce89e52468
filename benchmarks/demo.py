"""``make demo``: the main job. The embedded stack (real Triton, simulated GPU, the sidecar), the
same load under ``max``, ``default``, ``seed``, ``slack`` and ``adaptive`` (the default policy),
a table of energy and latency, a plot. ``--gpus 2``: one sidecar in front of two simulated GPUs,
each with its own Triton, requests placed as ``--placement`` says."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from api.config import from_options
from api.embedded import SIMNET
from benchmarks.live import PolicyRun, compare_live, plot, write_csv
from dvfs.__main__ import PIPE_WIDTH
from scheduler.placement import DEFAULT_PLACEMENT, PLACEMENTS


def table(runs: list[PolicyRun]) -> Table:
    base = next((r for r in runs if r.policy == "max"), runs[0])
    view = Table(
        title=f"same Poisson load ({runs[0].rate_rps:g} req/s asked) through each policy, "
        f"SLO {runs[0].slo_ms:g} ms"
    )
    for col in (
        "policy",
        "sent/s",
        "done/s",
        "p50 ms",
        "p99 ms",
        "SLO met",
        "J/inference",
        "vs max",
        "mean MHz",
        "clocks",
    ):
        view.add_column(col, justify="right")
    several = any(r.by_gpu for r in runs)
    if several:
        view.add_column("served by GPU", justify="right")
    for r in runs:
        saving = 1.0 - r.energy_per_inference_j / base.energy_per_inference_j
        p99 = f"{r.p99_ms:.1f}" if r.p99_ms <= r.slo_ms else f"[red]{r.p99_ms:.1f}[/red]"
        view.add_row(
            r.policy,
            f"{r.achieved_rps:.1f}",
            f"{r.throughput_rps:.1f}",
            f"{r.p50_ms:.1f}",
            p99,
            f"{r.slo_attainment:.1%}",
            f"{r.energy_per_inference_j:.3f}",
            "—" if r is base else f"{-saving:+.0%}",
            f"{r.mean_clock_mhz:.0f}",
            str(r.clocks_seen),
            *([r.by_gpu] if several else []),
        )
    return view


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.demo", description=__doc__)
    parser.add_argument("--gpu", default="v100", help="simulated GPU profile")
    parser.add_argument(
        "--gpus", type=int, default=1, help="simulated GPUs behind the sidecar (one Triton each)"
    )
    parser.add_argument(
        "--placement", choices=PLACEMENTS, default=DEFAULT_PLACEMENT, help="with several GPUs"
    )
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second (Poisson)")
    parser.add_argument("--duration-s", type=float, default=20.0, help="per policy")
    parser.add_argument("--slo-ms", type=float, default=40.0)
    parser.add_argument("--policies", default="max,default,seed,slack,adaptive")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--out-dir", type=Path, default=Path("out/demo"))
    args = parser.parse_args(argv)
    if args.gpus < 1:
        parser.error(f"--gpus must be at least 1, got {args.gpus}")
    console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)
    device = f"sim:{args.gpu}" if args.gpus == 1 else f"sim:{args.gpu}x{args.gpus}"
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    node = (
        f"{args.gpus} Tritons + {args.gpus} simulated {args.gpu}s"
        if args.gpus > 1
        else (f"Triton + simulated {args.gpu}")
    )
    console.print(
        f"starting the embedded stack ({node} + sidecar); the first run profiles the emulated "
        "model, later runs use the cached table"
    )
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(policy: str, done: int, total: int) -> None:
            if policy not in tasks:
                tasks[policy] = bar.add_task(f"policy {policy}", total=total)
            bar.update(tasks[policy], completed=done)

        runs = compare_live(
            policies=policies,
            rate_rps=args.rate,
            duration_s=args.duration_s,
            slo_ms=args.slo_ms,
            seed=args.seed,
            config=from_options(device=device, profile_models=(SIMNET,), placement=args.placement),
            progress=progress,
        )
    console.print(table(runs))
    write_csv(runs, args.out_dir / "demo.csv")
    console.print(f"wrote {args.out_dir / 'demo.csv'} and {plot(runs, args.out_dir / 'demo.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
