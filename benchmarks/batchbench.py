"""Batching through the sidecar, on the embedded default: is Triton's batcher kept fed, and does
the energy policy still save at a high load?

1. **Throughput kept.** Closed loops at concurrency 32 to each emulated model (``simnet``, a
   CNN, and ``simbert``, a transformer that batches less well), straight to Triton and through
   the sidecar (policy ``max``, its own process, default in-flight cap), alternating A B A B.
2. **Energy at 70% of capacity.** Poisson arrivals at 70% of the direct throughput just measured,
   the same arrivals under ``max``, ``slack`` and ``adaptive``: joules per inference (the
   simulated GPU's counter, from the sidecar's /metrics), p99 against the SLO (``--slo-mult`` ×
   the model's full batch at the top clock, as ``python -m scheduler compare`` sets it), mean
   clock.

Printed, never asserted: ratios side by side in one run, since the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import secrets
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from api.config import default_state_dir
from api.embedded import EMULATED, INPUT_WIDTH, SIMBERT, SIMNET
from benchmarks.bench import Run, measure, sidecar_process
from benchmarks.live import set_policy
from dvfs.profiles import get_profile
from loadgen.classes import RequestClass
from loadgen.engine import Recorder, Target, build_payloads, new_session, open_loop, schedule
from loadgen.metrics import ClockSampler, energy_j, scrape
from simulator.results import DEFAULT_DIR, markdown_table, write_results

GPU = "v100"  # the sidecar_process's simulated GPU


@dataclass(frozen=True)
class EnergyRun:
    policy: str
    completed: int
    p99_ms: float
    slo_attainment: float
    energy_per_inference_j: float
    mean_clock_mhz: float


def full_batch_ms(gpu: str, model: str) -> float:
    """The emulated model's full batch at the simulated GPU's top clock."""
    profile = get_profile(gpu)
    law = profile.model(EMULATED[model])
    return law.mean_latency_ms(profile.max_clock_mhz, law.max_batch)


async def _policy_run(
    url: str, token: str, policy: str, model: str, send_times: list[float], slo_ms: float
) -> EnergyRun:
    data = np.ones((1, INPUT_WIDTH), dtype=np.float32)
    classes = [RequestClass("bench", slo_ms=slo_ms)]
    target = Target(url, model, build_payloads(classes, data=data), [1.0])
    async with new_session() as session:
        await set_policy(session, url, token, policy)
        await asyncio.sleep(0.5)
        metrics_url = f"http://{url}/metrics"
        before = energy_j(await scrape(session, metrics_url)) or 0.0
        clock = ClockSampler(session, metrics_url)
        clock.start()
        rec = Recorder()
        await open_loop(session, target, send_times, rec, np.random.default_rng(0))
        await clock.stop()
        after = energy_j(await scrape(session, metrics_url)) or 0.0
    ok = [s.latency_s * 1000.0 for s in rec.samples if s.status == 200]
    return EnergyRun(
        policy,
        len(ok),
        float(np.percentile(ok, 99)) if ok else math.nan,
        sum(x <= slo_ms for x in ok) / len(ok) if ok else math.nan,
        (after - before) / len(ok) if ok else math.nan,
        clock.mean_mhz or math.nan,
    )


def _report(
    kept: dict[str, tuple[Run, Run]],
    energy: dict[str, list[EnergyRun]],
    args: argparse.Namespace,
) -> str:
    """The results file's body: throughput kept per model, then energy and tail per policy."""
    kept_rows = [
        (
            model,
            f"{s.throughput / d.throughput:.0%}",
            f"{s.throughput:.0f} vs {d.throughput:.0f}",
            f"{s.p50_us / 1000:.1f} vs {d.p50_us / 1000:.1f}",
        )
        for model, (d, s) in kept.items()
    ]
    energy_rows = []
    for model, (top, *others) in energy.items():
        slo_ms = args.slo_mult * full_batch_ms(GPU, model)
        for e in (top, *others):
            vs_max = e.energy_per_inference_j / top.energy_per_inference_j
            energy_rows.append(
                (
                    model,
                    e.policy,
                    f"{e.energy_per_inference_j:.3f}",
                    "—" if e is top else f"{vs_max:.2f}",
                    f"{e.p99_ms:.1f}" + ("" if e.p99_ms <= slo_ms else " (over)"),
                    f"{slo_ms:.0f}",
                    f"{e.slo_attainment:.1%}",
                    f"{e.mean_clock_mhz:.0f}",
                )
            )
    return "\n\n".join(
        [
            f"Throughput kept: closed loops at concurrency {args.concurrency}, straight to the "
            f"embedded Triton and through the sidecar (policy max), the best of "
            f"{args.rounds} round(s) of {args.duration_s:g} s.",
            markdown_table(
                ["model", "throughput kept", "infer/s: sidecar vs direct", "p50 ms"], kept_rows
            ),
            f"Energy: Poisson arrivals at {args.load:.0%} of the direct throughput for "
            f"{args.energy_duration_s:g} s, the same arrivals under each policy; SLO "
            f"{args.slo_mult:g}× the model's full batch at the top clock (simulated {GPU}).",
            markdown_table(
                [
                    "model",
                    "policy",
                    "J/inference",
                    "vs max",
                    "p99 ms",
                    "SLO ms",
                    "SLO met",
                    "mean MHz",
                ],
                energy_rows,
            ),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.batchbench", description=__doc__)
    parser.add_argument("--models", default=f"{SIMNET},{SIMBERT}")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--load", type=float, default=0.7, help="of the direct throughput")
    parser.add_argument("--energy-duration-s", type=float, default=20.0)
    parser.add_argument("--slo-mult", type=float, default=3.0)
    parser.add_argument(
        "--state-dir", type=Path, default=default_state_dir(), help="tables cached here"
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=DEFAULT_DIR,
        help="where batchbench.md and batchbench.json are written (default: results)",
    )
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    token = secrets.token_urlsafe(12)
    extra = ["--profile-models", ",".join(models), "--policy", "max"]
    print("starting the sidecar (the first run profiles each model, a minute or two)...")
    with sidecar_process(
        args.state_dir, *extra, max_inflight=256, token=token, start_timeout_s=600.0
    ) as ends:
        url, triton = ends.sidecar["http"], ends.triton["http"]
        print(f"sidecar {url} (policy max, cap 256 in flight) in front of Triton {triton}")
        kept: dict[str, tuple[Run, Run]] = {}
        for model in models:
            runs: dict[str, list[Run]] = {"direct": [], "sidecar": []}
            for _ in range(args.rounds):
                for label, where in (("direct", triton), ("sidecar", url)):
                    r = measure(where, args.concurrency, args.duration_s, label, model=model)
                    runs[label].append(r)
                    print(
                        f"  {model:8s} c={args.concurrency} {label:>8} {r.throughput:7.0f} "
                        f"infer/s p50 {r.p50_us / 1000:6.1f} ms p99 {r.p99_us / 1000:6.1f} ms",
                        flush=True,
                    )
            kept[model] = tuple(  # type: ignore[assignment]
                max(runs[label], key=lambda r: r.throughput) for label in ("direct", "sidecar")
            )
        energy: dict[str, list[EnergyRun]] = {}
        for model in models:
            direct = kept[model][0].throughput
            rate = args.load * direct
            slo_ms = args.slo_mult * full_batch_ms(GPU, model)
            send_times = list(
                schedule(rate, args.energy_duration_s, "poisson", np.random.default_rng(7))
            )
            print(f"  {model}: {rate:.0f} req/s Poisson for {args.energy_duration_s:g} s, "
                  f"SLO {slo_ms:.0f} ms", flush=True)  # fmt: skip
            energy[model] = [
                asyncio.run(_policy_run(url, token, policy, model, send_times, slo_ms))
                for policy in ("max", "slack", "adaptive")
            ]
    print(f"\nthroughput kept at concurrency {args.concurrency} (best of {args.rounds} rounds):")
    for model, (d, s) in kept.items():
        print(
            f"  {model:8s} {s.throughput / d.throughput:5.0%} ({s.throughput:.0f} vs "
            f"{d.throughput:.0f} infer/s); p50 {s.p50_us / 1000:.1f} vs {d.p50_us / 1000:.1f} ms"
        )
    print(f"\nenergy at {args.load:.0%} of the direct throughput, the same arrivals:")
    for model, (top, *others) in energy.items():
        slo = args.slo_mult * full_batch_ms(GPU, model)
        for e in (top, *others):
            print(
                f"  {model:8s} {e.policy:8s} {e.energy_per_inference_j:7.3f} J/inf "
                f"p99 {e.p99_ms:6.1f} ms (SLO {slo:.0f}) met {e.slo_attainment:6.1%} "
                f"mean {e.mean_clock_mhz:5.0f} MHz"
            )
        for e in others:
            ratio = e.energy_per_inference_j / top.energy_per_inference_j
            verdict = "under" if e.p99_ms <= slo else "OVER"
            print(
                f"  {model:8s} {e.policy} vs max: {ratio:.2f} of the energy per inference; "
                f"p99 {verdict}"
            )
    md, _ = write_results(
        "batchbench",
        title="Batching through the sidecar (python -m benchmarks.batchbench)",
        markdown=_report(kept, energy, args),
        data={
            "settings": {**vars(args), "gpu": GPU},
            "throughput_kept": {
                model: {"direct": asdict(d), "sidecar": asdict(s)} for model, (d, s) in kept.items()
            },
            "energy": {
                model: {
                    "slo_ms": args.slo_mult * full_batch_ms(GPU, model),
                    "runs": [asdict(e) for e in runs],
                }
                for model, runs in energy.items()
            },
        },
        directory=args.results_dir,
    )
    print(f"\nwritten to {md} (and .json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
