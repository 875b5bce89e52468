"""System calls per request: the sidecar's, the floor proxy's and, with ``--before-tree``,
another tree's sidecar, counted by ``strace -c`` under the same closed loop.

CPU time per request moves by tens of percent on a shared machine from one minute to the
next; the number of system calls a request makes does not. Each one is a trip into the kernel
(on a virtual machine with today's mitigations, hundreds of nanoseconds before it does any
work), and a call added to the request path by accident (a file read, a clock read that is a
system call, a thread woken per request) shows here exactly, where the CPU figures would hide
it in their noise. The floor (:mod:`benchmarks.floor`) is what the same libraries need to
pass the bytes through: about two reads and two writes per request over HTTP (the client's
and Triton's sockets), fewer over gRPC, where HTTP/2 carries several calls per read.

``python -m benchmarks.syscalls`` starts the sidecar (policy max) in front of the embedded
Triton's ``noop`` as :mod:`benchmarks.bench` does, attaches ``strace -c -f`` to each path's
process in turn, runs a closed loop of ``--duration-s`` through it while attached, and divides
each system call's count by the requests answered. What the process does while idle (its
energy reader's polls) is counted too, over the half second around each loop, and given on its
own line per second of idling. Writes ``results/syscalls.{md,json}``. Needs ``strace`` (Debian:
``apt-get install strace``) and the right to trace one's own processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.bench import (
    Endpoints,
    _source_commit,
    floor_process,
    noop_target,
    sidecar_process,
)
from loadgen.engine import Recorder, closed_loop, new_session
from simulator.results import DEFAULT_DIR, markdown_table, write_results

ATTACH_S = 0.5  # strace's attach to every thread, before the loop starts
SHOWN = ("read", "write", "epoll_pwait", "futex", "getpid")  # the columns; the rest is "other"


@dataclass(frozen=True)
class Count:
    """One path's system calls over one loop: each call's count and the requests answered."""

    protocol: str
    path: str
    requests: int
    calls: dict[str, int]
    seconds: float  # how long strace was attached

    def per_request(self, name: str | None = None) -> float:
        """Calls per request answered: of ``name``, or of all (None)."""
        n = sum(self.calls.values()) if name is None else self.calls.get(name, 0)
        return n / max(1, self.requests)


def parse_summary(text: str) -> dict[str, int]:
    """The per-call counts of ``strace -c``'s summary table (its ``total`` line left out)."""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or not fields[3].isdigit() or fields[-1] == "total":
            continue
        calls[fields[-1]] = calls.get(fields[-1], 0) + int(fields[3])
    return calls


