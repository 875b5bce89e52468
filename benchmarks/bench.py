"""What the sidecar costs: the same load straight to Triton and through the sidecar, side by side,
over HTTP and over gRPC (each against Triton's own endpoint of the same protocol).

The sidecar runs in its own process (as in production; in-process it would share the load
generator's GIL) with policy ``max`` and room for everything in flight, in front of the embedded
Triton's ``noop`` model, so that only the sidecar's own work shows. Direct and sidecar runs
alternate (A B A B …) so the machine's drift hits both alike; the ratios are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import secrets
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from api.embedded import INPUT_WIDTH, NOOP
from benchmarks.sidecar import running
from loadgen.classes import RequestClass
from loadgen.engine import (
    InputTensor,
    Recorder,
    Target,
    build_payloads,
    closed_loop,
    new_session,
)
from loadgen.grpc_client import GrpcClient, grpc_payloads
from simulator.results import DEFAULT_DIR, markdown_table, write_results


@dataclass(frozen=True)
class Run:
    path: str
    concurrency: int
    throughput: float
    p50_us: float
    p99_us: float
    mean_us: float


@dataclass(frozen=True)
class Endpoints:
    """Where the sidecar and its Triton listen, per protocol; the sidecar's pid."""

    sidecar: dict[str, str]
    triton: dict[str, str]
    pid: int


@contextlib.contextmanager
def sidecar_process(
    state_dir: Path,
    *extra: str,
    max_inflight: int = 64,
    token: str | None = None,
    start_timeout_s: float = 180.0,
) -> Iterator[Endpoints]:
    """``python -m api serve`` in a process of its own (:mod:`benchmarks.sidecar`): the embedded
    default on a simulated V100, policy max, room for everything queued, ``extra`` flags after
    the others; yields its endpoints and its Triton's."""
    flags = [
        "--policy", "max", "--max-inflight", str(max_inflight), "--max-queue", "10000",
        "--device", "sim:v100", "--log-level", "warning", *extra,
    ]  # fmt: skip
    with running(
        flags,
        state_dir=state_dir,
        admin_token=token or secrets.token_urlsafe(12),
        start_timeout_s=start_timeout_s,
    ) as sc:
        state = sc.admin("/admin/state")
        yield Endpoints(
            {"http": sc.url, "grpc": sc.grpc_url},
            {"http": state["triton_url"], "grpc": state["triton_grpc_url"]},
            sc.pid,
        )


def measure(
    url: str,
    concurrency: int,
    duration_s: float,
    label: str,
    protocol: str = "http",
    model: str = NOOP,
) -> Run:
    data = np.ones((1, INPUT_WIDTH), dtype=np.float32)
    classes = [RequestClass("bench")]

    async def go() -> Recorder:
        rec = Recorder()
        async with new_session() as session, contextlib.AsyncExitStack() as stack:
            if protocol == "grpc":
                client = await stack.enter_async_context(GrpcClient(url))
                tensors = [InputTensor("INPUT0", "FP32", data)]
                payloads = grpc_payloads(classes, tensors, model, None)
                target = Target(url, model, payloads, [1.0], grpc=client)
            else:
                target = Target(url, model, build_payloads(classes, data=data), [1.0])
            await closed_loop(
                session,
                target,
                concurrency,
                time.monotonic() + 0.5,
                Recorder(),
                np.random.default_rng(0),
            )  # warm-up
            start = time.monotonic()
            await closed_loop(
                session, target, concurrency, start + duration_s, rec, np.random.default_rng(0)
            )
        return rec

    rec = asyncio.run(go())
    ok = [s for s in rec.samples if s.status == 200]
    lat = np.asarray([s.latency_s * 1e6 for s in ok])
    span = max(s.end_s for s in ok) - min(s.start_s for s in ok)
    return Run(
        label,
        concurrency,
        len(ok) / span,
        float(np.percentile(lat, 50)),
        float(np.percentile(lat, 99)),
        float(lat.mean()),
    )


def independent(url: str, concurrency: int, duration_s: float) -> tuple[float, float]:
    """The same closed loop with NVIDIA's own tritonclient (threads): throughput, mean µs."""
    x = httpclient.InferInput("INPUT0", [1, INPUT_WIDTH], "FP32")
    x.set_data_from_numpy(np.ones((1, INPUT_WIDTH), dtype=np.float32))
    latencies: list[float] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + duration_s

    def worker() -> None:
        client = httpclient.InferenceServerClient(url)
        mine = []
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            client.infer(NOOP, [x])
            mine.append((time.perf_counter() - t0) * 1e6)
        client.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(latencies) / (time.monotonic() - start), float(np.mean(latencies))


def _units(medians: dict[str, float]) -> dict[str, float]:
    """Medians with their units in their names, for the JSON results."""
    return {
        "infer_per_s": medians["throughput"],
        "p50_us": medians["p50_us"],
        "p99_us": medians["p99_us"],
    }


