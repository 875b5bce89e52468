"""Instructions per request of the sidecar's own Python, this checkout against another tree.

CPU time per request moves with the machine's load and its neighbours' by more than most code
changes do; the instructions a request executes do not. This counts them with valgrind's
callgrind for ``benchmarks.pathbench``'s path (the sidecar's Python from a request's bytes to
its reply's, a fake Triton answering at once, policy max, the tables that learn on), HTTP and
gRPC at concurrency 1 and 16: for this checkout, and for ``--before-tree DIR`` (an earlier
commit's checkout, its compiled modules built in place with ``python setup.py build_ext
--inplace``), driven by this checkout's ``pathbench`` so that both run the same benchmark.
Each figure is the difference between a run of more requests and one of fewer, over the
requests between, counted only once the imports are done (as ``benchmarks.compiled
--instructions`` counts). Writes ``instructions.{md,json}``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from benchmarks.compiled import COUNTS, counted_script
from simulator.results import DEFAULT_DIR, markdown_table, write_results

PATHBENCH = Path(__file__).with_name("pathbench.py")
# This checkout's pathbench, loaded by its file (the other tree's packages come first on the
# path, its own benchmarks among them).
_SCRIPT = f"""
import importlib.util, sys, uvloop
spec = importlib.util.spec_from_file_location("pathbench_here", {str(PATHBENCH)!r})
bench = importlib.util.module_from_spec(spec)
sys.modules["pathbench_here"] = bench
spec.loader.exec_module(bench)
def measure(protocol, concurrency, requests):
    return uvloop.run(bench.cost_us(protocol, concurrency, requests))
"""
CELLS = (("http", 1), ("http", 16), ("grpc", 1), ("grpc", 16))


def per_request(protocol: str, concurrency: int, tree: Path | None) -> float:
    """Instructions per request of ``tree``'s code (None: this checkout's)."""
    few, more = COUNTS["path"]
    counts = [counted_script(_SCRIPT, protocol, concurrency, tree, n) for n in (few, more)]
    return (counts[1] - counts[0]) / (more - few)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__)
    parser.add_argument(
        "--before-tree", type=Path, help="an earlier checkout, its modules built in place"
    )
    parser.add_argument(
        "--results-dir", type=Path, default=DEFAULT_DIR, help="where instructions.{md,json} go"
    )
    args = parser.parse_args(argv)
    before = args.before_tree.resolve() if args.before_tree else None
    if before is not None and not (before / "api").is_dir():
        parser.error(f"--before-tree {args.before_tree}: no sidecar checkout there")
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        parser.error("this needs valgrind (Debian: apt-get install valgrind)")
    rows, data = [], []
    for protocol, concurrency in CELLS:
        print(f"{protocol} at concurrency {concurrency}: counting", flush=True)
        now = per_request(protocol, concurrency, None)
        cell: dict[str, object] = {"protocol": protocol, "concurrency": concurrency, "now": now}
        row = [protocol, str(concurrency)]
        if before is not None:
            was = per_request(protocol, concurrency, before)
            cell["before"] = was
            row += [f"{was:,.0f}", f"{now:,.0f}", f"{now / was:.3f}"]
        else:
            row.append(f"{now:,.0f}")
        rows.append(row)
        data.append(cell)
    head = ["protocol", "concurrency"]
    head += ["before", "now", "now / before"] if before is not None else ["instructions/request"]
    few, more = COUNTS["path"]
    said = f"; before: `{args.before_tree}`, driven by this checkout's pathbench" if before else ""
    md, _ = write_results(
        "instructions",
        title="Instructions per request of the sidecar's Python "
        "(python -m benchmarks.instructions)",
        markdown=(
            "callgrind's count over "
            f"{more - few} requests of `benchmarks.pathbench`'s path (policy max, the tables "
            "that learn on, a fake Triton), without the imports"
            + said
            + ".\n\n"
            + markdown_table(head, rows)
        ),
        data={"before_tree": before, "cells": data},
        directory=args.results_dir,
    )
    print(markdown_table(head, rows))
    print(f"written to {md} (and .json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
