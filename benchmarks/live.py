"""The same load through each clock policy on the live stack: energy, tail latency, clock.

Starts the embedded default (real Triton, simulated GPU, sidecar) once, the sidecar in a process
of its own as it runs in service (sharing this one, the load generator and the sidecar would
take turns at one interpreter lock, and each would wait on the other's work), then for each
policy:
switch it through the admin API, send ``warmup_s`` of arrivals unmeasured (what a policy learns
at start, its tail controller's first climb included, is not what it does in service), then the
same seeded Poisson arrivals open-loop, measured, and read the
GPU's energy counter and clock from the sidecar's /metrics (on several GPUs: their energy summed,
their clocks averaged, and which GPU served each request).

Then, given the GPU's clocks, the best single clock in hindsight (``best-fixed``): the same
arrivals under ``fixed:MHZ``, searched as the simulator searches it
(:func:`simulator.bestfixed.cheapest_meeting`: a bisection for the lowest clock whose p99 meets
the SLO, then up while energy per inference falls), each run after ``FIXED_WARMUP_S`` of the load
unmeasured (a locked clock learns nothing); ``max``'s run stands for the top clock.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import math
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

import aiohttp
import numpy as np
from scipy.stats import binom

from api.config import GatewayConfig, to_flags
from api.embedded import INPUT_WIDTH, SIMNET
from benchmarks.sidecar import OWNED_FLAGS, running
from loadgen.classes import RequestClass
from loadgen.engine import (
    Recorder,
    Sample,
    Target,
    build_payloads,
    new_session,
    open_loop,
    schedule,
)
from loadgen.metrics import ClockSampler, energy_j, scrape
from simulator.bestfixed import STRIDE, cheapest_meeting

# The part of the SLO the live runs allow outside the sidecar (its --slo-outside-ms): their
# client is a Python process on the same cores, and its own send and receive of a request take
# up to 1.2-1.8 ms at the p99 on a two-core machine (python -m benchmarks.tailtrace measures
# it as "outside the sidecar"); a client measures them as part of each request's latency.
DEMO_OUTSIDE_MS = 1.5
BEST_FIXED = "best-fixed"
FIXED_WARMUP_S = 2.0  # before each fixed clock's run, the warm-up's first seconds unmeasured
BEST_FIXED_MAX_RUNS = 16  # a bisection of a ladder of 187 clocks takes 8


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's load and SLO options, shared by the commands that run it live."""
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second (Poisson)")
    parser.add_argument("--slo-ms", type=float, default=40.0, help="p99, at the client")
    parser.add_argument(
        "--slo-outside-ms",
        type=float,
        default=DEMO_OUTSIDE_MS,
        help="the sidecar's --slo-outside-ms: the client shares this machine's cores, and its "
        "own send and receive of each request (python -m benchmarks.tailtrace measures them) "
        "are part of the latency it measures",
    )


def check_load_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what :func:`add_load_arguments` added, when out of range (exits, as argparse)."""
    if not (args.rate > 0 and args.slo_ms > 0):
        parser.error("--rate and --slo-ms must be > 0")
    if not 0 <= args.slo_outside_ms < args.slo_ms:
        parser.error("--slo-outside-ms must be >= 0 and under --slo-ms")


@dataclass(frozen=True)
class PolicyRun:
    policy: str
    rate_rps: float
    achieved_rps: float
    sent: int
    completed: int
    refused: int
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    slo_ms: float
    slo_attainment: float
    energy_j: float
    energy_per_inference_j: float
    mean_clock_mhz: float
    clocks_seen: int
    by_gpu: str = ""  # share of the completed requests each GPU served, when several did
    p99_low_ms: float = math.nan  # a 95% confidence interval of the p99 (percentile_interval_ms)
    p99_high_ms: float = math.nan
    fixed_mhz: int | None = None  # best-fixed: the clock chosen
    fixed_runs: int = 0  # best-fixed: how many fixed clocks the search ran
    fixed_complete: bool = True  # best-fixed: False where the search stopped at its budget

    @property
    def meets_slo(self) -> bool:
        """Whether the run's p99 is within its SLO."""
        return self.p99_ms <= self.slo_ms

    @property
    def cost_j(self) -> float:
        """What the search for the best single clock minimises: joules per inference."""
        return self.energy_per_inference_j

    def as_best_fixed(self, clock_mhz: int, runs: int, complete: bool) -> Self:
        return replace(
            self, policy=BEST_FIXED, fixed_mhz=clock_mhz, fixed_runs=runs, fixed_complete=complete
        )


