"""``make demo``: the main job. The embedded stack (real Triton, simulated GPU, the sidecar), the
same load under ``max``, ``default``, ``seed``, ``slack`` and ``adaptive`` (the default policy),
a table of energy and latency, a plot (``--gpus 2``: one sidecar in front of two simulated
GPUs, each with its own Triton, requests placed as ``--placement`` says). Then a generative run
beside it: an emulated LLM engine on a simulated H100, the same streamed load under ``max``,
``default`` (the GPU's own boost) and the token policy ``tokens``, joules per output token
and the p99 TTFT and TPOT against their SLOs. Each part ends with the best single clock in
hindsight on its own arrivals (``best-fixed``), searched live."""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections.abc import Sequence
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
from benchmarks import genlive
from benchmarks.genlive import GenPolicyRun, GenWorkload, compare_generative
from benchmarks.live import (
    BEST_FIXED,
    PolicyRun,
    add_load_arguments,
    check_load_arguments,
    compare_live,
    plot,
    write_csv,
)
from dvfs.__main__ import PIPE_WIDTH
from dvfs.profiles import get_profile
from loadgen.synthetic import LengthSpec
from scheduler.placement import DEFAULT_PLACEMENT, PLACEMENTS


def table(runs: list[PolicyRun], outside_ms: float = 0.0) -> Table:
    base = next((r for r in runs if r.policy == "max"), runs[0])
    slo_ms = runs[0].slo_ms
    held = f" ({slo_ms - outside_ms:g} ms of it the sidecar's)" if outside_ms > 0 else ""
    view = Table(
        title=f"same Poisson load ({runs[0].rate_rps:g} req/s asked) through each policy, "
        f"p99 SLO {slo_ms:g} ms at the client{held}"
    )
    for col in (
        "policy",
        "sent/s",
        "done/s",
        "p50 ms",
        "p99 ms",
        "p99 95% CI",
        "SLO met",
        "J/inference",
        "vs max",
        "mean MHz",
        "clocks",
    ):
        view.add_column(col, justify="right")
    for r in runs:
        saving = 1.0 - r.energy_per_inference_j / base.energy_per_inference_j
        p99 = f"{r.p99_ms:.1f}" if r.meets_slo else f"[red]{r.p99_ms:.1f}[/red]"
        view.add_row(
            r.policy,
            f"{r.achieved_rps:.1f}",
            f"{r.throughput_rps:.1f}",
            f"{r.p50_ms:.1f}",
            p99,
            "—" if math.isnan(r.p99_low_ms) else f"{r.p99_low_ms:.1f}–{r.p99_high_ms:.1f}",
            f"{r.slo_attainment:.1%}",
            f"{r.energy_per_inference_j:.3f}",
            "—" if r is base else f"{-saving:+.0%}",
            f"{r.mean_clock_mhz:.0f}",
            str(r.clocks_seen),
        )
    return view


def generative_table(runs: list[GenPolicyRun]) -> Table:
    base = next((r for r in runs if r.policy == "max"), runs[0])
    first = runs[0]
    view = Table(
        title=f"same streamed load ({first.rate_rps:g} req/s Poisson) into simllm through each "
        f"policy, SLOs p99 TTFT {first.ttft_slo_ms:g} ms, p99 TPOT {first.tpot_slo_ms:g} ms"
    )
    for col in (
        "policy",
        "requests",
        "tokens/s",
        "p50 TTFT ms",
        "p99 TTFT ms (95% CI)",
        "p50 TPOT ms",
        "p99 TPOT ms (95% CI)",
        "SLOs met",
        "J/token",
        "vs max",
        "mean MHz",
        "clocks",
    ):
        view.add_column(col, justify="right")

    def tail(value: float, low: float, high: float, slo: float) -> str:
        shown = f"{value:.1f}" if value <= slo else f"[red]{value:.1f}[/red]"
        return shown if math.isnan(low) else f"{shown} ({low:.0f}–{high:.0f})"

    for r in runs:
        saving = 1.0 - r.energy_per_token_j / base.energy_per_token_j
        view.add_row(
            r.policy,
            f"{r.completed}/{r.sent}",
            f"{r.output_tokens_per_s:.0f}",
            f"{r.p50_ttft_ms:.1f}",
            tail(r.p99_ttft_ms, r.p99_ttft_low_ms, r.p99_ttft_high_ms, r.ttft_slo_ms),
            f"{r.p50_tpot_ms:.1f}",
            tail(r.p99_tpot_ms, r.p99_tpot_low_ms, r.p99_tpot_high_ms, r.tpot_slo_ms),
            f"{r.slo_attainment:.1%}",
            f"{r.energy_per_token_j:.3f}",
            "—" if r is base else f"{-saving:+.0%}",
            f"{r.mean_clock_mhz:.0f}",
            str(r.clocks_seen),
        )
    return view


