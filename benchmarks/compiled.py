"""The request path compiled (``setup.py``, mypyc) against the same source run as Python.

``python -m benchmarks.compiled`` times two things twice in each round: once with this
checkout's compiled modules, once with a copy of the compiled packages' Python source alone
(``api`` and ``scheduler``, no extension beside them), each in a process of its own, the two
alternating. The first is the scheduler core's work per request (``scheduler bench``'s
``core_cost``: one enqueue, one dispatch and one completion at a steady queue); the second is
the sidecar's whole Python per request (``benchmarks.pathbench``'s ``cost_us``: from the
request's bytes to its reply's, HTTP and gRPC, a fake Triton answering at once). It reports
both CPU times per request and their ratio, from the same rounds, so that a busy or throttled
machine moves both. With ``--instructions`` (valgrind's callgrind installed) it also counts
the instructions per request of each, which no neighbour's load moves: the difference between
a run of few requests and one of more, counted only once the imports are done
(``--instr-atstart=no``, switched on by ``callgrind_control``). Writes ``compiled.{md,json}``.
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

from benchmarks.native_build import compiled_packages
from simulator.results import DEFAULT_DIR, SOURCE_ROOT, markdown_table, write_results

# (what, its argument): the core under a policy at a queue length, or the whole path of a
# protocol at a concurrency.
CELLS = (
    ("core", "max", 1000),
    ("core", "adaptive", 1000),
    ("core", "adaptive", 10),
    ("path", "http", 16),
    ("path", "grpc", 16),
)
# Requests counted under callgrind (fewer, more): the difference is over the requests between.
COUNTS = {"core": (200, 600), "path": (300, 900)}
# One measurement in a child process: the cell's cost per request, or (instructions) a
# warm-up, a word on stdout, a pause while callgrind is switched on, and the run counted.
_CORE = """
from simulator.bench import core_cost
import scheduler.core as module
def measure(policy, queue, rounds):
    return core_cost(policy, queue_len=queue, rounds=rounds).us_per_enqueue_and_dispatch
TIMES = (200, 3000)
"""
_PATH = """
import uvloop
from benchmarks.pathbench import cost_us
import api.connection as module
def measure(protocol, concurrency, requests):
    return uvloop.run(cost_us(protocol, concurrency, requests))
TIMES = (400, 4000)
"""
TIMED = """
import json, sys
name, arg = sys.argv[1], int(sys.argv[2])
measure(name, arg, TIMES[0])
print(json.dumps({"us": measure(name, arg, TIMES[1]), "module": module.__file__}))
"""
COUNTED = """
import sys, time
name, arg, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
measure(name, arg, 50)
print("ready", flush=True)
time.sleep(2)
measure(name, arg, rounds)
"""
SCRIPTS = {"core": _CORE, "path": _PATH}


def pure_copy(directory: Path) -> Path:
    """A copy of the compiled packages' Python source alone under ``directory``, to put first
    on ``PYTHONPATH``: there it is what ``import scheduler`` and ``import api`` find,
    uncompiled."""
    for package in compiled_packages():
        shutil.copytree(
            SOURCE_ROOT / package, directory / package, ignore=shutil.ignore_patterns("*.so")
        )
    return directory


def _env(path: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), str(SOURCE_ROOT)])
    return env


def timed(kind: str, name: str, arg: int, path: Path | None) -> tuple[float, str]:
    """CPU µs per request of one run, and the file its first compiled module came from."""
    out = subprocess.run(
        [sys.executable, "-c", SCRIPTS[kind] + TIMED, name, str(arg)],
        env=_env(path),
        cwd=path or SOURCE_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return float(got["us"]), str(got["module"])


def counted(kind: str, name: str, arg: int, path: Path | None, rounds: int) -> int:
    """The instructions of ``rounds`` requests (and the run's fixed cost) under callgrind."""
    return counted_script(SCRIPTS[kind], name, arg, path, rounds)


def counted_script(script: str, name: str, arg: int, path: Path | None, rounds: int) -> int:
    """:func:`counted` of ``script`` (which defines ``measure(name, arg, rounds)``), with
    ``path`` first on ``PYTHONPATH`` and the working directory."""
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
                script + COUNTED,
                name,
                str(arg),
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


def instructions(kind: str, name: str, arg: int, path: Path | None) -> float:
    """Instructions per request: more requests' count less fewer's, over those between."""
    few, more = COUNTS[kind]
    return (counted(kind, name, arg, path, more) - counted(kind, name, arg, path, few)) / (
        more - few
    )


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
        for kind, name, arg in CELLS:
            what = (
                f"the core under {name} at a queue of {arg}"
                if kind == "core"
                else f"the {name} path at concurrency {arg}"
            )
            compiled_us, pure_us = [], []
            module = ""
            for k in range(args.rounds):
                print(f"{what}: round {k + 1} of {args.rounds}", flush=True)
                us, module = timed(kind, name, arg, None)
                compiled_us.append(us)
                pure_us.append(timed(kind, name, arg, pure)[0])
            cell: dict[str, object] = {
                "kind": kind,
                "name": name,
                "arg": arg,
                "compiled": module.endswith(".so"),
                "compiled_us": compiled_us,
                "pure_us": pure_us,
            }
            c, p = statistics.median(compiled_us), statistics.median(pure_us)
            row: list[object] = [what, "yes" if cell["compiled"] else "no",
                                 f"{p:.1f}", f"{c:.1f}", f"{c / p:.2f}"]  # fmt: skip
            if args.instructions:
                print(f"{what}: counting instructions", flush=True)
                ci = instructions(kind, name, arg, None)
                pi = instructions(kind, name, arg, pure)
                cell |= {"compiled_instructions": ci, "pure_instructions": pi}
                row += [f"{pi:,.0f}", f"{ci:,.0f}", f"{ci / pi:.2f}"]
            rows.append(row)
            data.append(cell)
    head = ["cell", "compiled", "CPU µs/request Python", "compiled", "ratio"]
    if args.instructions:
        head += ["instructions/request Python", "compiled", "ratio"]
    core, path = COUNTS["core"], COUNTS["path"]
    md, _ = write_results(
        "compiled",
        title="The compiled request path against its Python (python -m benchmarks.compiled)",
        markdown=(
            "CPU time per request, this checkout's compiled modules against a copy of the same "
            "source run as Python, each in its own process, alternating; medians over "
            f"{args.rounds} rounds (started at {started}). The core: one enqueue, dispatch and "
            "completion at a steady queue, batch holds off, 3 flows (`scheduler bench`). The "
            "path: the sidecar's whole Python from a request's bytes to its reply's, a fake "
            "Triton answering at once, policy max (`benchmarks.pathbench`). Instructions "
            f"(where counted): callgrind's count over {core[1] - core[0]} requests (core) and "
            f"{path[1] - path[0]} (path), without the imports.\n\n" + markdown_table(head, rows)
        ),
        data={"rounds": args.rounds, "cells": data},
        directory=args.results_dir,
    )
    print(markdown_table(head, rows))
    print(f"written to {md} (and .json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