def percentile_ms(latencies_s: Sequence[float], q: float) -> float:
    return (
        float(np.percentile(np.asarray(latencies_s) * 1000.0, q)) if len(latencies_s) else math.nan
    )


def percentile_interval_ms(
    latencies_s: Sequence[float], q: float, confidence: float = 0.95
) -> tuple[float, float]:
    """A ``confidence`` interval of the ``q``-th percentile from the sample's own order
    statistics (distribution-free: the number of samples under the true percentile is
    binomial), in ms; nan where the sample is too small for the interval to have ends.

    A run's p99 is one of its few slowest requests: over a few hundred requests it moves by
    milliseconds from run to run, which the interval says where a single figure cannot."""
    n = len(latencies_s)
    tail = (1.0 - confidence) / 2.0
    low = int(binom.ppf(tail, n, q / 100.0))  # samples under the low end, at most
    high = int(binom.ppf(1.0 - tail, n, q / 100.0)) + 1
    if n == 0 or low < 1 or high > n:
        return math.nan, math.nan
    ordered = np.sort(np.asarray(latencies_s, dtype=np.float64)) * 1000.0
    return float(ordered[low - 1]), float(ordered[high - 1])


async def set_policy(session: aiohttp.ClientSession, url: str, token: str, policy: str) -> None:
    """Switch the sidecar at ``url`` to ``policy`` (``PUT /admin/policy`` with the admin token;
    ``fixed:MHZ``: ``PUT /admin/clock``, which holds that clock); RuntimeError with the
    sidecar's answer where it refuses."""
    body: dict[str, str | int] = {"policy": policy}
    path = "policy"
    if policy.startswith("fixed:"):
        path, body = "clock", {"clock_mhz": int(policy.removeprefix("fixed:"))}
    async with session.put(
        f"http://{url}/admin/{path}",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
    ) as resp:
        if resp.status != 200:
            raise RuntimeError(f"policy {policy!r}: HTTP {resp.status}: {await resp.text()}")


async def admin_state(session: aiohttp.ClientSession, url: str, token: str) -> dict[str, Any]:
    """The sidecar's ``GET /admin/state`` at ``url`` with the admin token, without stalling the
    caller's event loop (a load generator may be sending on it)."""
    async with session.get(
        f"http://{url}/admin/state", headers={"Authorization": f"Bearer {token}"}
    ) as resp:
        resp.raise_for_status()
        state: dict[str, Any] = await resp.json()
        return state


async def _run_one(
    session: aiohttp.ClientSession,
    sidecar_url: str,
    token: str,
    policy: str,
    target: Target,
    send_times: Sequence[float],
    rate_rps: float,
    slo_ms: float,
    seed: int,
    progress: Callable[[int], None] | None,
    warmup_times: Sequence[float] = (),
) -> PolicyRun:
    await set_policy(session, sidecar_url, token, policy)
    if warmup_times:  # the same load, other arrivals, not measured
        await open_loop(session, target, warmup_times, Recorder(), np.random.default_rng(seed + 1))
    await asyncio.sleep(0.5)  # let the clock settle
    metrics_url = f"http://{sidecar_url}/metrics"
    before = energy_j(await scrape(session, metrics_url)) or 0.0
    clock = ClockSampler(session, metrics_url)
    clock.start()
    rec = Recorder()
    started = time.monotonic()
    span = await open_loop(session, target, send_times, rec, np.random.default_rng(seed), progress)
    elapsed = time.monotonic() - started
    await clock.stop()
    after = energy_j(await scrape(session, metrics_url)) or 0.0
    ok = [s for s in rec.samples if s.status == 200]
    lat = [s.latency_s for s in ok]
    met = sum(s.latency_s * 1000.0 <= slo_ms for s in ok)
    joules = after - before
    p99_low_ms, p99_high_ms = percentile_interval_ms(lat, 99)
    return PolicyRun(
        policy=policy,
        rate_rps=rate_rps,
        achieved_rps=len(rec.samples) / max(span, 1e-9),
        sent=len(rec.samples),
        completed=len(ok),
        refused=sum(n for code, n in rec.errors.items() if code == 429),
        throughput_rps=len(ok) / elapsed,
        p50_ms=percentile_ms(lat, 50),
        p99_ms=percentile_ms(lat, 99),
        slo_ms=slo_ms,
        slo_attainment=met / len(ok) if ok else math.nan,
        energy_j=joules,
        energy_per_inference_j=joules / len(ok) if ok else math.nan,
        mean_clock_mhz=clock.mean_mhz or math.nan,
        clocks_seen=len(clock.distinct_mhz),
        by_gpu=gpu_shares(ok),
        p99_low_ms=p99_low_ms,
        p99_high_ms=p99_high_ms,
    )


