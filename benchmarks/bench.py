"""What the sidecar costs: the same load straight to Triton and through the sidecar, side by side,
over HTTP and over gRPC (each against Triton's own endpoint of the same protocol).

The sidecar runs in its own process (as in production; in-process it would share the load
generator's GIL) with policy ``max`` and room for everything in flight, at the sidecar and at Triton
(``--triton-batches`` where the tree has it: by default the sidecar keeps one or two full batches of
a model at Triton and the rest waiting in its own queue, a choice for priority that the load
measured here would pay in throughput and latency), in front of the embedded Triton's ``noop``
model, so that only the sidecar's own work shows. Direct and sidecar runs alternate (A B A B …) so
the machine's drift hits both alike; the ratios are the result. The sidecar's CPU per request is its
own process's accounting (user + system time of all its threads, from ``/proc``; Triton runs in a
process of its own and is not counted) over each measured run, divided by the requests it answered.

``--before-tree DIR`` runs a second sidecar from another source tree (an earlier commit, say) in
front of the same Triton, measured in the same rounds: a before/after on the same machine at the
same moment. ``--before FILE`` reads the before figures from an earlier run's ``bench.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient

from api.embedded import INPUT_WIDTH, NOOP, NOOP_MAX_BATCH
from benchmarks.floor import server_process
from benchmarks.sidecar import running
from loadgen.classes import RequestClass
from loadgen.engine import (
    InputTensor,
    Recorder,
    Target,
    build_payloads,
    closed_loop,
    new_session,
    send_one,
)
from loadgen.grpc_client import CLIENTS as GRPC_CLIENTS
from loadgen.grpc_client import GrpcClient, grpc_payloads
from simulator.results import DEFAULT_DIR, markdown_table, write_results

# What the sidecar may cost (the product's goals): CPU µs per request at concurrency 16 by
# protocol, and the p50 it may add at concurrency 1.
CPU_TARGET_US = {("http", 16): 150.0, ("grpc", 16): 200.0}
P50_ADDED_TARGET_US = {("http", 1): 300.0, ("grpc", 1): 300.0}


@dataclass(frozen=True)
class Run:
    path: str
    concurrency: int
    throughput: float
    p50_us: float
    p99_us: float
    mean_us: float
    cpu_us: float | None = None  # the sidecar's CPU per request answered (None: not measured)


@dataclass(frozen=True)
class Endpoints:
    """Where the sidecar and its Triton listen, per protocol; the sidecar's pid."""

    sidecar: dict[str, str]
    triton: dict[str, str]
    pid: int


@dataclass(frozen=True)
class Cost:
    """One sidecar at one protocol and concurrency: medians of the rounds, and against direct."""

    protocol: str
    concurrency: int
    direct: dict[str, float]  # infer_per_s, p50_us, p99_us
    sidecar: dict[str, float]  # the same, and cpu_us

    @property
    def kept(self) -> float:
        return self.sidecar["infer_per_s"] / self.direct["infer_per_s"]

    def added_us(self, key: str) -> float:
        return self.sidecar[key] - self.direct[key]

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "concurrency": self.concurrency,
            "direct": self.direct,
            "sidecar": self.sidecar,
            "throughput_kept": self.kept,
            "p50_added_us": self.added_us("p50_us"),
            "p99_added_us": self.added_us("p99_us"),
        }


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (every thread), from its ``/proc`` stat: to
    one clock tick (``SC_CLK_TCK``, 10 ms), so a window must hold many ticks' work."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


MAX_INFLIGHT = 64  # the sidecar's room for requests at Triton in this benchmark


