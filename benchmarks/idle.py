"""What an idle sidecar costs: its process's CPU while nothing is sent to it.

A sidecar spends most of its life between bursts, and on a GPU node its CPU is taken from
Triton's. This starts the sidecar (policy ``max``, the embedded Triton, the tables that learn
and the energy reader on, as ``python -m api serve`` runs by default; ``--before-tree DIR``: a
second one from another source tree beside it, in front of the same Triton), sends each a
second of requests so that every lazy path has run, waits ``--settle-s`` (past the point where
an idle GPU's reader slows down), then reads each process's CPU (user + system, every thread,
from ``/proc``) over ``--rounds`` spans of ``--span-s``. Both sidecars are measured over the
same spans, so a busy neighbour moves both alike.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench import measure, process_cpu_s, room_at_triton, sidecar_process
from simulator.results import DEFAULT_DIR, markdown_table, write_results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.idle", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--span-s", type=float, default=10.0)
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument(
        "--before-tree", type=Path, help="another source tree's sidecar, measured beside it"
    )
    parser.add_argument(
        "--results-dir", type=Path, default=DEFAULT_DIR, help="where idle.{md,json} go"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.span_s <= 0 or args.settle_s < 0:
        parser.error("--rounds must be >= 1, --span-s > 0 and --settle-s >= 0")
    no_profiling = "--profile-models="  # policy max needs no table: start in seconds
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        now = stack.enter_context(sidecar_process(tmp / "now", no_profiling, *room_at_triton(None)))
        pids = {"now": now.pid}
        if args.before_tree:
            source = args.before_tree.resolve()
            before = stack.enter_context(
                sidecar_process(
                    tmp / "before",
                    no_profiling,
                    *room_at_triton(source),
                    source=source,
                    triton=now.triton,
                )
            )
            pids["before"] = before.pid
            measure(before.sidecar["http"], 1, 1.0, "warm-up", "http")
        measure(now.sidecar["http"], 1, 1.0, "warm-up", "http")
        time.sleep(args.settle_s)
        spans: dict[str, list[float]] = {side: [] for side in pids}
        for r in range(args.rounds):
            start = {side: process_cpu_s(pid) for side, pid in pids.items()}
            time.sleep(args.span_s)
            for side, pid in pids.items():
                spans[side].append((process_cpu_s(pid) - start[side]) / args.span_s * 1000.0)
            cells = ", ".join(f"{side} {v[-1]:.1f} ms/s" for side, v in spans.items())
            print(f"round {r + 1}/{args.rounds}: {cells}", flush=True)
    rows = [
        (side, f"{statistics.median(v):.1f}", f"{min(v):.1f}", f"{max(v):.1f}")
        for side, v in spans.items()
    ]
    markdown = (
        "The sidecar (policy max, the embedded Triton's `noop`, tables that learn and the energy "
        f"reader on) idle after a second of requests and {args.settle_s:g} s of rest; its "
        f"process's CPU over {args.rounds} spans of {args.span_s:g} s (1 ms/s is 0.1% of a "
        "core)"
        + (f"; before: `{args.before_tree}`, over the same spans" if args.before_tree else "")
        + ".\n\n"
        + markdown_table(["sidecar", "CPU ms/s, median", "min", "max"], rows)
    )
    md, _ = write_results(
        "idle",
        title="What an idle sidecar costs (python -m benchmarks.idle)",
        markdown=markdown,
        data={
            "settings": {
                "rounds": args.rounds,
                "span_s": args.span_s,
                "settle_s": args.settle_s,
                "before_tree": args.before_tree,
            },
            "cpu_ms_per_s": spans,
        },
        directory=args.results_dir,
    )
    print(f"written to {md} (and .json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
