"""Run a matrix of simulations (GPUs × loads × SLOs × policies) and report it side by side."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dvfs.profiles import CNN, TRANSFORMER, get_profile
from scheduler.policies import SlackParams
from scheduler.simulate import ModelMix, SimConfig, parse_models, simulate

Row = dict[str, Any]

COLUMNS = (
    "gpu",
    "mix",
    "load",
    "slo_mult",
    "policy",
    "requests",
    "completed",
    "rejected",
    "throughput_rps",
    "energy_per_inference_j",
    "vs_max",
    "vs_oracle",
    "oracle_energy_per_inference_j",
    "p50_ms",
    "p99_ms",
    "p99_over_slo",
    "slo_attainment",
    "mean_batch",
    "mean_clock_mhz",
    "clock_changes",
)
DEFAULT_MIX = f"{CNN}:0.7,{TRANSFORMER}:0.3"


@dataclass(frozen=True)
class Matrix:
    """GPUs × model mixes × loads × SLOs × policies, each cell on the same arrivals.

    A model's SLO is a multiple of its full batch's time at the top clock (what a request may
    take at full load with no queue); ``load`` is a fraction of the mix's capacity at the top
    clock in full batches.
    """

    gpus: tuple[str, ...] = ("v100", "rtx3090", "titanrtx")
    mixes: tuple[str, ...] = (DEFAULT_MIX,)
    loads: tuple[float, ...] = (0.3, 0.6, 0.9)
    slo_multipliers: tuple[float, ...] = (2.0, 3.0, 5.0)
    policies: tuple[str, ...] = ("max", "default", "seed", "slack")
    duration_s: float = 30.0
    seed: int = 0
    slack: SlackParams = field(default_factory=SlackParams)

    def configs(self) -> list[SimConfig]:
        return [
            SimConfig(
                gpu=gpu,
                policy=policy,
                load=load,
                models=slo_models(gpu, mix, mult),
                slo_multiplier=mult,
                duration_s=self.duration_s,
                seed=self.seed,
                slack=self.slack,
            )
            for gpu in self.gpus
            for mix in self.mixes
            for load in self.loads
            for mult in self.slo_multipliers
            for policy in self.policies
        ]


def slo_models(gpu: str, mix: str, multiplier: float) -> tuple[ModelMix, ...]:
    """The mix's models, each with an SLO of ``multiplier`` × its full batch at the top clock."""
    profile = get_profile(gpu)
    out = []
    for m in parse_models(mix):
        law = profile.model(m.name)
        full_ms = law.mean_latency_ms(profile.max_clock_mhz, law.max_batch)
        out.append(ModelMix(m.name, m.share, round(multiplier * full_ms, 3)))
    return tuple(out)


def _run(cfg: SimConfig) -> Row:
    return simulate(cfg).to_json()


def run_all(
    configs: Sequence[SimConfig],
    *,
    jobs: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Row]:
    """Run every config (in parallel over ``jobs`` processes), results in the same order."""
    workers = jobs or os.cpu_count() or 1
    if workers == 1:
        out = []
        for cfg in configs:
            out.append(_run(cfg))
            if progress:
                progress(1)
        return out
    with ProcessPoolExecutor(workers) as pool:
        futures = [pool.submit(_run, cfg) for cfg in configs]
        results = []
        for fut in futures:
            results.append(fut.result())
            if progress:
                progress(1)
        return results


def cell(row: Row) -> tuple[Any, ...]:
    """What identifies a row's cell: the same arrivals and deadlines, whatever the policy."""
    return row["gpu"], row["mix"], row["load"], row["slo_mult"]


def tabulate(results: Sequence[Row]) -> list[Row]:
    """Rows with ratios to ``max`` (same GPU, mix, load, SLO) and to the oracle."""
    max_e = {cell(r): r["energy_per_inference_j"] for r in results if r["policy"] == "max"}
    rows = []
    for r in results:
        e = r["energy_per_inference_j"]
        oracle = r["oracle_energy_j"] / r["completed"] if r["oracle_energy_j"] else math.nan
        base = max_e.get(cell(r), math.nan)
        derived = {
            "vs_max": e / base,
            "vs_oracle": e / oracle,
            "oracle_energy_per_inference_j": oracle,
        }
        rows.append({**{k: r[k] for k in COLUMNS if k not in derived}, **derived})
    return rows