def room_at_triton(source: Path | None) -> list[str]:
    """The flag that lets ``MAX_INFLIGHT`` requests of ``noop`` be at Triton at once, for the
    sidecar of ``source`` (None: this tree); none for a tree whose sidecar keeps no release
    depth (before ``--triton-batches``, it let everything in flight through)."""
    if source is not None:
        usage = subprocess.run(
            [sys.executable, "-m", "api", "serve", "--help"],
            cwd=source,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        if "--triton-batches" not in usage:
            return []
    return [f"--triton-batches={MAX_INFLIGHT // NOOP_MAX_BATCH}"]


@contextlib.contextmanager
def sidecar_process(
    state_dir: Path,
    *extra: str,
    max_inflight: int = MAX_INFLIGHT,
    token: str | None = None,
    start_timeout_s: float = 180.0,
    source: Path | None = None,
    triton: Mapping[str, str] | None = None,
) -> Iterator[Endpoints]:
    """``python -m api serve`` in a process of its own (:mod:`benchmarks.sidecar`): the embedded
    default on a simulated V100 (or in front of ``triton``'s ``http`` and ``grpc`` endpoints),
    policy max, room for everything queued, ``extra`` flags after the others, from this tree or
    from ``source``; yields its endpoints and its Triton's."""
    upstream = (
        []
        if triton is None
        else ["--triton-url", triton["http"], "--triton-grpc-url", triton["grpc"]]
    )
    flags = [
        "--policy", "max", "--max-inflight", str(max_inflight), "--max-queue", "10000",
        "--device", "sim:v100", "--log-level", "warning", *upstream, *extra,
    ]  # fmt: skip
    with running(
        flags,
        state_dir=state_dir,
        admin_token=token or secrets.token_urlsafe(12),
        start_timeout_s=start_timeout_s,
        cwd=source,
    ) as sc:
        state = sc.admin("/admin/state")
        yield Endpoints(
            {"http": sc.url, "grpc": sc.grpc_url},
            {"http": state["triton_url"], "grpc": state["triton_grpc_url"]},
            sc.pid,
        )


@contextlib.contextmanager
def floor_process(triton: Mapping[str, str]) -> Iterator[Endpoints]:
    """:mod:`benchmarks.floor` (the least a Python proxy of these libraries does) in a process
    of its own in front of ``triton``; stopped by closing its stdin, killed if it does not."""
    args = ("--triton-http", triton["http"], "--triton-grpc", triton["grpc"])
    with server_process("the floor proxy", "benchmarks.floor", *args) as (proc, ports):
        if len(ports) != 2:
            raise RuntimeError(f"the floor proxy said {ports!r}, not its two ports")
        yield Endpoints(
            {"http": f"127.0.0.1:{ports[0]}", "grpc": f"127.0.0.1:{ports[1]}"},
            dict(triton),
            proc.pid,
        )


async def noop_target(
    stack: contextlib.AsyncExitStack,
    url: str,
    protocol: str,
    model: str = NOOP,
    grpc_client: str = GRPC_CLIENTS[0],
) -> Target:
    """Where the bench's requests go over ``protocol`` (a gRPC client of ``grpc_client``'s
    kind entered on ``stack``), each carrying one row of ones, as ``noop`` takes it."""
    data = np.ones((1, INPUT_WIDTH), dtype=np.float32)
    classes = [RequestClass("bench")]
    if protocol == "grpc":
        client = await stack.enter_async_context(GrpcClient(url, grpc_client))
        payloads = grpc_payloads(classes, [InputTensor("INPUT0", "FP32", data)], model, None)
        return Target(url, model, payloads, [1.0], grpc=client)
    return Target(url, model, build_payloads(classes, data=data), [1.0])


def measure(
    url: str,
    concurrency: int,
    duration_s: float,
    label: str,
    protocol: str = "http",
    model: str = NOOP,
    cpu_of: int | None = None,
    grpc_client: str = GRPC_CLIENTS[0],
) -> Run:
    """A closed loop of ``duration_s`` (after half a second's warm-up); with ``cpu_of``, that
    process's CPU over the measured loop per request answered."""
    cpu_s = [0.0, 0.0]

    async def go() -> Recorder:
        rec = Recorder()
        async with new_session() as session, contextlib.AsyncExitStack() as stack:
            target = await noop_target(stack, url, protocol, model, grpc_client)
            await closed_loop(
                session,
                target,
                concurrency,
                time.monotonic() + 0.5,
                Recorder(),
                np.random.default_rng(0),
            )  # warm-up
            if cpu_of is not None:
                cpu_s[0] = process_cpu_s(cpu_of)
            start = time.monotonic()
            await closed_loop(
                session, target, concurrency, start + duration_s, rec, np.random.default_rng(0)
            )
            if cpu_of is not None:
                cpu_s[1] = process_cpu_s(cpu_of)
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
        None if cpu_of is None else (cpu_s[1] - cpu_s[0]) * 1e6 / len(ok),
    )


