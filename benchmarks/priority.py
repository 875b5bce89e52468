"""Priority, fair share and abandoned requests, live on the embedded default.

The sidecar runs in its own process (``python -m api serve``, policy ``max``, the embedded
Triton with ``simnet`` on the simulated V100) and three checks run against it, each with the
same rules as the documentation states (docs/priority.md):

1. **Priority under a flood.** A priority-1 client sending ``--hi-rps`` Poisson requests with a
   ``--hi-slo-ms`` SLO, alone for ``--alone-s`` (what this machine gives it with nothing else
   running), then beside a closed-loop priority-0 flood (``--flood`` in flight, from a process
   of its own): the priority-1 p50, p99 and SLO attainment, the flood's throughput alone and
   beside it.
2. **Nice weights.** Three closed-loop clients of equal concurrency (``--nice-concurrency``),
   nice −5, 0 and 5, saturating ``simnet`` for ``--nice-s``: completions per client against the
   CFS weights (3121 : 1024 : 335), and seed 000's isolation metric (:mod:`scheduler.isolation`).
3. **Abandoned requests.** The clock forced to the lowest, ``--abandon-n`` requests sent at once
   whose clients give up after ``--patience-s``: how many Triton executed (its own statistics,
   ``/v2/models/simnet/stats``), and how many of those after their client had gone.

With ``--checks sim``, the same questions in the simulator (no sidecar started): the priority
cells (:data:`SIM_CELLS`) against the flood alone on the same arrivals, and a nice mix's
isolation.

Every figure is written to ``results/priority-live.md`` and ``.json`` (``priority-sim`` for the
simulator's cells alone; :mod:`simulator.results`: the command, the commit, the machine and its
load, and the load after each run), as measured: nothing is asserted here (the machine is
shared and noisy; tests hold the rules).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from api.config import default_state_dir
from api.embedded import INPUT_WIDTH, SIMNET
from benchmarks.bench import sidecar_process
from benchmarks.live import admin_state
from dvfs.profiles import get_profile
from loadgen.classes import RequestClass
from loadgen.engine import (
    Recorder,
    Sample,
    Target,
    build_payloads,
    closed_loop,
    new_session,
    open_loop,
    schedule,
)
from loadgen.metrics import histogram_buckets
from scheduler.core import SchedulerConfig
from scheduler.isolation import ClientUsage, isolation
from scheduler.weights import weight_for_nice
from simulator.results import DEFAULT_DIR, Provenance, markdown_table, provenance, write_results

GPU = "v100"  # the sidecar_process's simulated GPU
NICES = (-5, 0, 5)


def _target(url: str, classes: Sequence[RequestClass], shares: Sequence[float]) -> Target:
    data = np.ones((1, INPUT_WIDTH), dtype=np.float32)
    return Target(url, SIMNET, build_payloads(classes, data=data), list(shares))


def _pct_ms(samples: Sequence[Sample], q: float) -> float:
    lat = [s.latency_s * 1000.0 for s in samples]
    return float(np.percentile(lat, q)) if lat else math.nan


async def _idle(session: aiohttp.ClientSession, url: str, token: str, limit_s: float) -> None:
    """Wait until the sidecar has nothing queued and nothing in flight."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        state = await admin_state(session, url, token)
        if not state["queue_length"] and not state["inflight"]:
            return
        await asyncio.sleep(0.1)


async def _flooded(
    session: aiohttp.ClientSession, target: Target, concurrency: int, stop_at_s: float
) -> Recorder:
    rec = Recorder()
    await closed_loop(session, target, concurrency, stop_at_s, rec, np.random.default_rng(0))
    return rec


def closed_loop_process(
    url: str, klass: RequestClass, concurrency: int, stop_at_s: float
) -> list[float]:
    """A closed loop of ``klass`` until ``stop_at_s`` (monotonic, the same clock in every
    process), in a process of its own so that its load on a generator's event loop does not
    delay another client's; the end times of its answers (200)."""

    async def go() -> Recorder:
        target = _target(url, [klass], [1.0])
        async with new_session() as session:
            return await _flooded(session, target, concurrency, stop_at_s)

    return [s.end_s for s in asyncio.run(go()).samples if s.status == 200]


def _processes(n: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))


