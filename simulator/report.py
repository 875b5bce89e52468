"""The pages ``compare`` and ``tune`` write. ``compare``'s: a table per cell (seeds together)
for each policy against ``max``, ``best-fixed`` and the lower bound, and a summary over cells;
``tune``'s: that summary per value of the parameter swept. Markdown, written with
:func:`simulator.results.write_results` (commit and machine in the header)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from scheduler.registry import DEFAULT_POLICY
from simulator.bestfixed import BEST_FIXED, BEST_FIXED_CELL
from simulator.compare import BASELINES, Row, against_best_fixed
from simulator.results import markdown_table


def _cells(rows: Sequence[Row]) -> dict[tuple[Any, ...], list[Row]]:
    """Rows by cell without the seed: (GPU, mix, arrivals, load, SLO)."""
    out: dict[tuple[Any, ...], list[Row]] = {}
    for r in rows:
        out.setdefault((r["gpu"], r["mix"], r["arrival"], r["load"], r["slo_mult"]), []).append(r)
    return out


def _f(x: float | None, digits: int = 2) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


CELL_HEAD = (
    "| GPU | mix | arrivals | load | SLO × | best-fixed meets p99 | best-fixed MHz | "
    "bound / best-fixed | vs max | vs best-fixed (mean, worst) | vs bound | "
    "closed (mean, least) | p99 / SLO (worst) | past the p99 (worst; best-fixed) |"
)


def cell_table(rows: Sequence[Row], policy: str) -> list[str]:
    """Markdown: per cell (seeds together), ``policy`` against ``max``, ``best-fixed`` and the
    lower bound, with ``best-fixed``'s own p99 and clock."""
    lines = [CELL_HEAD, "|" + " --- |" * 14]
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
        past = _worst_past(mine)
        fixed_past = _worst_past(fixed)
        lines.append(
            f"| {gpu} | {mix} | {arrival} | {load:g} | {slo:g} | {fixed_ok}/{len(fixed)} | "
            f"{min(mhz, default=0)}–{max(mhz, default=0)} | "
            f"{_f(float(np.mean(bound)) if bound else math.nan)} | {_f(mean('vs_max'))} | "
            f"{_f(mean('vs_best_fixed'), 3)}, {_f(worst, 3)} | {_f(mean('vs_oracle'))} | "
            f"{_f(mean('closed'))}, {_f(least)} | "
            f"{'**' if p99 > 1 else ''}{_f(p99)}{'**' if p99 > 1 else ''} | "
            f"{_count(past)}; {_count(fixed_past)} |"
        )
    return lines


def _worst_past(rows: Sequence[Row]) -> float:
    """The most requests past what the p99 allows over the seeds (``misses_past_p99``)."""
    vals = [v for r in rows if not math.isnan(v := r.get("misses_past_p99", math.nan))]
    return max(vals, default=math.nan)


def _count(x: float) -> str:
    """Requests past the p99's allowance, signed and whole (``+3``: three too many)."""
    if math.isnan(x):
        return "–"
    n = round(x)
    return f"{n:+d}" if n else "0"


def summary_table(rows: Sequence[Row], baseline: str = BEST_FIXED) -> list[str]:
    """Markdown: :func:`simulator.compare.against_best_fixed` against ``baseline``, one row
    per policy."""
    b = baseline
    lines = [
        f"| policy | pairs where {b} meets p99 | meets p99 | ≤ {b} energy | both | "
        f"vs {b} (mean, worst) | vs max | vs bound | closed (mean, least) |",
        "|" + " --- |" * 9,
    ]
    for s in against_best_fixed(rows, baseline):
        lines.append(
            f"| {s['policy']} | {s['cells']} | {s['meets']} | {s['cheaper']} | {s['both']} | "
            f"{_f(s['mean_vs_best_fixed'], 3)}, {_f(s['worst_vs_best_fixed'], 3)} | "
            f"{_f(s['mean_vs_max'])} | {_f(s['mean_vs_oracle'])} | "
            f"{_f(s['mean_closed'])}, {_f(s['least_closed'])} |"
        )
    return lines


