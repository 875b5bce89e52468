"""The results file of ``compare``: every row (CSV and JSON), a markdown page with a table per
cell and a summary over cells, and where and from what code the figures came."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simulator.bestfixed import BEST_FIXED
from simulator.compare import Row, against_best_fixed

DEFAULT_POLICY = "adaptive"


def provenance(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The git commit (and whether the tree had changes), the machine and the command."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], capture_output=True, text=True, check=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD") or "unknown",
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "machine": platform.node(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(argv if argv is not None else sys.argv),
    }


def _cells(rows: Sequence[Row]) -> dict[tuple[Any, ...], list[Row]]:
    """Rows by cell without the seed: (GPU, mix, arrivals, load, SLO)."""
    out: dict[tuple[Any, ...], list[Row]] = {}
    for r in rows:
        out.setdefault((r["gpu"], r["mix"], r["arrival"], r["load"], r["slo_mult"]), []).append(r)
    return out


def _f(x: float, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def cell_table(rows: Sequence[Row], policy: str) -> list[str]:
    """Markdown: per cell (seeds together), ``policy`` against ``max``, ``best-fixed`` and the
    lower bound, with ``best-fixed``'s own p99 and clock."""
    head = (
        "| GPU | mix | arrivals | load | SLO × | best-fixed meets p99 | best-fixed MHz | "
        "bound / best-fixed | vs max | vs best-fixed (mean, worst) | vs bound | "
        "closed (least) | p99 / SLO (worst) |"
    )
    lines = [head, "|" + " --- |" * 13]
    for key, group in _cells(rows).items():
        fixed = [r for r in group if r["policy"] == BEST_FIXED]
        mine = [r for r in group if r["policy"] == policy]
        if not mine:
            continue
        gpu, mix, arrival, load, slo = key
        fixed_ok = sum(r["p99_over_slo"] <= 1 for r in fixed)
        mhz = [r["fixed_mhz"] for r in fixed]
        bound = [r["oracle_energy_per_inference_j"] / r["energy_per_inference_j"] for r in fixed]

        def mean(k: str, rs: list[Row] = mine) -> float:
            vals = [r[k] for r in rs if not math.isnan(r[k])]
            return float(np.mean(vals)) if vals else math.nan

        worst = max((r["vs_best_fixed"] for r in mine), default=math.nan)
        least = min((r["closed"] for r in mine if not math.isnan(r["closed"])), default=math.nan)
        p99 = max(r["p99_over_slo"] for r in mine)
        lines.append(
            f"| {gpu} | {mix} | {arrival} | {load:g} | {slo:g} | {fixed_ok}/{len(fixed)} | "
            f"{min(mhz, default=0)}–{max(mhz, default=0)} | "
            f"{_f(float(np.mean(bound)) if bound else math.nan)} | {_f(mean('vs_max'))} | "
            f"{_f(mean('vs_best_fixed'), 3)}, {_f(worst, 3)} | {_f(mean('vs_oracle'))} | "
            f"{_f(least)} | {'**' if p99 > 1 else ''}{_f(p99)}{'**' if p99 > 1 else ''} |"
        )
    return lines


def summary_table(rows: Sequence[Row]) -> list[str]:
    """Markdown: :func:`simulator.compare.against_best_fixed`, one row per policy."""
    lines = [
        "| policy | pairs where best-fixed meets p99 | meets p99 | ≤ best-fixed energy | both | "
        "vs best-fixed (mean, worst) | vs max | vs bound | closed (mean, least) |",
        "|" + " --- |" * 9,
    ]
    for s in against_best_fixed(rows):
        lines.append(
            f"| {s['policy']} | {s['cells']} | {s['meets']} | {s['cheaper']} | {s['both']} | "
            f"{_f(s['mean_vs_best_fixed'], 3)}, {_f(s['worst_vs_best_fixed'], 3)} | "
            f"{_f(s['mean_vs_max'])} | {_f(s['mean_vs_oracle'])} | "
            f"{_f(s['mean_closed'])}, {_f(s['least_closed'])} |"
        )
    return lines


def write_results(
    rows: Sequence[Row],
    out_dir: Path,
    *,
    title: str,
    describe: str,
    meta: dict[str, Any],
) -> list[Path]:
    """``compare.json`` (every row, the summary, ``meta``) and ``compare.md`` (the tables);
    the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = against_best_fixed(rows) if any(r["policy"] == BEST_FIXED for r in rows) else []
    json_path = out_dir / "compare.json"
    json_path.write_text(
        json.dumps({"meta": meta, "summary": summary, "rows": list(rows)}, indent=1, default=str)
    )
    policies = [p for p in dict.fromkeys(r["policy"] for r in rows) if p != BEST_FIXED]
    md = [
        f"# {title}",
        "",
        describe,
        "",
        f"Commit `{meta['commit']}`{' (with uncommitted changes)' if meta['dirty'] else ''}, "
        f"{meta['machine']} ({meta['platform']}, {meta['cpus']} CPUs, Python "
        f"{meta['python']}), {meta['date']}.",
        "",
        f"Command: `{meta['command']}`",
        "",
        "Energy per inference; *bound* is the lower bound (`simulator/oracle.py`); *closed* the "
        "share of the distance from best-fixed to the bound a policy covers; ratios are means "
        "over seeds, worst and least over seeds; bold: a p99 over the SLO.",
        "",
    ]
    if summary:
        md += ["## Summary over cells", "", *summary_table(rows), ""]
    for policy in sorted(policies, key=lambda p: p != DEFAULT_POLICY):
        md += [f"## {policy}, per cell", "", *cell_table(rows, policy), ""]
    md_path = out_dir / "compare.md"
    md_path.write_text("\n".join(md))
    return [json_path, md_path]