def interleaved(
    urls: Mapping[str, str],
    duration_s: float,
    protocol: str = "http",
    model: str = NOOP,
    grpc_client: str = GRPC_CLIENTS[0],
) -> dict[str, dict[str, float]]:
    """One client at concurrency 1 sending each request to the next of ``urls`` in turn (the
    order rotating every round), for ``duration_s`` after half a second's warm-up: every path
    sees the same moments of the machine, so their latencies compare even where the drift
    between separate runs is larger than the difference. Each path's ``p50_us``, ``p99_us``
    and ``requests``."""
    labels = list(urls)
    recs = {label: Recorder() for label in labels}

    async def go() -> None:
        async with new_session() as session, contextlib.AsyncExitStack() as stack:
            targets = {
                label: await noop_target(stack, url, protocol, model, grpc_client)
                for label, url in urls.items()
            }
            turn = 0
            for seconds, record in ((0.5, False), (duration_s, True)):
                stop_at = time.monotonic() + seconds
                while time.monotonic() < stop_at:
                    for label in labels[turn:] + labels[:turn]:
                        rec = recs[label] if record else Recorder()
                        await send_one(session, targets[label], 0, rec)
                    turn = (turn + 1) % len(labels)

    asyncio.run(go())
    out: dict[str, dict[str, float]] = {}
    for label, rec in recs.items():
        lat = np.asarray([s.latency_s * 1e6 for s in rec.samples if s.status == 200])
        if lat.size == 0:
            raise RuntimeError(f"no request through {label} ({urls[label]}) was answered")
        out[label] = {
            "p50_us": float(np.percentile(lat, 50)),
            "p99_us": float(np.percentile(lat, 99)),
            "requests": float(lat.size),
        }
    return out


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


def _median(runs: list[Run]) -> dict[str, float]:
    """Medians of the rounds, units in the names (CPU only where it was measured)."""
    out = {
        "infer_per_s": float(np.median([r.throughput for r in runs])),
        "p50_us": float(np.median([r.p50_us for r in runs])),
        "p99_us": float(np.median([r.p99_us for r in runs])),
    }
    cpu = [r.cpu_us for r in runs if r.cpu_us is not None]
    if cpu:
        out["cpu_us"] = float(np.median(cpu))
    return out