class FixedRun(Protocol):
    """A live run at one locked clock, as the search for the best single clock sees it."""

    @property
    def policy(self) -> str: ...

    @property
    def meets_slo(self) -> bool: ...

    @property
    def cost_j(self) -> float: ...  # energy per unit of work: an inference, an output token

    def as_best_fixed(self, clock_mhz: int, runs: int, complete: bool) -> Self:
        """This run as ``best-fixed``: the clock chosen, how many fixed clocks the search ran,
        and whether it finished (False: it stopped at its budget)."""
        ...


R = TypeVar("R", bound=FixedRun)


def best_fixed_step(
    clocks_mhz: Sequence[int], runs: Mapping[int, FixedRun]
) -> tuple[int | None, int]:
    """One walk of :func:`simulator.bestfixed.cheapest_meeting` over ``clocks_mhz`` (ascending)
    with the fixed runs made so far (by clock): the first clock it asks for and has no run of
    (None once it has every run it needs: then its answer is final), and the index it chooses.
    Every question before that first gap is answered as the full search answers it, so running
    that clock and walking again is the search, one live run at a time."""
    missing: list[int] = []

    def run(i: int) -> FixedRun | None:
        found = runs.get(clocks_mhz[i])
        if found is None and not missing:
            missing.append(clocks_mhz[i])
        return found

    def meets(i: int) -> bool:
        r = run(i)
        return r is not None and r.meets_slo

    def cost(i: int) -> float:
        r = run(i)
        return math.inf if r is None else r.cost_j

    _, chosen = cheapest_meeting(len(clocks_mhz), meets=meets, cost=cost, stride=STRIDE)
    return (missing[0] if missing else None), chosen


async def best_fixed(
    clocks_mhz: Sequence[int],
    run_fixed: Callable[[int], Awaitable[R]],
    policy_runs: Sequence[R] = (),
    max_runs: int = BEST_FIXED_MAX_RUNS,
) -> R:
    """The best single clock among ``clocks_mhz`` (the GPU's ladder, in any order), each clock
    run at most once (:func:`best_fixed_step`); among ``policy_runs`` (the policies' runs on
    the same arrivals) ``max``'s stands for the top clock. Returns its run as ``best-fixed``,
    with the clock and the number of fixed clocks the search ran. After ``max_runs`` (the walk
    up from the lowest clock that meets the SLO can be long where the GPU's energy-optimal clock
    is far above it) the search stops, and the cheapest run that meets the SLO is chosen
    (``fixed_complete`` False)."""
    clocks_mhz = sorted(set(clocks_mhz))
    runs: dict[int, R] = {}
    for run in policy_runs:
        if run.policy == "max":
            runs[clocks_mhz[-1]] = run
    ran = 0
    while True:
        needed, chosen = best_fixed_step(clocks_mhz, runs)
        if needed is None:
            return runs[clocks_mhz[chosen]].as_best_fixed(clocks_mhz[chosen], ran, True)
        if ran == max_runs:
            break
        runs[needed] = await run_fixed(needed)
        ran += 1
    meeting = [c for c, r in runs.items() if r.meets_slo] or [max(runs)]
    clock = min(meeting, key=lambda c: runs[c].cost_j)
    return runs[clock].as_best_fixed(clock, ran, False)


def plot_label(policy: str, fixed_mhz: int | None) -> str:
    """A run's name under its bar: ``best-fixed`` with the clock it found."""
    return policy if fixed_mhz is None else f"{policy}\n{fixed_mhz} MHz"