def _latency(samples: Sequence[Sample], slo_ms: float) -> dict[str, Any]:
    ok = [s for s in samples if s.status == 200]
    return {
        "sent": len(samples),
        "ok": len(ok),
        "p50_ms": _pct_ms(ok, 50),
        "p99_ms": _pct_ms(ok, 99),
        "slo_attainment": (
            sum(s.latency_s * 1000.0 <= slo_ms for s in ok) / len(ok) if ok else math.nan
        ),
    }


async def _open(url: str, klass: RequestClass, rps: float, duration_s: float) -> Recorder:
    target = _target(url, [klass], [1.0])
    rec = Recorder()
    times = schedule(rps, duration_s, "poisson", np.random.default_rng(1))
    async with new_session() as session:
        await open_loop(session, target, times, rec, np.random.default_rng(1))
    return rec


async def _hi_buckets(url: str) -> dict[float, float]:
    """The sidecar's own latency histogram for the client ``hi`` (queue + Triton, without the
    client's and the HTTP server's CPU time): cumulative counts by upper bound."""
    async with new_session() as session, session.get(f"http://{url}/metrics") as resp:
        text = await resp.text()
    return histogram_buckets(text, "sidecar_request_duration_seconds", {"client": "hi"})


def _within(before: dict[float, float], after: dict[float, float], le: float) -> float:
    total = after.get(math.inf, 0.0) - before.get(math.inf, 0.0)
    return (after.get(le, 0.0) - before.get(le, 0.0)) / total if total else math.nan


async def priority_check(
    url: str, *, flood: int, hi_rps: float, hi_slo_ms: float, alone_s: float, duration_s: float
) -> dict[str, Any]:
    """A priority-1 open loop alone, then beside a closed-loop priority-0 flood (see the
    module doc); the flood's throughput alone and beside it."""
    hi = RequestClass("hi", priority=1, slo_ms=hi_slo_ms)
    hi_alone = await _open(url, hi, hi_rps, alone_s)
    head_start_s = 3.0  # the flood's process starts and reaches its pace
    beside_from = time.monotonic() + head_start_s + alone_s
    stop = beside_from + duration_s
    flood_class = RequestClass("flood", priority=0, slo_ms=10_000.0)
    with _processes(1) as pool:
        flood_ends = asyncio.get_running_loop().run_in_executor(
            pool, closed_loop_process, url, flood_class, flood, stop
        )
        await asyncio.sleep(max(0.0, beside_from - time.monotonic()))
        buckets = await _hi_buckets(url)
        hi_beside = await _open(url, hi, hi_rps, duration_s)
        buckets_after = await _hi_buckets(url)
        ends = await flood_ends
    alone_from = min(ends, default=beside_from) + 1.0
    alone = [t for t in ends if alone_from <= t < beside_from]
    beside = [t for t in ends if beside_from <= t < stop]
    served = sum(s.status == 200 and s.end_s < stop for s in hi_beside.samples)
    return {
        "flood_concurrency": flood,
        "hi_rps": hi_rps,
        "hi_slo_ms": hi_slo_ms,
        "hi_alone": _latency(hi_alone.samples, hi_slo_ms),
        "hi_beside_flood": _latency(hi_beside.samples, hi_slo_ms),
        "hi_errors": {str(k): v for k, v in hi_beside.errors.items()},
        # in the sidecar (queue + Triton): the client's and the HTTP servers' CPU time apart
        "hi_beside_in_sidecar_within_100ms": _within(buckets, buckets_after, 0.1),
        "hi_beside_in_sidecar_within_150ms": _within(buckets, buckets_after, 0.15),
        "flood_alone_rps": len(alone) / max(1e-9, beside_from - alone_from),
        "flood_beside_rps": len(beside) / duration_s,
        "total_beside_rps": (len(beside) + served) / duration_s,
    }


async def _queue_lengths(url: str, token: str, start_s: float, stop_s: float) -> list[int]:
    """The sidecar's queue length every 0.25 s from ``start_s`` to ``stop_s`` (monotonic):
    weights decide only among requests that wait there."""
    lengths: list[int] = []
    async with new_session() as session:
        await asyncio.sleep(max(0.0, start_s - time.monotonic()))
        while time.monotonic() < stop_s:
            lengths.append(int((await admin_state(session, url, token))["queue_length"]))
            await asyncio.sleep(0.25)
    return lengths