def compare_markdown(rows: Sequence[Row], describe: str) -> str:
    """The page's body: what ran, the summary over cells, then each policy per cell (the
    default policy first)."""
    policies = [p for p in dict.fromkeys(r["policy"] for r in rows) if p not in BASELINES]
    md = [
        describe,
        "",
        "Energy per inference; *bound* is the lower bound (`simulator/oracle.py`); *closed* the "
        "share of the distance from best-fixed to the bound a policy covers (1: at the bound, "
        "0: no better than best-fixed); ratios are means over seeds, worst and least over "
        "seeds; bold: a p99 over the SLO; *past the p99*: the requests over the SLO less the "
        "1% of completions a p99 within it leaves over it, for the worst seed (positive: that "
        "many requests too many, negative: the room left), the policy's and best-fixed's: by "
        "how many requests a cell's p99 was decided.",
        "",
    ]
    if any(r["policy"] == BEST_FIXED for r in rows):
        md += ["## Summary over cells", "", *summary_table(rows), ""]
    if any(r["policy"] == BEST_FIXED_CELL for r in rows):
        md += [
            "## Against one clock per cell",
            "",
            "`best-fixed-cell`: one clock for all of a cell's seeds, the lowest that meets the "
            "p99 on every seed (then up while their mean energy falls), as an operator who "
            "sets one clock per deployment would, knowing its traffic but not which draw of "
            "it comes; each seed's own `best-fixed` above is the stronger baseline.",
            "",
            *summary_table(rows, BEST_FIXED_CELL),
            "",
        ]
    for policy in sorted(policies, key=lambda p: p != DEFAULT_POLICY):
        md += [f"## {policy}, per cell", "", *cell_table(rows, policy), ""]
    return "\n".join(md)


TUNE_HEAD = ("value", "pairs", "meets p99", "≤ best-fixed", "both", "vs best-fixed", "worst")


def verdict_cells(s: Row) -> tuple[str, ...]:
    """An :func:`simulator.compare.against_best_fixed` row's verdict: pairs, meets the p99,
    spends no more, both, energy against the baseline (mean, worst)."""
    return (
        str(s["cells"]),
        str(s["meets"]),
        str(s["cheaper"]),
        str(s["both"]),
        f"{s['mean_vs_best_fixed']:.3f}",
        f"{s['worst_vs_best_fixed']:.3f}",
    )


def tune_cells(r: Row) -> tuple[str, ...]:
    """One value's figures, as :data:`TUNE_HEAD` heads them."""
    return (f"{r['value']:g}", *verdict_cells(r))


def tune_markdown(rows: Sequence[Row], describe: str, swept: str) -> str:
    """``tune``'s page (:func:`simulator.compare.tune`'s rows): per value over the whole
    matrix, then, with more than one cell, per cell (seeds together)."""
    whole = [tune_cells(r) for r in rows if r["cell"] is None]
    cells = []
    for r in sorted(
        (r for r in rows if r["cell"] is not None), key=lambda r: (r["cell"], r["value"])
    ):
        gpu, mix, _, load, slo, *_ = r["cell"]
        cells.append((gpu, mix, f"{load:g}", f"{slo:g}", *tune_cells(r)))
    parts = [
        describe,
        swept,
        "Over the (cell, seed) pairs where `best-fixed` meets the p99 SLO: in how many the "
        "policy meets it too, spends no more energy, and both; its energy over "
        "`best-fixed`'s (mean, worst).",
        markdown_table(TUNE_HEAD, whole),
    ]
    if len(cells) > len(whole):
        parts += [
            "Per cell, seeds together:",
            markdown_table(("GPU", "mix", "load", "SLO ×", *TUNE_HEAD), cells),
        ]
    return "\n\n".join(parts)
