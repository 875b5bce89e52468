"""The same streamed LLM load through each clock policy on the live stack: joules per output
token and the token tails against their SLOs.

Starts the embedded default on a simulated GPU with an LLM profile (``simllm``: an emulated
continuously batching engine whose iterations take as long, and draw as much power, as the
simulated GPU says at the clock the sidecar set) in a process of its own. Then for each policy:
switch it through the admin API, send the same seeded Poisson arrivals of the same synthetic
requests open-loop with loadgen's generative client (Triton's ``generate_stream``, the token
SLOs as hints), and read the GPU's energy counter and clock from the sidecar's ``/metrics``.

Each policy first runs ``warmup_s`` of the load unmeasured: the token policy decides nothing
before it has seen enough finished streams, as it would have in a sidecar serving for hours.
Then the measured window: energy read at its start and after the last token, joules per
output token over the tokens that left in that window (whichever request they belong to), and
the tails over the requests sent in it.

Then, given the GPU's clocks, the best single clock in hindsight (``best-fixed``), searched as
the CNN demo searches it (:func:`benchmarks.live.best_fixed`: a bisection for the lowest clock
whose p99 TTFT and p99 TPOT both meet their SLOs, then up while joules per output token fall),
each clock's run sending the measured window's streams after only the warm-up's last
``FIXED_WARMUP_S``; ``max``'s run stands for the top clock.
"""

from __future__ import annotations

import asyncio
import csv
import math
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Self

import numpy as np

from benchmarks.live import (
    BEST_FIXED,
    best_fixed,
    percentile_interval_ms,
    plot_label,
    set_policy,
)
from benchmarks.sidecar import running
from loadgen.engine import new_session, schedule
from loadgen.generative import TokenSloSpec, per_request
from loadgen.genrun import GenRun, open_loop, read_energy_j
from loadgen.metrics import ClockSampler
from loadgen.stream import GENERATE_STREAM, GenTarget, TimedStream
from loadgen.synthetic import GenRequest, LengthSpec, RequestSource

MODEL = "simllm"
# Before each fixed clock's run, the warm-up's last seconds unmeasured: a locked clock learns
# nothing, and a stream lives about 2 s (TTFT under 0.5 s, 64 tokens at under 30 ms each), so
# by then the engine holds as many streams as in the measured window.
FIXED_WARMUP_S = 5.0


@dataclass(frozen=True)
class GenWorkload:
    """What every policy is sent: Poisson arrivals and synthetic lengths, seeded."""

    rate_rps: float = 8.0
    duration_s: float = 60.0  # measured, after the warm-up
    warmup_s: float = 30.0  # the token policy trusts its static clock after 200 streams
    input_tokens: LengthSpec = field(default_factory=lambda: LengthSpec(1000, 200.0))
    output_tokens: LengthSpec = field(default_factory=lambda: LengthSpec(64, 16.0))
    ttft_ms: float = 500.0
    tpot_ms: float = 30.0
    seed: int = 0

    def requests(self) -> tuple[list[float], list[GenRequest]]:
        """Send times (s from the start, warm-up included) and the requests."""
        span_s = self.warmup_s + self.duration_s
        times = schedule(self.rate_rps, span_s, "poisson", np.random.default_rng(self.seed))
        source = RequestSource(self.input_tokens, self.output_tokens, seed=self.seed)
        return [float(t) for t in times], source.take(len(times))


@dataclass(frozen=True)
class GenPolicyRun:
    policy: str
    rate_rps: float
    sent: int
    completed: int
    output_tokens: int
    output_tokens_per_s: float
    p50_ttft_ms: float
    p99_ttft_ms: float
    p50_tpot_ms: float
    p99_tpot_ms: float
    p99_ttft_low_ms: float  # the p99's 95% confidence interval
    p99_ttft_high_ms: float
    p99_tpot_low_ms: float
    p99_tpot_high_ms: float
    ttft_slo_ms: float
    tpot_slo_ms: float
    slo_attainment: float
    energy_j: float
    energy_per_token_j: float
    mean_clock_mhz: float
    clocks_seen: int
    fixed_mhz: int | None = None  # best-fixed: the clock chosen
    fixed_runs: int = 0  # best-fixed: how many fixed clocks the search ran
    fixed_complete: bool = True  # best-fixed: False where the search stopped at its budget

    @property
    def meets_slo(self) -> bool:
        """Whether both p99s, TTFT and TPOT, are within their SLOs."""
        return self.p99_ttft_ms <= self.ttft_slo_ms and self.p99_tpot_ms <= self.tpot_slo_ms

    @property
    def cost_j(self) -> float:
        """What the search for the best single clock minimises: joules per output token."""
        return self.energy_per_token_j

    def as_best_fixed(self, clock_mhz: int, runs: int, complete: bool) -> Self:
        return replace(
            self, policy=BEST_FIXED, fixed_mhz=clock_mhz, fixed_runs=runs, fixed_complete=complete
        )