def _cell(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _target(targets: Mapping[tuple[str, int], float], key: tuple[str, int]) -> str:
    value = targets.get(key)
    return "" if value is None else f"≤ {value:.0f}"


def cost_rows(
    now: list[Cost],
    before: Mapping[tuple[str, int], Cost] | None,
    floor: Mapping[tuple[str, int], Cost] | None = None,
) -> list[tuple[str, ...]]:
    """One row per protocol and concurrency: CPU µs per request, throughput kept, p50 and p99
    added (µs), each before and now, the floor's CPU and p50 added, and the targets."""
    rows: list[tuple[str, ...]] = []
    for c in now:
        key = (c.protocol, c.concurrency)
        b = None if before is None else before.get(key)
        f = None if floor is None else floor.get(key)
        rows.append(
            (
                c.protocol,
                str(c.concurrency),
                _cell(None if b is None else b.sidecar.get("cpu_us"), ".0f"),
                _cell(c.sidecar.get("cpu_us"), ".0f"),
                _cell(None if f is None else f.sidecar.get("cpu_us"), ".0f"),
                _target(CPU_TARGET_US, key),
                _cell(None if b is None else b.kept, ".0%"),
                f"{c.kept:.0%}",
                _cell(None if b is None else b.added_us("p50_us"), "+.0f"),
                f"{c.added_us('p50_us'):+.0f}",
                _cell(None if f is None else f.added_us("p50_us"), "+.0f"),
                _target(P50_ADDED_TARGET_US, key),
                _cell(None if b is None else b.added_us("p99_us"), "+.0f"),
                f"{c.added_us('p99_us'):+.0f}",
            )
        )
    return rows


COST_HEAD = (
    "protocol",
    "concurrency",
    "CPU µs/request before",
    "now",
    "floor",
    "target",
    "throughput kept before",
    "now",
    "p50 added µs before",
    "now",
    "floor",
    "target",
    "p99 added µs before",
    "now",
)


GRPC_CLIENT_SAID = {
    "h2": "the sidecar's own HTTP/2 channel (`--grpc-client h2`)",
    "grpcio": "grpc.aio (`--grpc-client grpcio`)",
}

PAIRED_HEAD = (
    "protocol",
    "requests per path",
    "direct p50 µs",
    "p50 added µs before",
    "now",
    "floor",
    "target",
)


def paired_rows(
    paired: Mapping[str, Mapping[str, Mapping[str, float]]],
) -> list[tuple[str, ...]]:
    """One row per protocol of the interleaved run: each path's p50 less direct's."""
    rows: list[tuple[str, ...]] = []
    for protocol, paths in paired.items():
        direct = paths["direct"]["p50_us"]
        added = [
            "—" if label not in paths else f"{paths[label]['p50_us'] - direct:+.0f}"
            for label in ("before", "now", "floor")
        ]
        rows.append(
            (
                protocol,
                f"{min(p['requests'] for p in paths.values()):.0f}",
                f"{direct:.0f}",
                *added,
                _target(P50_ADDED_TARGET_US, (protocol, 1)),
            )
        )
    return rows


def text_table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Columns aligned to the right, for the terminal."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    return [
        "  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True))
        for line in (head, *rows)
    ]


def read_costs(path: Path) -> dict[tuple[str, int], Cost]:
    """The before figures from an earlier run's ``bench.json``: its ``before`` section if it
    measured one side by side, else its own."""
    data = json.loads(path.read_text())
    data = data.get("results", data)
    rows = data.get("before") or data["cost"]
    return {
        (r["protocol"], r["concurrency"]): Cost(
            r["protocol"], r["concurrency"], r["direct"], r["sidecar"]
        )
        for r in rows
        if "cpu_us" in r["sidecar"] or "before" not in data
    }


def _source_commit(tree: Path) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else None


