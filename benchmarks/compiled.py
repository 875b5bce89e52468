"""The scheduler core compiled (``setup.py``, mypyc) against the same source run as Python.

``python -m benchmarks.compiled`` times the core's work per request (``scheduler bench``'s
``core_cost``: one enqueue, one dispatch and one completion at a steady queue) twice in each
round: once with this checkout's compiled modules, once with a copy of the same ``scheduler``
package's Python source alone (no extension beside it), each in a process of its own, the two
alternating. It reports both CPU times per request and their ratio, from the same rounds, so
that a busy or throttled machine moves both. With ``--instructions`` (valgrind's callgrind
installed) it also counts the instructions per request of each, which no neighbour's load
moves: the difference between a run of 200 and one of 600 requests, counted only once the
imports and tables are done (``--instr-atstart=no``, switched on by ``callgrind_control``).
Writes ``compiled.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simulator.results import DEFAULT_DIR, SOURCE_ROOT, markdown_table, write_results

CELLS = (("max", 1000), ("adaptive", 1000), ("adaptive", 10))
# One measurement in a child process: this package's core_cost, or (instructions) a warm-up,
# a word on stdout, a pause while callgrind is switched on, and the run that is counted.
TIMED = """
import json, sys
from simulator.bench import core_cost
import scheduler.core
policy, queue = sys.argv[1], int(sys.argv[2])
core_cost(policy, queue_len=queue, rounds=200)
us = core_cost(policy, queue_len=queue).us_per_enqueue_and_dispatch
print(json.dumps({"us": us, "module": scheduler.core.__file__}))
"""
COUNTED = """
import sys, time
from simulator.bench import core_cost
policy, queue, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
core_cost(policy, queue_len=queue, rounds=50)
print("ready", flush=True)
time.sleep(2)
core_cost(policy, queue_len=queue, rounds=rounds)
"""


def pure_copy(directory: Path) -> Path:
    """A copy of the ``scheduler`` package's Python source alone under ``directory``, to put
    first on ``PYTHONPATH``: there it is what ``import scheduler`` finds, uncompiled."""
    target = directory / "scheduler"
    shutil.copytree(SOURCE_ROOT / "scheduler", target, ignore=shutil.ignore_patterns("*.so"))
    return directory


def _env(path: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), str(SOURCE_ROOT)])
    return env


def timed(policy: str, queue: int, path: Path | None) -> tuple[float, str]:
    """CPU µs per request of one run, and the file ``scheduler.core`` was loaded from."""
    out = subprocess.run(
        [sys.executable, "-c", TIMED, policy, str(queue)],
        env=_env(path),
        cwd=path or SOURCE_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return float(got["us"]), str(got["module"])


def counted(policy: str, queue: int, path: Path | None, rounds: int) -> int:
    """The instructions of ``rounds`` requests (and the run's fixed cost) under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / "callgrind.out"
        child = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={out_file}",
                sys.executable,
                "-c",
                COUNTED,
                policy,
                str(queue),
                str(rounds),
            ],
            env=_env(path),
            cwd=path or SOURCE_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            child.kill()
            raise RuntimeError("the counted run did not start")
        subprocess.run(
            ["callgrind_control", "-i", "on", str(child.pid)], check=True, capture_output=True
        )
        if child.wait() != 0:
            raise RuntimeError(f"the counted run failed ({child.returncode})")
        for line in out_file.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError("callgrind wrote no total")


def instructions(policy: str, queue: int, path: Path | None) -> float:
    """Instructions per request: 600 requests' count less 200's, over the 400 between."""
    return (counted(policy, queue, path, 600) - counted(policy, queue, path, 200)) / 400


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compiled", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--instructions", action="store_true", help="count them (valgrind)")
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    if args.instructions and not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        parser.error("--instructions needs valgrind (Debian: apt-get install valgrind)")
    started = time.strftime("%H:%M")
    rows, data = [], []
    with tempfile.TemporaryDirectory() as tmp:
        pure = pure_copy(Path(tmp))
        for policy, queue in CELLS:
            compiled_us, pure_us = [], []
            module = ""
            for k in range(args.rounds):
                print(f"{policy} at a queue of {queue}: round {k + 1} of {args.rounds}", flush=True)
                us, module = timed(policy, queue, None)
                compiled_us.append(us)
                pure_us.append(timed(policy, queue, pure)[0])
            cell: dict[str, object] = {
                "policy": policy,
                "queue": queue,
                "compiled": module.endswith(".so"),
                "compiled_us": compiled_us,
                "pure_us": pure_us,
            }
            c, p = statistics.median(compiled_us), statistics.median(pure_us)
            row: list[object] = [policy, queue, "yes" if cell["compiled"] else "no",
                                 f"{p:.1f}", f"{c:.1f}", f"{c / p:.2f}"]  # fmt: skip
            if args.instructions:
                print(f"{policy} at a queue of {queue}: counting instructions", flush=True)
                ci, pi = instructions(policy, queue, None), instructions(policy, queue, pure)
                cell |= {"compiled_instructions": ci, "pure_instructions": pi}
                row += [f"{pi:,.0f}", f"{ci:,.0f}", f"{ci / pi:.2f}"]
            rows.append(row)
            data.append(cell)
    head = ["policy", "queue", "compiled", "CPU µs/request Python", "compiled", "ratio"]
    if args.instructions:
        head += ["instructions/request Python", "compiled", "ratio"]
    md, _ = write_results(
        "compiled",
        title="The compiled scheduler core against its Python (python -m benchmarks.compiled)",
        markdown=(
            "CPU time of the core per request (one enqueue, dispatch and completion at a steady "
            "queue, batch holds off, 3 flows): this checkout's compiled modules against a copy "
            "of the same source run as Python, each in its own process, alternating; medians "
            f"over {args.rounds} rounds (started at {started}). Instructions (where counted): "
            "callgrind's count over 400 requests, without the imports.\n\n"
            + markdown_table(head, rows)
        ),
        data={"rounds": args.rounds, "cells": data},
        directory=args.results_dir,
    )
    print(markdown_table(head, rows))
    print(f"written to {md} (and .json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