@dataclass
class Window:
    """A policy's measured window: the streams sent in it, every token's time (all streams),
    the energy counter at its ends."""

    streams: list[TimedStream]
    token_times_s: list[float]
    start_s: float
    end_s: float
    energy_j: float | None

    @property
    def tokens(self) -> int:
        return sum(self.start_s <= t <= self.end_s for t in self.token_times_s)


def p99_interval_ms(values_ms: Sequence[float]) -> tuple[float, float]:
    """The p99's 95% confidence interval (ms) from the sample's order statistics (nan, nan
    where too few): over a couple of hundred streams the p99 is one of the two or three
    slowest, and moves by much more than the policies differ by."""
    return percentile_interval_ms([v / 1000.0 for v in values_ms], 99.0)


def policy_run(
    policy: str, work: GenWorkload, window: Window, clock: ClockSampler | None
) -> GenPolicyRun:
    """One policy's figures (TPOT: aiperf's inter-token latency, per request)."""
    run = GenRun(window.streams)
    report = run.report(TokenSloSpec(work.ttft_ms, work.tpot_ms))
    values_ms = per_request(run.records)
    ttft_low, ttft_high = p99_interval_ms(values_ms["time_to_first_token"])
    tpot_low, tpot_high = p99_interval_ms(values_ms["inter_token_latency"])
    joules = window.energy_j if window.energy_j is not None else math.nan
    tokens = window.tokens
    span_s = window.end_s - window.start_s
    return GenPolicyRun(
        policy=policy,
        rate_rps=work.rate_rps,
        sent=len(run.streams),
        completed=len(run.records),
        output_tokens=tokens,
        output_tokens_per_s=tokens / span_s if span_s > 0 else math.nan,
        p50_ttft_ms=report["time_to_first_token"]["p50"],
        p99_ttft_ms=report["time_to_first_token"]["p99"],
        p50_tpot_ms=report["inter_token_latency"]["p50"],
        p99_tpot_ms=report["inter_token_latency"]["p99"],
        p99_ttft_low_ms=ttft_low,
        p99_ttft_high_ms=ttft_high,
        p99_tpot_low_ms=tpot_low,
        p99_tpot_high_ms=tpot_high,
        ttft_slo_ms=work.ttft_ms,
        tpot_slo_ms=work.tpot_ms,
        slo_attainment=report.get("slo_attainment", {}).get("both", math.nan),
        energy_j=joules,
        energy_per_token_j=joules / tokens if tokens else math.nan,
        mean_clock_mhz=(clock.mean_mhz if clock is not None else None) or math.nan,
        clocks_seen=len(clock.distinct_mhz) if clock is not None else 0,
    )


async def run_policies(
    url: str,
    admin_token: str,
    policies: Sequence[str],
    work: GenWorkload,
    progress: Callable[[str, int, int], None] | None = None,
    best_fixed_clocks: Sequence[int] = (),
    fixed_warmup_s: float = FIXED_WARMUP_S,
) -> list[GenPolicyRun]:
    """The workload through each policy on the sidecar at ``url`` (``host:port``); then, where
    ``best_fixed_clocks`` (the GPU's) are given, the search for ``best-fixed`` on the same
    arrivals (its run appended, named so; ``max``'s run stands for the top clock), each fixed
    clock's run after the warm-up's last ``fixed_warmup_s`` only."""
    times, requests = work.requests()
    hints: dict[str, Any] = {"client_id": "demo", "ttft_ms": work.ttft_ms, "tpot_ms": work.tpot_ms}
    target = GenTarget(f"http://{url}", GENERATE_STREAM, MODEL, hints)
    metrics_url = f"http://{url}/metrics"
    async with new_session(timeout_s=600.0) as session:

        async def measure(policy: str, warmup_s: float) -> GenPolicyRun:
            """One run: the last ``warmup_s`` of the warm-up's arrivals unmeasured, then the
            measured window's (the same for every run)."""
            skip_s = work.warmup_s - warmup_s
            first = next((i for i, t in enumerate(times) if t >= skip_s), len(times))
            sent_times = [t - skip_s for t in times[first:]]
            await set_policy(session, url, admin_token, policy)
            await asyncio.sleep(0.5)  # let the clock settle
            clock = ClockSampler(session, metrics_url, period_s=0.2)
            marks: dict[str, float | None] = {}

            async def mark() -> None:
                await asyncio.sleep(warmup_s)
                marks["energy_j"] = await read_energy_j(session, metrics_url)
                marks["start_s"] = time.perf_counter()
                clock.start()

            tick = None
            if progress is not None:
                tick = lambda n: progress(policy, n, len(sent_times))  # noqa: E731
            marker = asyncio.create_task(mark())
            try:
                streams = await open_loop(
                    session, target, requests[first:], sent_times, on_done=tick
                )
                await marker
            finally:
                marker.cancel()
                await clock.stop()
            end_s = time.perf_counter()
            after = await read_energy_j(session, metrics_url)
            before, start_s = marks.get("energy_j"), marks.get("start_s") or end_s
            window = Window(
                streams=streams[sum(t < warmup_s for t in sent_times) :],
                token_times_s=[t for s in streams for t in s.token_times_s],
                start_s=start_s,
                end_s=end_s,
                energy_j=after - before if after is not None and before is not None else None,
            )
            return policy_run(policy, work, window, clock)

        runs = [await measure(policy, work.warmup_s) for policy in policies]
        if best_fixed_clocks:
            warmup_s = min(work.warmup_s, fixed_warmup_s)
            runs.append(
                await best_fixed(
                    best_fixed_clocks, lambda mhz: measure(f"fixed:{mhz}", warmup_s), runs
                )
            )
    return runs