def write_csv(rows: Sequence[Row], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row[k] for k in COLUMNS})


def plot(rows: Sequence[Row], path: Path) -> Path:
    """Energy per inference relative to ``max`` per cell and policy; hatched where p99 > SLO."""
    from time2clock.plot import pyplot

    plt = pyplot()

    gpus = sorted({r["gpu"] for r in rows}, key=[r["gpu"] for r in rows].index)
    policies = sorted({r["policy"] for r in rows}, key=[r["policy"] for r in rows].index)
    fig, axes = plt.subplots(len(gpus), 1, figsize=(11, 3.2 * len(gpus)), squeeze=False)
    width = 0.8 / len(policies)
    for ax, gpu in zip(axes[:, 0], gpus, strict=True):
        cells = [
            (r["load"], r["slo_mult"])
            for r in rows
            if r["gpu"] == gpu and r["policy"] == policies[0]
        ]
        for i, policy in enumerate(policies):
            by_cell = {
                (r["load"], r["slo_mult"]): r
                for r in rows
                if r["gpu"] == gpu and r["policy"] == policy
            }
            for x, cell in enumerate(cells):
                r = by_cell[cell]
                ax.bar(
                    x + i * width,
                    r["vs_max"],
                    width,
                    color=f"C{i}",
                    hatch="//" if r["p99_over_slo"] > 1 else None,
                    edgecolor="black",
                    linewidth=0.3,
                    label=policy if x == 0 else None,
                )
        oracle = [
            next(r for r in rows if r["gpu"] == gpu and (r["load"], r["slo_mult"]) == c)
            for c in cells
        ]
        ax.plot(
            [x + 0.4 - width / 2 for x in range(len(cells))],
            [
                r["oracle_energy_per_inference_j"] / (r["energy_per_inference_j"] / r["vs_max"])
                for r in oracle
            ],
            "k_",
            markersize=18,
            label="oracle",
        )
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(cells))])
        ax.set_xticklabels([f"load {lo:g}\nSLO {s:g}×" for lo, s in cells], fontsize=7)
        ax.set_ylabel("energy / inference\n(× max)")
        ax.set_title(f"{gpu}: hatched = p99 over the SLO")
        ax.axhline(1.0, color="grey", linewidth=0.5)
        ax.set_ylim(0, 1.25)
        ax.legend(fontsize=7, ncol=len(policies) + 1, loc="upper center")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def tune(
    base: Matrix,
    param: str,
    values: Sequence[float],
    seeds: Sequence[int],
    *,
    jobs: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Row]:
    """For each value of one :class:`SlackParams` field: in how many (cell, seed) pairs where
    ``max`` meets the p99 SLO ``slack`` misses it, and its mean energy relative to ``max``."""
    if param not in SlackParams.__dataclass_fields__:
        raise ValueError(
            f"unknown slack parameter {param!r}; "
            f"known: {', '.join(SlackParams.__dataclass_fields__)}"
        )
    field_type = type(getattr(SlackParams(), param))
    cells = [
        replace(c, with_oracle=False)
        for s in seeds
        for c in replace(base, seed=s, policies=("max",)).configs()
    ]
    max_rows = run_all(cells, jobs=jobs, progress=progress)
    out = []
    for value in values:
        params = replace(base.slack, **{param: field_type(value)})
        slack_cells = [replace(c, policy="slack", slack=params) for c in cells]
        slack_rows = run_all(slack_cells, jobs=jobs, progress=progress)
        eligible = [
            (m, s) for m, s in zip(max_rows, slack_rows, strict=True) if m["p99_over_slo"] <= 1
        ]
        out.append(
            {
                "param": param,
                "value": value,
                "eligible": len(eligible),
                "misses": sum(s["p99_over_slo"] > 1 for _, s in eligible),
                "energy_vs_max": sum(
                    s["energy_per_inference_j"] / m["energy_per_inference_j"] for m, s in eligible
                )
                / max(1, len(eligible)),
            }
        )
    return out