def _report(
    summary: list[tuple[str, int, dict[str, float], dict[str, float]]],
    checks: list[tuple[int, Run, float, float]],
    args: argparse.Namespace,
) -> str:
    """The results file's body: the cost per protocol and concurrency, then loadgen's check."""
    rows = [
        (
            p,
            c,
            f"{s['throughput'] / d['throughput']:.0%} "
            f"({s['throughput']:.0f} vs {d['throughput']:.0f} infer/s)",
            f"+{(s['p50_us'] - d['p50_us']) / 1000:.2f} ms ({s['p50_us'] / d['p50_us']:.2f}×)",
            f"+{(s['p99_us'] - d['p99_us']) / 1000:.2f} ms ({s['p99_us'] / d['p99_us']:.2f}×)",
        )
        for p, c, d, s in summary
    ]
    check_rows = [
        (c, f"{lg.throughput:.0f}", f"{lg.mean_us:.0f}", f"{tput:.0f}", f"{mean:.0f}")
        for c, lg, tput, mean in checks
    ]
    return "\n\n".join(
        [
            f"The sidecar (policy max, its own process) in front of the embedded Triton's `noop`, "
            f"against Triton's own endpoint of the same protocol; closed loops of "
            f"{args.duration_s:g} s, direct and sidecar alternating; medians over rounds "
            f"(rounds: {args.rounds}).",
            markdown_table(
                ["protocol", "concurrency", "throughput kept", "p50 added", "p99 added"], rows
            ),
            "loadgen against an independent client (NVIDIA's tritonclient in threads), straight "
            "to Triton over HTTP:",
            markdown_table(
                [
                    "concurrency",
                    "loadgen infer/s",
                    "loadgen mean µs",
                    "tritonclient infer/s",
                    "tritonclient mean µs",
                ],
                check_rows,
            ),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2, help="A/B alternations per concurrency")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=DEFAULT_DIR,
        help="where bench.md and bench.json are written (default: results)",
    )
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    protocols = args.protocols.split(",")
    with tempfile.TemporaryDirectory() as tmp, sidecar_process(Path(tmp)) as ends:
        print(
            f"sidecar {ends.sidecar} (policy max, 64 in flight) in front of Triton "
            f"{ends.triton}; model noop"
        )
        print(f"{'proto':>5} {'conc':>4} {'path':>8} {'infer/s':>9} {'p50 µs':>8} {'p99 µs':>8}")
        summary = []
        for protocol, c in itertools.product(protocols, levels):
            runs: dict[str, list[Run]] = {"direct": [], "sidecar": []}
            for _ in range(args.rounds):
                for label, url in (
                    ("direct", ends.triton[protocol]),
                    ("sidecar", ends.sidecar[protocol]),
                ):
                    r = measure(url, c, args.duration_s, label, protocol)
                    runs[label].append(r)
                    print(
                        f"{protocol:>5} {c:>4} {label:>8} {r.throughput:>9.0f} "
                        f"{r.p50_us:>8.0f} {r.p99_us:>8.0f}",
                        flush=True,
                    )
            d = {
                k: float(np.median([getattr(r, k) for r in runs["direct"]]))
                for k in ("throughput", "p50_us", "p99_us")
            }
            s = {
                k: float(np.median([getattr(r, k) for r in runs["sidecar"]]))
                for k in ("throughput", "p50_us", "p99_us")
            }
            summary.append((protocol, c, d, s))
        print("\nthe sidecar's cost (medians of the rounds):")
        for protocol, c, d, s in summary:
            kept = s["throughput"] / d["throughput"]
            print(
                f"  {protocol:>4} concurrency {c:>2}: throughput kept {kept:.0%} "
                f"({s['throughput']:.0f} vs {d['throughput']:.0f} infer/s); "
                f"p50 +{s['p50_us'] - d['p50_us']:.0f} µs ({s['p50_us'] / d['p50_us']:.2f}×); "
                f"p99 +{s['p99_us'] - d['p99_us']:.0f} µs ({s['p99_us'] / d['p99_us']:.2f}×)"
            )
        print("\nloadgen against an independent client (tritonclient threads), straight to Triton:")
        checks = []
        for c in (1, 4):
            lg = measure(ends.triton["http"], c, args.duration_s, "direct")
            tput, mean = independent(ends.triton["http"], c, args.duration_s)
            checks.append((c, lg, tput, mean))
            print(
                f"  concurrency {c}: loadgen {lg.throughput:.0f} infer/s, "
                f"mean {lg.mean_us:.0f} µs; "
                f"tritonclient {tput:.0f} infer/s, mean {mean:.0f} µs"
            )
    md, _ = write_results(
        "bench",
        title="What the sidecar costs (python -m benchmarks.bench)",
        markdown=_report(summary, checks, args),
        data={
            "settings": {**vars(args), "model": NOOP, "policy": "max"},
            "cost": [
                {
                    "protocol": p,
                    "concurrency": c,
                    "direct": _units(d),
                    "sidecar": _units(s),
                    "throughput_kept": s["throughput"] / d["throughput"],
                }
                for p, c, d, s in summary
            ],
            "loadgen_check": [
                {
                    "concurrency": c,
                    "loadgen_infer_per_s": lg.throughput,
                    "loadgen_mean_us": lg.mean_us,
                    "tritonclient_infer_per_s": tput,
                    "tritonclient_mean_us": mean,
                }
                for c, lg, tput, mean in checks
            ],
        },
        directory=args.results_dir,
    )
    print(f"\nwritten to {md} (and .json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