def compare_generative(
    *,
    gpu: str = "h100",
    policies: Sequence[str] = ("max", "tokens"),
    work: GenWorkload | None = None,
    state_dir: Path,
    progress: Callable[[str, int, int], None] | None = None,
    engine_profile: Path | None = None,
    best_fixed_clocks: Sequence[int] = (),
) -> list[GenPolicyRun]:
    """Start the embedded default on simulated ``gpu`` and run the same workload under each
    policy (the token policy holding the workload's SLOs, and planning with ``engine_profile``
    when given instead of the embedded engine's own); then, given the GPU's clocks, search
    them for ``best-fixed``."""
    work = work or GenWorkload()
    token = secrets.token_urlsafe(16)
    flags = [
        "--device", f"sim:{gpu}", "--profile-models", "", "--policy", "max",
        "--ttft-ms", str(work.ttft_ms), "--tpot-ms", str(work.tpot_ms), "--max-queue", "4096",
    ]  # fmt: skip
    if engine_profile is not None:
        flags += ["--engine-profile", str(engine_profile)]
    with running(flags, state_dir=state_dir, admin_token=token, starts=3) as sc:
        return asyncio.run(run_policies(sc.url, token, policies, work, progress, best_fixed_clocks))


def write_csv(runs: Sequence[GenPolicyRun], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(asdict(runs[0])))
        writer.writeheader()
        for r in runs:
            writer.writerow(asdict(r))
    return path


def plot(runs: Sequence[GenPolicyRun], path: Path) -> Path:
    """Joules per output token, and p99 TTFT and TPOT against their SLOs, per policy."""
    from time2clock.plot import pyplot

    plt = pyplot()
    names = [plot_label(r.policy, r.fixed_mhz) for r in runs]
    colors = [f"C{i}" for i in range(len(runs))]
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    nan = math.nan
    panels = (
        ([(r.energy_per_token_j, nan, nan) for r in runs], "energy per output token (J)", None),
        ([(r.p99_ttft_ms, r.p99_ttft_low_ms, r.p99_ttft_high_ms) for r in runs],
         "p99 time to first token (ms, 95% CI)", runs[0].ttft_slo_ms),
        ([(r.p99_tpot_ms, r.p99_tpot_low_ms, r.p99_tpot_high_ms) for r in runs],
         "p99 time per output token (ms, 95% CI)", runs[0].tpot_slo_ms),
    )  # fmt: skip
    for ax, (bars, label, slo) in zip(axes, panels, strict=True):
        values = [v for v, _, _ in bars]
        # a p99's interval as error bars (none where the run is too short to have one)
        below = [0.0 if math.isnan(lo) else v - lo for v, lo, _ in bars]
        above = [0.0 if math.isnan(hi) else hi - v for v, _, hi in bars]
        errors = [below, above] if any(below) or any(above) else None
        ax.bar(names, values, color=colors, yerr=errors, capsize=6)
        ax.set_ylabel(label)
        if slo is not None:
            ax.axhline(slo, color="red", linestyle="--", label=f"SLO {slo:g} ms")
            ax.legend()
    fig.suptitle(
        f"live stack, simllm: {runs[0].rate_rps:g} req/s Poisson, same arrivals for each policy"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