async def nice_check(
    url: str, token: str, *, concurrency: int, duration_s: float
) -> dict[str, Any]:
    """Three closed loops of equal concurrency, nice −5, 0 and 5, each from a process of its
    own (see the module doc); how long the sidecar's queue was meanwhile."""
    classes = [RequestClass(f"nice{n:+d}", nice=n, slo_ms=10_000.0) for n in NICES]
    warm = time.monotonic() + 5.0  # the processes start, the loops reach their pace
    stop = warm + duration_s
    loop = asyncio.get_running_loop()
    with _processes(len(classes)) as pool:
        lengths = asyncio.create_task(_queue_lengths(url, token, warm, stop))
        ends = await asyncio.gather(
            *(
                loop.run_in_executor(pool, closed_loop_process, url, k, concurrency, stop)
                for k in classes
            )
        )
        queue = await lengths
    counts = [sum(warm <= t < stop for t in e) for e in ends]
    report = isolation(
        [
            ClientUsage(f"nice{n:+d}", level=2, nice=n, served=float(c), demand=None)
            for n, c in zip(NICES, counts, strict=True)
        ]
    )
    weights = [weight_for_nice(n) for n in NICES]
    total = sum(counts) or 1
    return {
        "concurrency": concurrency,
        "duration_s": duration_s,
        "completed": dict(zip((f"nice{n:+d}" for n in NICES), counts, strict=True)),
        "share": [c / total for c in counts],
        "ideal_share": [w / sum(weights) for w in weights],
        "share_error": [
            c / total / (w / sum(weights)) - 1.0 for c, w in zip(counts, weights, strict=True)
        ],
        "throughput_rps": sum(counts) / duration_s,
        "queue_mean": float(np.mean(queue)) if queue else math.nan,
        "queue_empty_share": sum(q == 0 for q in queue) / len(queue) if queue else math.nan,
        "isolation": report.to_json(),
    }


async def _stats(session: aiohttp.ClientSession, triton: str) -> int:
    """Requests Triton has executed for ``simnet`` (its own statistics)."""
    async with session.get(f"http://{triton}/v2/models/{SIMNET}/stats") as resp:
        resp.raise_for_status()
        stats = await resp.json()
    return int(sum(m["inference_count"] for m in stats["model_stats"]))


async def abandon_check(
    url: str, triton: str, token: str, *, n: int, patience_s: float
) -> dict[str, Any]:
    """``n`` requests at once at the lowest clock, each client gone after ``patience_s``.

    The ``n`` connections are opened first (a readiness call on each), so that the requests
    reach the sidecar together and their clients leave together, not spread over the time a
    busy machine takes to connect. The default patience (0.1 s) has the clients leave after
    the first small batches end (about 45 ms for one request at the lowest clock) and well
    before the batch formed behind them does: clients leaving just as a batch ends race the
    sidecar's refill of Triton against its seeing them go, and what it refills with before it
    has seen them go is executed for nobody too."""
    lowest = get_profile(GPU).clocks_mhz[0]
    headers = {"Authorization": f"Bearer {token}"}
    target = _target(url, [RequestClass("patient", slo_ms=10_000.0)], [1.0])
    payload = target.payloads[0]
    async with new_session() as session:
        async with session.put(
            f"http://{url}/admin/clock", json={"clock_mhz": lowest}, headers=headers
        ) as resp:
            resp.raise_for_status()
        await asyncio.sleep(0.5)
        before = await _stats(session, triton)
        timeout = aiohttp.ClientTimeout(total=patience_s)

        async def ready() -> None:
            async with session.get(f"http://{url}/v2/health/ready") as resp:
                await resp.read()

        async def one() -> str:
            try:
                async with session.post(
                    f"http://{url}{target.path}",
                    data=payload.body,
                    headers=payload.headers,
                    timeout=timeout,
                ) as resp:
                    await resp.read()
                    return str(resp.status)
            except TimeoutError:
                return "gave up"

        await asyncio.gather(*(ready() for _ in range(n)))
        outcomes = await asyncio.gather(*(one() for _ in range(n)))
        await _idle(session, url, token, 120.0)
        await asyncio.sleep(0.5)
        executed = await _stats(session, triton) - before
        async with session.put(
            f"http://{url}/admin/clock", json={"clock_mhz": None}, headers=headers
        ) as resp:
            resp.raise_for_status()
    served = outcomes.count("200")
    return {
        "requests": n,
        "patience_s": patience_s,
        "clock_mhz": lowest,
        "served_in_time": served,
        "gave_up": outcomes.count("gave up"),
        "executed_by_triton": executed,
        "executed_for_nobody": executed - served,
    }