def print_best_fixed(
    console: Console, runs: Sequence[PolicyRun | GenPolicyRun], clocks: int, max_ran: bool
) -> None:
    """The line under a table that says which clock ``best-fixed`` is and how it was found."""
    for r in runs:
        if r.policy != BEST_FIXED or r.fixed_mhz is None:
            continue
        console.print(
            f"{BEST_FIXED}: the best single clock in hindsight on these arrivals, "
            f"{r.fixed_mhz} MHz (fixed:{r.fixed_mhz}), searched among the GPU's "
            f"{clocks} clocks in {r.fixed_runs} more runs"
            + (" (max's run stands for the top)" if max_ran else "")
            + (
                ""
                if r.fixed_complete
                else "; the search stopped at its budget, so this is the cheapest of its "
                "runs that met the SLO, and a better clock may lie above it"
            )
        )


def run_generative(args: argparse.Namespace, console: Console) -> None:
    """The generative part of the demo: its own stack, a table, a CSV and a plot."""
    work = GenWorkload(
        rate_rps=args.gen_rate,
        duration_s=args.gen_duration_s,
        warmup_s=args.gen_warmup_s,
        input_tokens=LengthSpec(args.gen_input_tokens, args.gen_input_tokens / 5),
        output_tokens=LengthSpec(args.gen_output_tokens, args.gen_output_tokens / 4),
        ttft_ms=args.ttft_ms,
        tpot_ms=args.tpot_ms,
        seed=args.seed,
    )
    policies = [p.strip() for p in args.gen_policies.split(",") if p.strip()]
    ladder = get_profile(args.gen_gpu).clocks_mhz
    console.print(
        f"starting a second stack (Triton + simulated {args.gen_gpu} + sidecar) serving simllm, "
        f"an emulated LLM engine; each policy gets {work.warmup_s:g} s of the load unmeasured, "
        f"then {work.duration_s:g} s measured"
    )
    with (
        tempfile.TemporaryDirectory(prefix="demo-generative-") as state,
        Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
        ) as bar,
    ):
        tasks: dict[str, TaskID] = {}

        def progress(policy: str, done: int, total: int) -> None:
            if policy not in tasks:
                tasks[policy] = bar.add_task(f"policy {policy} (streams)", total=total)
            bar.update(tasks[policy], completed=done)

        runs = compare_generative(
            gpu=args.gen_gpu,
            policies=policies,
            work=work,
            state_dir=Path(state),
            progress=progress,
            engine_profile=args.gen_engine_profile,
            best_fixed_clocks=ladder if args.gen_best_fixed else (),
        )
    console.print(generative_table(runs))
    print_best_fixed(console, runs, len(ladder), "max" in policies)
    csv_path = genlive.write_csv(runs, args.out_dir / "demo_generative.csv")
    png_path = genlive.plot(runs, args.out_dir / "demo_generative.png")
    console.print(f"wrote {csv_path} and {png_path}")