@contextlib.contextmanager
def traced(pid: int, out: Path) -> Iterator[None]:
    """``strace -c -f`` attached to ``pid`` (every thread) for the block; its summary in
    ``out`` once the block is left."""
    proc = subprocess.Popen(
        ["strace", "-c", "-f", "-o", str(out), "-p", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(ATTACH_S)
    if proc.poll() is not None:
        why = proc.stderr.read().strip() if proc.stderr is not None else ""
        raise RuntimeError(f"strace could not attach to {pid}: {why}")
    try:
        yield
    finally:
        proc.terminate()  # strace writes its summary as it detaches
        proc.wait(timeout=30)


def answered(url: str, protocol: str, concurrency: int, duration_s: float) -> int:
    """A closed loop of ``duration_s`` through ``url``; the requests answered with 200."""

    async def go() -> int:
        rec = Recorder()
        async with new_session() as session, contextlib.AsyncExitStack() as stack:
            target = await noop_target(stack, url, protocol)
            await closed_loop(
                session,
                target,
                concurrency,
                time.monotonic() + duration_s,
                rec,
                np.random.default_rng(0),
            )
        return sum(1 for s in rec.samples if s.status == 200)

    return asyncio.run(go())


def count(
    path: str, ep: Endpoints, protocol: str, concurrency: int, duration_s: float, work: Path
) -> Count:
    """``path``'s system calls over one loop of ``duration_s`` (after a warm-up untraced)."""
    url = ep.sidecar[protocol]
    answered(url, protocol, concurrency, 1.0)  # connections open, caches filled
    out = work / f"{path}-{protocol}.strace"
    start = time.monotonic()
    with traced(ep.pid, out):
        requests = answered(url, protocol, concurrency, duration_s)
    return Count(protocol, path, requests, parse_summary(out.read_text()), time.monotonic() - start)


def idle_per_s(path: str, ep: Endpoints, work: Path, seconds: float = 2.0) -> float:
    """System calls per second of ``path``'s process with no request."""
    out = work / f"{path}-idle.strace"
    start = time.monotonic()
    with traced(ep.pid, out):
        time.sleep(seconds)
    return sum(parse_summary(out.read_text()).values()) / (time.monotonic() - start)


def rows(counts: list[Count]) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for c in counts:
        other = c.per_request() - sum(c.per_request(n) for n in SHOWN)
        out.append(
            (
                c.protocol,
                c.path,
                c.requests,
                f"{c.per_request():.2f}",
                *(f"{c.per_request(n):.2f}" for n in SHOWN),
                f"{other:.2f}",
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.syscalls", description=__doc__)
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=3.0)
    parser.add_argument(
        "--before-tree", type=Path, help="another source tree whose sidecar is counted too"
    )
    parser.add_argument("--no-floor", action="store_true", help="skip the floor proxy")
    parser.add_argument(
        "--results-dir", type=Path, default=DEFAULT_DIR, help="where syscalls.{md,json} go"
    )
    args = parser.parse_args(argv)
    if shutil.which("strace") is None:
        print("benchmarks.syscalls needs strace (Debian: apt-get install strace)", file=sys.stderr)
        return 2
    protocols = [p for p in args.protocols.split(",") if p]
    if not protocols or any(p not in ("http", "grpc") for p in protocols):
        parser.error(f"--protocols takes http and grpc, got {args.protocols!r}")
    counts: list[Count] = []
    idle: dict[str, float] = {}
    no_profiling = "--profile-models="  # policy max needs no table: start in seconds
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        now = stack.enter_context(sidecar_process(work / "now", no_profiling))
        paths: dict[str, Endpoints] = {"sidecar": now}
        if args.before_tree is not None:
            paths["before"] = stack.enter_context(
                sidecar_process(
                    work / "before", no_profiling, source=args.before_tree, triton=now.triton
                )
            )
        if not args.no_floor:
            paths["floor"] = stack.enter_context(floor_process(now.triton))
        for protocol in protocols:
            for path, ep in paths.items():
                c = count(path, ep, protocol, args.concurrency, args.duration_s, work)
                counts.append(c)
                print(
                    f"  {protocol:>4} {path:>8}: {c.per_request():5.2f} system calls per "
                    f"request ({c.requests} requests)",
                    flush=True,
                )
        for path, ep in paths.items():
            idle[path] = idle_per_s(path, ep, work)
    head = ["protocol", "path", "requests", "calls per request", *SHOWN, "other"]
    markdown = "\n\n".join(
        [
            f"System calls per request answered, `strace -c -f` attached to each path's "
            f"process (every thread) over a closed loop of {args.duration_s:g} s at "
            f"concurrency {args.concurrency} through it, with {ATTACH_S:g} s attached before "
            "the loop and the time to detach after it; policy max, the embedded Triton's "
            "`noop`. Paths: `sidecar` (this tree)"
            + (
                f", `before` ({args.before_tree}, {_source_commit(args.before_tree)})"
                if args.before_tree
                else ""
            )
            + (", `floor` (`python -m benchmarks.floor`)" if not args.no_floor else "")
            + ".",
            markdown_table(head, rows(counts)),
            "Idle (no request), system calls per second: "
            + ", ".join(f"{p} {v:.0f}" for p, v in idle.items())
            + ".",
        ]
    )
    data: Mapping[str, object] = {
        "concurrency": args.concurrency,
        "duration_s": args.duration_s,
        "before_tree": args.before_tree,
        "counts": [
            {
                "protocol": c.protocol,
                "path": c.path,
                "requests": c.requests,
                "seconds": round(c.seconds, 3),
                "calls": c.calls,
                "per_request": round(c.per_request(), 3),
            }
            for c in counts
        ],
        "idle_calls_per_s": {p: round(v, 1) for p, v in idle.items()},
    }
    md, js = write_results(
        "syscalls",
        title="System calls per request (python -m benchmarks.syscalls)",
        markdown=markdown,
        data=data,
        directory=args.results_dir,
    )
    print(f"written to {md} (and {js.name})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