def _report(
    costs: list[Cost],
    before: Mapping[tuple[str, int], Cost] | None,
    before_label: str,
    floor: Mapping[tuple[str, int], Cost] | None,
    checks: list[dict[str, float]],
    args: argparse.Namespace,
    paired: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None,
) -> str:
    """The results file's body: the cost per protocol and concurrency, the latency added at
    concurrency 1 with requests interleaved, then loadgen's check."""
    parts = [
        f"The sidecar (policy max, its own process) in front of the embedded Triton's `noop`, "
        f"against Triton's own endpoint of the same protocol; closed loops of "
        f"{args.duration_s:g} s, direct and sidecar alternating; medians over rounds "
        f"(rounds: {args.rounds}). CPU: the sidecar process's own user + system time per "
        f"request answered. Added: sidecar − direct. The load generator's gRPC client: "
        f"{GRPC_CLIENT_SAID[args.grpc_client]}. Before: {before_label}. Floor: "
        + (
            "the least a Python proxy of the same libraries does (`python -m benchmarks.floor`: "
            "uvloop and httptools passing bytes through for HTTP, the sidecar's own HTTP/2 "
            "server and channel passing `ModelInfer` through for gRPC; no admission, queue or "
            "scheduling), in its own process in the same rounds."
            if floor
            else "not measured."
        ),
        markdown_table(COST_HEAD, cost_rows(costs, before, floor)),
    ]
    if paired:
        parts += [
            "At concurrency 1, one client sending each request to the next path in turn "
            f"(direct, then each sidecar; the order rotating every round) for "
            f"{args.duration_s * args.rounds:g} s: every path sees the same moments of the "
            "machine, so the p50 added compares where separate runs drift by more than it.",
            markdown_table(PAIRED_HEAD, paired_rows(paired)),
        ]
    if checks:
        parts += [
            "loadgen against an independent client (NVIDIA's tritonclient in threads), "
            "straight to Triton over HTTP:",
            markdown_table(
                [
                    "concurrency",
                    "loadgen infer/s",
                    "loadgen mean µs",
                    "tritonclient infer/s",
                    "tritonclient mean µs",
                ],
                [
                    (
                        int(c["concurrency"]),
                        f"{c['loadgen_infer_per_s']:.0f}",
                        f"{c['loadgen_mean_us']:.0f}",
                        f"{c['tritonclient_infer_per_s']:.0f}",
                        f"{c['tritonclient_mean_us']:.0f}",
                    )
                    for c in checks
                ],
            ),
        ]
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2, help="A/B alternations per concurrency")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument(
        "--before-tree",
        type=Path,
        help="a source tree (an earlier commit's, say) whose sidecar is measured side by side",
    )
    parser.add_argument(
        "--before", type=Path, help="an earlier run's bench.json: the before figures"
    )
    parser.add_argument(
        "--grpc-client",
        default=GRPC_CLIENTS[0],
        choices=GRPC_CLIENTS,
        help="the load generator's gRPC client (python -m loadgen --grpc-client; default h2)",
    )
    parser.add_argument("--no-check", action="store_true", help="skip loadgen's own check")
    parser.add_argument(
        "--no-floor", action="store_true", help="skip the floor proxy (python -m benchmarks.floor)"
    )
    parser.add_argument(
        "--name", default="bench", help="the results files' name (default: bench.md, .json)"
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=DEFAULT_DIR,
        help="where bench.md and bench.json are written (default: results)",
    )
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    protocols = args.protocols.split(",")
    sides = ["now"] + (["before"] if args.before_tree else [])
    sides += [] if args.no_floor else ["floor"]
    costs: dict[str, list[Cost]] = {side: [] for side in sides}
    checks: list[dict[str, float]] = []
    paired: dict[str, dict[str, dict[str, float]]] = {}  # protocol -> path -> p50, p99
    no_profiling = "--profile-models="  # policy max needs no table: start in seconds
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        ends = {
            "now": stack.enter_context(
                sidecar_process(tmp / "now", no_profiling, *room_at_triton(None))
            )
        }
        if args.before_tree:
            source = args.before_tree.resolve()
            ends["before"] = stack.enter_context(
                sidecar_process(
                    tmp / "before",
                    no_profiling,
                    *room_at_triton(source),
                    source=source,
                    triton=ends["now"].triton,
                )
            )
        triton = ends["now"].triton
        if not args.no_floor:
            ends["floor"] = stack.enter_context(floor_process(triton))
        print(
            ", ".join(f"sidecar {s} {ends[s].sidecar}" for s in sides)
            + f" (policy max, {MAX_INFLIGHT} in flight) in front of Triton {triton}; model noop"
        )
        print(
            f"{'proto':>5} {'conc':>4} {'path':>8} {'infer/s':>9} {'p50 µs':>8} {'p99 µs':>8} "
            f"{'CPU µs/req':>10}"
        )
        for protocol, c in itertools.product(protocols, levels):
            runs: dict[str, list[Run]] = {"direct": [], **{s: [] for s in sides}}
            for _ in range(args.rounds):
                for label in runs:
                    where = triton if label == "direct" else ends[label].sidecar
                    pid = None if label == "direct" else ends[label].pid
                    r = measure(
                        where[protocol],
                        c,
                        args.duration_s,
                        label,
                        protocol,
                        cpu_of=pid,
                        grpc_client=args.grpc_client,
                    )
                    runs[label].append(r)
                    print(
                        f"{protocol:>5} {c:>4} {label:>8} {r.throughput:>9.0f} "
                        f"{r.p50_us:>8.0f} {r.p99_us:>8.0f} {_cell(r.cpu_us, '10.0f')}",
                        flush=True,
                    )
            direct = _median(runs["direct"])
            for side in sides:
                costs[side].append(Cost(protocol, c, direct, _median(runs[side])))
        if 1 in levels:
            seconds = args.duration_s * args.rounds
            print(f"\nconcurrency 1, one request to each path in turn for {seconds:g} s:")
            for protocol in protocols:
                urls = {"direct": triton[protocol]}
                urls.update({side: ends[side].sidecar[protocol] for side in sides})
                paired[protocol] = interleaved(
                    urls, seconds, protocol, grpc_client=args.grpc_client
                )
                print(
                    f"  {protocol}: "
                    + ", ".join(
                        f"{label} p50 {r['p50_us']:.0f} µs" for label, r in paired[protocol].items()
                    ),
                    flush=True,
                )
        if not args.no_check:
            print("\nloadgen against an independent client (tritonclient threads), to Triton:")
            for c in (1, 4):
                lg = measure(triton["http"], c, args.duration_s, "direct")
                tput, mean = independent(triton["http"], c, args.duration_s)
                checks.append(
                    {
                        "concurrency": c,
                        "loadgen_infer_per_s": lg.throughput,
                        "loadgen_mean_us": lg.mean_us,
                        "tritonclient_infer_per_s": tput,
                        "tritonclient_mean_us": mean,
                    }
                )
                print(
                    f"  concurrency {c}: loadgen {lg.throughput:.0f} infer/s, "
                    f"mean {lg.mean_us:.0f} µs; tritonclient {tput:.0f} infer/s, "
                    f"mean {mean:.0f} µs"
                )
    before: dict[tuple[str, int], Cost] | None = None
    before_label = "none given"
    if "before" in costs:
        before = {(b.protocol, b.concurrency): b for b in costs["before"]}
        commit = _source_commit(args.before_tree)
        before_label = f"{args.before_tree}{f' ({commit[:12]})' if commit else ''}, side by side"
    elif args.before is not None and args.before.exists():
        before = read_costs(args.before)
        source = json.loads(args.before.read_text()).get("results", {}).get("before_source")
        before_label = f"{args.before}" + (f", measured as {source}" if source else "")
    elif args.before is not None:
        before_label = f"none ({args.before} does not exist)"
    floor = {(f.protocol, f.concurrency): f for f in costs["floor"]} if "floor" in costs else None
    print(
        f"\nthe sidecar's cost (medians of {args.rounds} rounds of {args.duration_s:g} s; CPU: "
        f"its own process, per request; added: sidecar − direct; before: {before_label}; "
        f"floor: python -m benchmarks.floor, {'side by side' if floor else 'not measured'}):"
    )
    for line in text_table(COST_HEAD, cost_rows(costs["now"], before, floor)):
        print("  " + line)
    if paired:
        print("\nat concurrency 1, requests interleaved (p50 added µs: path − direct):")
        for line in text_table(PAIRED_HEAD, paired_rows(paired)):
            print("  " + line)
    data: dict[str, Any] = {
        "settings": {**{k: str(v) for k, v in vars(args).items()}, "model": NOOP, "policy": "max"},
        "cost": [c.to_json() for c in costs["now"]],
        "loadgen_check": checks,
        "interleaved": paired,
    }
    if floor is not None:
        data["floor"] = [f.to_json() for f in floor.values()]
    if before is not None:
        data["before"] = [b.to_json() for b in before.values()]
        data["before_source"] = before_label
    md, _ = write_results(
        args.name,
        title="What the sidecar costs (python -m benchmarks.bench)",
        markdown=_report(costs["now"], before, before_label, floor, checks, args, paired),
        data=data,
        directory=args.results_dir,
    )
    print(f"\nwritten to {md} (and .json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