def gpu_shares(samples: Sequence[Sample]) -> str:
    """``"0:52% 1:48%"``: which GPUs served the requests (``x-sidecar-gpu``), when several did."""
    served = Counter(s.gpu for s in samples if s.gpu is not None)
    if len(served) < 2:
        return ""
    total = sum(served.values())
    return " ".join(f"{g}:{n / total:.0%}" for g, n in sorted(served.items()))


def compare_live(
    *,
    policies: Sequence[str] = ("max", "seed", "slack", "adaptive"),
    rate_rps: float = 40.0,
    duration_s: float = 20.0,
    slo_ms: float = 40.0,
    seed: int = 0,
    config: GatewayConfig | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    warmup_s: float = 0.0,
    best_fixed_clocks: Sequence[int] = (),
) -> list[PolicyRun]:
    """Start the embedded stack and run the same arrivals under each policy, each after
    ``warmup_s`` of the same load unmeasured; then, where ``best_fixed_clocks`` (the GPU's) are
    given, search them for ``best-fixed`` (its run is appended, named so)."""
    token = secrets.token_urlsafe(16)
    cfg = config or GatewayConfig()
    cfg = replace(cfg, scheduler=replace(cfg.scheduler, default_slo_ms=slo_ms))
    flags = to_flags(cfg, leave_out=OWNED_FLAGS)
    send_times = list(schedule(rate_rps, duration_s, "poisson", np.random.default_rng(seed)))
    warmup_times = (
        list(schedule(rate_rps, warmup_s, "poisson", np.random.default_rng(seed + 1)))
        if warmup_s > 0
        else []
    )
    fixed_warmup_times = [t for t in warmup_times if t < FIXED_WARMUP_S]  # its first seconds
    classes = [RequestClass("demo", slo_ms=slo_ms)]
    data = np.ones((1, INPUT_WIDTH), dtype=np.float32)

    with running(flags, state_dir=cfg.state_dir, admin_token=token, starts=3) as sc:

        async def main() -> list[PolicyRun]:
            payloads = build_payloads(classes, input_name="INPUT0", datatype="FP32", data=data)
            target = Target(sc.url, SIMNET, payloads, [1.0])
            async with new_session() as session:

                async def measure(policy: str, warmup: Sequence[float]) -> PolicyRun:
                    tick = None
                    if progress is not None:
                        tick = lambda n: progress(policy, n, len(send_times))  # noqa: E731
                    return await _run_one(
                        session,
                        sc.url,
                        token,
                        policy,
                        target,
                        send_times,
                        rate_rps,
                        slo_ms,
                        seed,
                        tick,
                        warmup,
                    )

                runs = [await measure(policy, warmup_times) for policy in policies]
                if best_fixed_clocks:
                    runs.append(
                        await best_fixed(
                            best_fixed_clocks,
                            lambda mhz: measure(f"fixed:{mhz}", fixed_warmup_times),
                            runs,
                        )
                    )
                return runs

        return asyncio.run(main())


def write_csv(runs: Sequence[PolicyRun], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(asdict(runs[0])))
        writer.writeheader()
        for r in runs:
            writer.writerow(asdict(r))


def plot(runs: Sequence[PolicyRun], path: Path) -> Path:
    """Joules per inference and p99 against the SLO, per policy (the p99 with its 95%
    confidence interval)."""
    from time2clock.plot import pyplot

    plt = pyplot()

    names = [plot_label(r.policy, r.fixed_mhz) for r in runs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(
        names, [r.energy_per_inference_j for r in runs], color=[f"C{i}" for i in range(len(runs))]
    )
    left.set_ylabel("energy per inference (J)")
    left.set_title("energy (lower is better)")
    p99 = np.array([r.p99_ms for r in runs])
    spread = np.array([[r.p99_ms - r.p99_low_ms, r.p99_high_ms - r.p99_ms] for r in runs]).T
    right.bar(
        names,
        p99,
        yerr=np.nan_to_num(spread),
        capsize=4,
        color=[f"C{i}" for i in range(len(runs))],
    )
    right.axhline(runs[0].slo_ms, color="red", linestyle="--", label=f"SLO {runs[0].slo_ms:g} ms")
    right.set_ylabel("p99 latency (ms)")
    right.set_title("tail latency against the SLO")
    right.legend()
    fig.suptitle(f"live stack: {runs[0].rate_rps:.0f} req/s Poisson, same arrivals for each policy")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