# (name, GPU, model mix, clients, instances of each model): the priority-1 client's SLO 1.12
# full batches at the top clock (the 43.4 ms on the V100), or 3 of them; the flood alone
# is the same load of priority-0 requests only, with the same instances.
SIM_FLOOD = "lo:priority=0,share=0.9,slo_ms=100000"
SIM_CELLS = (
    ("v100 SLO 1.12x", "v100", "resnet50", f"hi:priority=1,share=0.1,slo_ms=43.4;{SIM_FLOOD}", 2),
    ("a100 SLO 1.12x", "a100", "resnet50", f"hi:priority=1,share=0.1,slo_ms=29.5;{SIM_FLOOD}", 2),
    (
        "v100 two models SLO 3x",
        "v100",
        "resnet50:0.7:115.9,bert-large:0.3:523.1",
        f"hi:priority=1,share=0.1;{SIM_FLOOD}",
        2,
    ),
    ("v100 SLO 3x", "v100", "resnet50", f"hi:priority=1,share=0.1,slo_ms=115.9;{SIM_FLOOD}", 2),
    ("v100 SLO 1.12x", "v100", "resnet50", f"hi:priority=1,share=0.1,slo_ms=43.4;{SIM_FLOOD}", 6),
)
SIM_NICE = "a:nice=-5,share=0.34;b:nice=0,share=0.33;c:nice=5,share=0.33"