def run_cnn(args: argparse.Namespace, console: Console) -> None:
    """The CNN part of the demo: the embedded stack, every policy, a table, a CSV and a plot."""
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    device = f"sim:{args.gpu}" if args.gpus == 1 else f"sim:{args.gpu}x{args.gpus}"
    node = (
        f"{args.gpus} Tritons + {args.gpus} simulated {args.gpu}s"
        if args.gpus > 1
        else (f"Triton + simulated {args.gpu}")
    )
    console.print(
        f"starting the embedded stack ({node} + sidecar); the first run profiles the emulated "
        f"model, later runs use the cached table; each policy gets {args.warmup_s:g} s of the "
        f"load unmeasured, then {args.duration_s:g} s measured"
    )
    ladder = get_profile(args.gpu).clocks_mhz
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
            config=from_options(
                device=device,
                profile_models=(SIMNET,),
                placement=args.placement,
                slo_outside_ms=args.slo_outside_ms,
            ),
            progress=progress,
            warmup_s=args.warmup_s,
            best_fixed_clocks=ladder if args.best_fixed else (),
        )
    console.print(table(runs, args.slo_outside_ms))
    print_best_fixed(console, runs, len(ladder), "max" in policies)
    write_csv(runs, args.out_dir / "demo.csv")
    console.print(f"wrote {args.out_dir / 'demo.csv'} and {plot(runs, args.out_dir / 'demo.png')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.demo", description=__doc__)
    parser.add_argument("--gpu", default="v100", help="simulated GPU profile")
    parser.add_argument(
        "--gpus", type=int, default=1, help="simulated GPUs behind the sidecar (one Triton each)"
    )
    parser.add_argument(
        "--placement", choices=PLACEMENTS, default=DEFAULT_PLACEMENT, help="with several GPUs"
    )
    add_load_arguments(parser)
    parser.add_argument("--duration-s", type=float, default=30.0, help="per policy")
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=10.0,
        help="per policy, the same load unmeasured before the measured run (0: none)",
    )
    parser.add_argument("--policies", default="max,default,seed,slack,adaptive")
    parser.add_argument(
        "--best-fixed",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the policies, search the GPU's clocks for the best single clock in "
        "hindsight on the same arrivals (about nine more runs)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--out-dir", type=Path, default=Path("out/demo"))
    gen = parser.add_argument_group("the generative run")
    gen.add_argument("--no-generative", action="store_true", help="skip it")
    gen.add_argument("--generative-only", action="store_true", help="run only it")
    gen.add_argument("--gen-gpu", default="h100", help="simulated GPU with an LLM profile")
    gen.add_argument("--gen-rate", type=float, default=8.0, help="streams per second (Poisson)")
    gen.add_argument("--gen-duration-s", type=float, default=60.0, help="measured, per policy")
    gen.add_argument("--gen-warmup-s", type=float, default=30.0, help="unmeasured, per policy")
    gen.add_argument("--gen-input-tokens", type=int, default=1000, help="mean (stddev: 1/5)")
    gen.add_argument("--gen-output-tokens", type=int, default=64, help="mean (stddev: 1/4)")
    gen.add_argument("--gen-policies", default="max,default,tokens")
    gen.add_argument(
        "--gen-best-fixed",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the policies, search the GPU's clocks for the best single clock in "
        f"hindsight on the same streams (about eight more runs, each after "
        f"{genlive.FIXED_WARMUP_S:g} s unmeasured)",
    )
    gen.add_argument("--ttft-ms", type=float, default=500.0, help="p99 TTFT SLO")
    gen.add_argument("--tpot-ms", type=float, default=30.0, help="p99 TPOT SLO")
    gen.add_argument(
        "--gen-engine-profile",
        type=Path,
        default=None,
        help="the token policy plans with this engine profile (python -m time2clock "
        "profile-engine) instead of the embedded engine's own",
    )
    args = parser.parse_args(argv)
    check_load_arguments(parser, args)
    if args.gpus < 1:
        parser.error(f"--gpus must be at least 1, got {args.gpus}")
    console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)
    if not args.generative_only:
        run_cnn(args, console)
    if not args.no_generative:
        run_generative(args, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