def simulated_cells(
    duration_s: float,
    seed: int,
    triton_batches: int = SchedulerConfig.triton_batches,
    triton_batches_alone: int = SchedulerConfig.triton_batches_alone,
) -> list[dict[str, Any]]:
    """The priority cells and a nice mix in the simulator (policy ``max``, load 2.0 of the
    mix's capacity; the nice mix at 3.0): the priority-1 client's tail and attainment, the
    node's throughput against the flood alone on the same arrivals, seed 000's isolation."""
    from scheduler.clients import parse_clients
    from simulator.simulate import SimConfig, parse_models, simulate

    def run(gpu: str, models: str, clients: str, load: float, instances: int) -> dict[str, Any]:
        cfg = SimConfig(
            gpu=gpu,
            policy="max",
            load=load,
            slo_ms=100_000.0,
            duration_s=duration_s,
            seed=seed,
            clients=tuple(parse_clients(clients)),
            models=parse_models(models),
            instances=instances,
            triton_batches=triton_batches,
            triton_batches_alone=triton_batches_alone,
            with_oracle=False,
        )
        out: dict[str, Any] = simulate(cfg).to_json()
        return out

    rows = []
    for name, gpu, models, clients, instances in SIM_CELLS:
        both = run(gpu, models, clients, 2.0, instances)
        alone = run(gpu, models, "lo:share=1,slo_ms=100000", 2.0, instances)
        hi = both["clients"]["hi"]
        rows.append(
            {
                "cell": name,
                "gpu": gpu,
                "models": models,
                "clients": clients,
                "instances": instances,
                "hi_p99_ms": hi["p99_ms"],
                "hi_slo_attainment": hi["slo_attainment"],
                "throughput_rps": both["throughput_rps"],
                "flood_alone_rps": alone["throughput_rps"],
                "throughput_vs_flood_alone": both["throughput_rps"] / alone["throughput_rps"],
                "mean_batch": both["mean_batch"],
            }
        )
    nice = run("v100", "resnet50", SIM_NICE, 3.0, 2)
    rows.append(
        {
            "cell": "v100 nice -5/0/5 at 3x capacity",
            "clients": SIM_NICE,
            "completed": {k: v["completed"] for k, v in nice["clients"].items()},
            "dct_over_ideal": {k: v["dct_over_ideal"] for k, v in nice["clients"].items()},
            "isolation_deviation": nice["isolation_deviation"],
        }
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.priority", description=__doc__)
    parser.add_argument(
        "--checks", default="priority,nice,abandon", help="any of priority, nice, abandon, sim"
    )
    parser.add_argument("--sim-duration-s", type=float, default=60.0)
    parser.add_argument("--sim-seed", type=int, default=3)
    parser.add_argument(
        "--sim-triton-batches",
        type=int,
        default=SchedulerConfig.triton_batches,
        help="full batches of each model kept at Triton in the simulated cells",
    )
    parser.add_argument(
        "--sim-triton-batches-alone",
        type=int,
        default=SchedulerConfig.triton_batches_alone,
        help="full batches kept at Triton while one nice value alone arrives and one level "
        "alone or one model's alone at levels Triton orders",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each check")
    parser.add_argument("--flood", type=int, default=64)
    parser.add_argument("--hi-rps", type=float, default=20.0)
    parser.add_argument("--hi-slo-ms", type=float, default=116.0)
    parser.add_argument("--alone-s", type=float, default=8.0)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--nice-concurrency", type=int, default=48)
    parser.add_argument("--nice-s", type=float, default=30.0)
    parser.add_argument("--abandon-n", type=int, default=100)
    parser.add_argument("--patience-s", type=float, default=0.1)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument(
        "--name",
        default=None,
        help="results file name (default: priority-sim for --checks sim, else priority-live)",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=default_state_dir(), help="tables cached here"
    )
    args = parser.parse_args(argv)
    checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    if args.name is None:
        args.name = "priority-sim" if checks == ["sim"] else "priority-live"
    unknown = set(checks) - {"priority", "nice", "abandon", "sim"}
    if unknown:
        parser.error(f"unknown checks {sorted(unknown)}; known: priority, nice, abandon, sim")
    token = secrets.token_hex(12)  # never starts with "-" (a flag to argparse)
    prov = provenance()  # taken before the runs: the machine's load when they started
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    if "sim" in checks:
        checks.remove("sim")
        results["sim"] = simulated_cells(
            args.sim_duration_s,
            args.sim_seed,
            args.sim_triton_batches,
            args.sim_triton_batches_alone,
        )
        for row in results["sim"]:
            print(f"sim: {json.dumps(row)}", flush=True)
    if not checks:
        return _write(results, args, prov)
    print("starting the sidecar (the first run profiles simnet, a minute or two)...", flush=True)
    with (
        tempfile.TemporaryDirectory() as tmp,
        sidecar_process(
            Path(tmp), "--profile-models", SIMNET, "--state-dir", str(args.state_dir),
            max_inflight=256, token=token, start_timeout_s=600.0,
        ) as ends,
    ):  # fmt: skip
        url, triton = ends.sidecar["http"], ends.triton["http"]
        for check in checks:
            runs = []
            for i in range(args.repeat):
                if check == "priority":
                    run = asyncio.run(
                        priority_check(
                            url,
                            flood=args.flood,
                            hi_rps=args.hi_rps,
                            hi_slo_ms=args.hi_slo_ms,
                            alone_s=args.alone_s,
                            duration_s=args.duration_s,
                        )
                    )
                elif check == "nice":
                    run = asyncio.run(
                        nice_check(
                            url, token, concurrency=args.nice_concurrency, duration_s=args.nice_s
                        )
                    )
                else:
                    run = asyncio.run(
                        abandon_check(
                            url, triton, token, n=args.abandon_n, patience_s=args.patience_s
                        )
                    )
                run["load_avg_1m"] = os.getloadavg()[0]  # the machine's load as it ended
                print(f"{check} run {i + 1}: {json.dumps(run)}", flush=True)
                runs.append(run)

                async def settle() -> None:
                    async with new_session() as session:
                        await _idle(session, url, token, 120.0)

                asyncio.run(settle())
            results[check] = runs
    return _write(results, args, prov)


def _write(results: dict[str, Any], args: argparse.Namespace, prov: Provenance) -> int:
    md, js = write_results(
        args.name,
        title="Priority, fair share and abandoned requests",
        markdown=summary(results),
        data=results,
        directory=args.out_dir,
        prov=prov,
    )
    print(f"wrote {md} and {js}")
    return 0


def _pct(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.1%}"


def _ms(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.1f}"


def _load(run: dict[str, Any]) -> str:
    load = run.get("load_avg_1m")
    return "-" if load is None else f"{load:.1f}"


LIVE_PRIORITY_HEAD = (
    "run",
    "p1 alone p99 ms",
    "p1 beside p50 ms",
    "p1 beside p99 ms",
    "p1 SLO met",
    "in sidecar <= 100 ms",
    "<= 150 ms",
    "flood alone req/s",
    "flood beside req/s",
    "load (1 min)",
)


def summary(results: dict[str, Any]) -> str:
    """The figures as Markdown tables, one per check."""
    parts: list[str] = []
    sim = [r for r in results.get("sim", []) if "hi_p99_ms" in r]
    if sim:
        args = results.get("args", {})
        batches = args.get("sim_triton_batches", SchedulerConfig.triton_batches)
        alone = args.get("sim_triton_batches_alone", "1")
        parts.append(
            "## Simulator: a priority-1 client (10%) beside a priority-0 flood "
            f"(--triton-batches {batches}, --triton-batches-alone {alone})"
        )
        parts.append(
            markdown_table(
                (
                    "cell",
                    "instances",
                    "p1 SLO met",
                    "p1 p99 ms",
                    "req/s",
                    "flood alone req/s",
                    "ratio",
                ),
                [
                    (
                        r["cell"],
                        r.get("instances", 2),
                        _pct(r["hi_slo_attainment"]),
                        _ms(r["hi_p99_ms"]),
                        f"{r['throughput_rps']:.0f}",
                        f"{r['flood_alone_rps']:.0f}",
                        _pct(r["throughput_vs_flood_alone"]),
                    )
                    for r in sim
                ],
            )
        )
    for r in results.get("sim", []):
        if "isolation_deviation" in r:
            ratios = ", ".join(f"{k} {v:.3f}" for k, v in r["dct_over_ideal"].items())
            parts.append(
                f"Simulator, {r['cell']}: completed {r['completed']}; DCT/ideal {ratios}; "
                f"worst pair {_pct(r['isolation_deviation'])} from ideal CFS."
            )
    if results.get("priority"):
        parts.append("## Live: a priority-1 client beside a closed-loop priority-0 flood")
        parts.append(
            markdown_table(
                LIVE_PRIORITY_HEAD,
                [
                    (
                        i + 1,
                        _ms(r["hi_alone"]["p99_ms"]),
                        _ms(r["hi_beside_flood"]["p50_ms"]),
                        _ms(r["hi_beside_flood"]["p99_ms"]),
                        _pct(r["hi_beside_flood"]["slo_attainment"]),
                        _pct(r["hi_beside_in_sidecar_within_100ms"]),
                        _pct(r["hi_beside_in_sidecar_within_150ms"]),
                        f"{r['flood_alone_rps']:.0f}",
                        f"{r['flood_beside_rps']:.0f}",
                        _load(r),
                    )
                    for i, r in enumerate(results["priority"])
                ],
            )
        )
    if results.get("nice"):
        parts.append("## Live: three closed loops, nice -5, 0, 5 (ideal 69.7% / 22.9% / 7.5%)")
        parts.append(
            markdown_table(
                (
                    "run",
                    "completed",
                    "shares",
                    "worst pair from ideal",
                    "req/s",
                    "queue (mean)",
                    "load (1 min)",
                ),
                [
                    (
                        i + 1,
                        " / ".join(str(c) for c in r["completed"].values()),
                        " / ".join(_pct(x) for x in r["share"]),
                        _pct(r["isolation"]["deviation"] or math.nan),
                        f"{r['throughput_rps']:.0f}",
                        _ms(r.get("queue_mean", math.nan)),
                        _load(r),
                    )
                    for i, r in enumerate(results["nice"])
                ],
            )
        )
    if results.get("abandon"):
        parts.append("## Live: clients that give up, the clock at its lowest")
        parts.append(
            markdown_table(
                (
                    "run",
                    "requests",
                    "served in time",
                    "executed by Triton",
                    "for nobody",
                    "load (1 min)",
                ),
                [
                    (
                        i + 1,
                        r["requests"],
                        r["served_in_time"],
                        r["executed_by_triton"],
                        r["executed_for_nobody"],
                        _load(r),
                    )
                    for i, r in enumerate(results["abandon"])
                ],
            )
        )
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.exit(main())
