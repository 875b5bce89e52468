"""Run a matrix of simulations (GPUs × loads × SLOs × policies) and report it side by side:
each policy against ``max``, against the best single clock in hindsight and against the lower
bound, on the same arrivals."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from dvfs.profiles import CNN, TRANSFORMER, get_profile
from scheduler.clients import ClientSpec
from scheduler.feedback import FeedbackParams
from scheduler.placement import DEFAULT_PLACEMENT, PlacementParams
from scheduler.policies import SlackParams
from scheduler.registry import DEFAULT_POLICY
from simulator.bestfixed import BEST_FIXED, BEST_FIXED_CELL, best_fixed, best_fixed_cell
from simulator.node import run
from simulator.pool import parallel_map
from simulator.simulate import ModelMix, SimConfig, parse_models, top_clock_capacity_rps
from simulator.workload import DayCycle

Row = dict[str, Any]

COLUMNS = (
    "gpu",
    "mix",
    "arrival",
    "load",
    "slo_mult",
    "seed",
    "policy",
    "requests",
    "completed",
    "rejected",
    "throughput_rps",
    "energy_per_inference_j",
    "vs_max",
    "vs_best_fixed",
    "vs_best_fixed_cell",
    "vs_oracle",
    "vs_clairvoyant",
    "closed",
    "oracle_energy_per_inference_j",
    "clairvoyant_energy_per_inference_j",
    "p50_ms",
    "p99_ms",
    "p99_over_slo",
    "misses_past_p99",
    "slo_attainment",
    "mean_batch",
    "mean_clock_mhz",
    "clock_changes",
    "fixed_mhz",
    "isolation_deviation",
    "gpus",
    "placement",
    "gpus_used",
)
DEFAULT_MIX = f"{CNN}:0.7,{TRANSFORMER}:0.3"


@dataclass(frozen=True)
class Matrix:
    """GPUs × model mixes × loads × SLOs × seeds × policies, each cell on the same arrivals.

    ``best-fixed`` is a policy here: the best single clock in hindsight
    (:mod:`simulator.bestfixed`). ``slo_basis`` says what a model's SLO multiplies: ``full``,
    its full batch's time at the top clock (what a request may take at full load with no
    queue); ``batch1``, one request's time at the top clock (tight SLOs, where a GPU's spread
    matters). ``load_basis`` says what a load is a fraction of: ``capacity``, what the top
    clock holds for that mix and SLO (:func:`simulator.simulate.top_clock_capacity_rps`), so
    every load up to 1 is feasible at the top clock; ``batch1``, the rate the top clock serves
    one request at a time (:func:`batch1_capacity_rps`). With ``arrival="day"`` the load sets
    the highest rate of the day (:class:`simulator.workload.DayCycle`).
    """

    name: str = "default"
    gpus: tuple[str, ...] = ("v100", "rtx3090", "titanrtx")
    mixes: tuple[str, ...] = (DEFAULT_MIX,)
    loads: tuple[float, ...] = (0.3, 0.6, 0.9)
    slo_multipliers: tuple[float, ...] = (2.0, 3.0, 5.0)
    policies: tuple[str, ...] = ("max", "default", "seed", "slack", "adaptive", BEST_FIXED)
    duration_s: float = 30.0
    seeds: tuple[int, ...] = (0,)
    slack: SlackParams = field(default_factory=SlackParams)
    feedback: FeedbackParams = field(default_factory=FeedbackParams)
    slo_basis: str = "full"
    load_basis: str = "capacity"
    arrival: str = "poisson"
    day: DayCycle = field(default_factory=DayCycle)
    clients: tuple[ClientSpec, ...] = (ClientSpec("default"),)
    node_gpus: int = 1  # GPUs per node; load is then a fraction of the node's capacity
    placements: tuple[str, ...] = (DEFAULT_PLACEMENT,)
    pack_slo_share: float = PlacementParams.pack_slo_share
    clock_change_ms: float | None = None  # every GPU's clock-change delay (None: its profile's)

    def __post_init__(self) -> None:
        if self.slo_basis not in ("full", "batch1") or self.load_basis not in (
            "capacity",
            "batch1",
        ):
            raise ValueError("slo_basis is full or batch1; load_basis is capacity or batch1")

    @property
    def _bounded(self) -> tuple[str, ...]:
        """The runs that compute the cell's lower bound (the same for every run of a cell:
        same arrivals and deadlines): best-fixed's and the default policy's, else the first."""
        chosen = tuple(p for p in self.policies if p in (BEST_FIXED, DEFAULT_POLICY))
        return chosen or self.policies[:1]

    def configs(self) -> list[SimConfig]:
        out = []
        placements = self.placements if self.node_gpus > 1 else (DEFAULT_PLACEMENT,)
        for gpu in self.gpus:
            for mix in self.mixes:
                for mult in self.slo_multipliers:
                    models = slo_models(gpu, mix, mult, self.slo_basis)
                    for load in self.loads:
                        rate = (
                            load * self.node_gpus * batch1_capacity_rps(gpu, models)
                            if self.load_basis == "batch1"
                            else None
                        )
                        for seed in self.seeds:
                            for placement in placements:
                                for policy in self.policies:
                                    out.append(
                                        SimConfig(
                                            gpus=self.node_gpus,
                                            placement=PlacementParams(
                                                placement, self.pack_slo_share
                                            ),
                                            gpu=gpu,
                                            policy=policy,
                                            with_oracle=policy in self._bounded,
                                            load=load,
                                            rate_rps=rate,
                                            models=models,
                                            slo_multiplier=mult,
                                            duration_s=self.duration_s,
                                            seed=seed,
                                            slack=self.slack,
                                            feedback=self.feedback,
                                            clients=self.clients,
                                            arrival=self.arrival,
                                            day=self.day,
                                            clock_change_ms=self.clock_change_ms,
                                        )
                                    )
        return out


#: The matrices ``compare --matrix`` knows. ``steady``: one model, tight SLOs (2-6× one
#: request's time at the top clock), Poisson at a fraction of the rate the top clock serves one
#: request at a time, 120 s. ``varying``: two compressed days (from 0.15 to 1 of the peak)
#: with bursts of 1.5× for 2 s every 20 s on average, peaks at 0.5 and 0.9 of what the top clock
#: holds, 120 s. ``default``: the mix at loads 0.3-0.9 of what the top clock holds, 30 s.
MATRICES: dict[str, Matrix] = {
    "default": Matrix(),
    "steady": Matrix(
        name="steady",
        mixes=(CNN,),
        loads=(0.1, 0.3, 0.5),
        slo_multipliers=(2.0, 3.0, 4.0, 6.0),
        policies=("max", "slack", "adaptive", BEST_FIXED),
        duration_s=120.0,
        slo_basis="batch1",
        load_basis="batch1",
    ),
    "varying": Matrix(
        name="varying",
        loads=(0.5, 0.9),
        slo_multipliers=(3.0, 5.0),
        policies=("max", "default", "slack", "adaptive", BEST_FIXED),
        duration_s=120.0,
        arrival="day",
    ),
}


def slo_models(gpu: str, mix: str, multiplier: float, basis: str = "full") -> tuple[ModelMix, ...]:
    """The mix's models, each with an SLO of ``multiplier`` × its full batch (``basis`` full)
    or one request (``batch1``) at the top clock."""
    profile = get_profile(gpu)
    out = []
    for m in parse_models(mix):
        law = profile.model(m.name)
        batch = law.max_batch if basis == "full" else 1
        unit_ms = law.mean_latency_ms(profile.max_clock_mhz, batch)
        out.append(ModelMix(m.name, m.share, round(multiplier * unit_ms, 3)))
    return tuple(out)


def batch1_capacity_rps(gpu: str, models: Sequence[ModelMix]) -> float:
    """Requests per second the top clock serves one request at a time, for this mix."""
    profile = get_profile(gpu)
    per_model = [
        1000.0 / profile.model(m.name).mean_latency_ms(profile.max_clock_mhz) for m in models
    ]
    return 1.0 / sum(m.share / cap for m, cap in zip(models, per_model, strict=True))


def resolve_capacities(configs: Sequence[SimConfig], *, jobs: int | None = None) -> list[SimConfig]:
    """Each config with the capacity its load counts against measured once (in parallel) and
    filled in, so that worker processes do not each measure it again."""
    todo = [c for c in configs if c.rate_rps is None and c.capacity_rps is None]
    keys = list(dict.fromkeys(replace(c, policy="max", seed=0) for c in todo))
    capacities = parallel_map(top_clock_capacity_rps, keys, jobs, None)
    found = dict(zip(keys, capacities, strict=True))
    return [
        c
        if c.rate_rps is not None or c.capacity_rps is not None
        else replace(c, capacity_rps=found[replace(c, policy="max", seed=0)])
        for c in configs
    ]


def _with_node(cfg: SimConfig, row: Row) -> Row:
    """``row`` with the node's fields and the matrix's load, whatever it is a fraction of (a
    rate given is the load's rate)."""
    node = {"gpus": cfg.gpus, "placement": cfg.placement.mode, "gpus_used": 1}
    return {**node, **row, "load": cfg.load}


def _run(cfg: SimConfig) -> Row:
    row = best_fixed(cfg) if cfg.policy == BEST_FIXED else {**run(cfg).to_json(), "fixed_mhz": None}
    return _with_node(cfg, row)


CellSearch = tuple[list[SimConfig], int]  # a cell's configs, one per seed; where to start


def _run_cell(search: CellSearch) -> list[Row]:
    cfgs, lowest_mhz = search
    rows = best_fixed_cell(cfgs, lowest_mhz)
    return [_with_node(cfg, row) for cfg, row in zip(cfgs, rows, strict=True)]


def seeds_together(row: Row) -> tuple[Any, ...]:
    """:func:`cell` without the seed: the runs of one cell over its seeds."""
    key = cell(row)
    return key[:5] + key[6:]


def cell_searches(configs: Sequence[SimConfig], results: Sequence[Row]) -> list[CellSearch]:
    """What :func:`one_clock_per_cell` runs: every cell of ``configs`` (run as ``results``, in
    the same order) with more than one seed whose ``best-fixed`` meets the p99 SLO on every
    seed, from the highest of the seeds' lowest clocks that meet it."""
    seeds: dict[tuple[Any, ...], list[tuple[SimConfig, Row]]] = {}
    for cfg, row in zip(configs, results, strict=True):
        if cfg.policy == BEST_FIXED:
            seeds.setdefault(seeds_together(row), []).append((cfg, row))
    return [
        ([c for c, _ in group], max(int(r["lowest_mhz"]) for _, r in group))
        for group in seeds.values()
        if len(group) > 1 and all(r.get("lowest_mhz") is not None for _, r in group)
    ]


def one_clock_per_cell(
    searches: Sequence[CellSearch],
    *,
    jobs: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Row]:
    """``best-fixed-cell`` rows (:func:`simulator.bestfixed.best_fixed_cell`) for each of
    :func:`cell_searches`' cells (in parallel over ``jobs`` processes); ``progress`` is
    advanced once per cell."""
    return [row for rows in parallel_map(_run_cell, searches, jobs, progress) for row in rows]


def run_all(
    configs: Sequence[SimConfig],
    *,
    jobs: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Row]:
    """Run every config (in parallel over ``jobs`` processes), results in the same order."""
    return parallel_map(_run, configs, jobs, progress)


def cell(row: Row) -> tuple[Any, ...]:
    """What identifies a row's cell: the same arrivals and deadlines, whatever the policy
    (on a node, under the same placement)."""
    return (
        row["gpu"],
        row["mix"],
        row["arrival"],
        row["load"],
        row["slo_mult"],
        row["seed"],
        row.get("gpus", 1),
        row.get("placement", DEFAULT_PLACEMENT),
    )


def tabulate(results: Sequence[Row]) -> list[Row]:
    """Rows with ratios to ``max`` and ``best-fixed`` (same cell: GPU, mix, arrivals, load,
    SLO, seed), to the oracle (the lower bound) and to the clairvoyant oracle (that run's own
    service times); ``closed``: the share of the distance from ``best-fixed`` to the lower
    bound that the policy covers (1: at the bound, 0: no better than the best single clock)."""

    def by_policy(name: str) -> dict[tuple[Any, ...], float]:
        return {cell(r): r["energy_per_inference_j"] for r in results if r["policy"] == name}

    def per_inference(r: Row, key: str) -> float:
        return r[key] / r["completed"] if r.get(key) else math.nan

    max_e, fixed_e = by_policy("max"), by_policy(BEST_FIXED)
    cell_e = by_policy(BEST_FIXED_CELL)
    bound_j = {cell(r): r["oracle_energy_j"] for r in results if r.get("oracle_energy_j")}
    rows = []
    for r in results:
        e = r["energy_per_inference_j"]
        # The bound is the cell's (computed once per cell); per inference, of this run's.
        oracle = bound_j.get(cell(r), math.nan) / r["completed"] if r["completed"] else math.nan
        clairvoyant = per_inference(r, "clairvoyant_energy_j")
        fixed = fixed_e.get(cell(r), math.nan)
        derived = {
            "vs_max": e / max_e.get(cell(r), math.nan),
            "vs_best_fixed": e / fixed,
            "vs_best_fixed_cell": e / cell_e.get(cell(r), math.nan),
            "vs_oracle": e / oracle,
            "vs_clairvoyant": e / clairvoyant,
            "closed": (fixed - e) / (fixed - oracle) if fixed > oracle else math.nan,
            "oracle_energy_per_inference_j": oracle,
            "clairvoyant_energy_per_inference_j": clairvoyant,
        }
        kept = {k: r[k] for k in (*COLUMNS, "clients") if k in r and k not in derived}
        rows.append({**kept, **derived})
    return rows


#: The baselines a summary is taken against, and the ratio of each row's energy to it.
BASELINES = {BEST_FIXED: "vs_best_fixed", BEST_FIXED_CELL: "vs_best_fixed_cell"}


def against_best_fixed(rows: Sequence[Row], baseline: str = BEST_FIXED) -> list[Row]:
    """Per policy, over the (cell, seed) pairs where ``baseline`` (``best-fixed``, or
    ``best-fixed-cell``: one clock for all seeds) meets the p99 SLO: in how many it meets it
    too, spends no more energy than the baseline, and both; its energy against the baseline
    (mean and worst, in the ``*_vs_best_fixed`` fields whichever the baseline), ``max`` and the
    lower bound (means), and the least share of the distance from ``best-fixed`` to the bound
    it closed. Against ``best-fixed``, ``best-fixed-cell`` is a row too: how near one clock
    chosen knowing every seed's arrivals comes to each seed's own."""
    ratio = BASELINES[baseline]
    fixed_ok = {cell(r) for r in rows if r["policy"] == baseline and r["p99_over_slo"] <= 1}
    out = []
    for policy in dict.fromkeys(r["policy"] for r in rows):
        if policy in (baseline, BEST_FIXED):
            continue
        mine = [r for r in rows if r["policy"] == policy and cell(r) in fixed_ok]
        if not mine:
            continue
        meets = [r["p99_over_slo"] <= 1 for r in mine]
        cheaper = [r[ratio] <= 1 for r in mine]

        def stat(
            key: str, how: Callable[[Sequence[float]], Any] = np.mean, mine: list[Row] = mine
        ) -> float:
            values = [r[key] for r in mine if not math.isnan(r[key])]
            return float(how(values)) if values else math.nan

        out.append(
            {
                "policy": policy,
                "baseline": baseline,
                "cells": len(mine),
                "meets": sum(meets),
                "cheaper": sum(cheaper),
                "both": sum(m and c for m, c in zip(meets, cheaper, strict=True)),
                "mean_vs_best_fixed": stat(ratio),
                "worst_vs_best_fixed": stat(ratio, np.max),
                "mean_vs_max": stat("vs_max"),
                "mean_vs_oracle": stat("vs_oracle"),
                "mean_closed": stat("closed"),
                "least_closed": stat("closed", np.min),
            }
        )
    return out


def against_spread(rows: Sequence[Row]) -> list[Row]:
    """Node rows (several GPUs) with ``vs_spread``: energy per inference over the ``spread``
    placement's on the same cell and policy."""
    spread = {
        (*cell(r)[:-1], r["policy"]): r["energy_per_inference_j"]
        for r in rows
        if r.get("placement") == DEFAULT_PLACEMENT
    }
    out = []
    for r in rows:
        if r.get("gpus", 1) < 2:
            continue
        base = spread.get((*cell(r)[:-1], r["policy"]), math.nan)
        out.append({**r, "vs_spread": r["energy_per_inference_j"] / base})
    return out


def against_one_gpu(rows: Sequence[Row]) -> tuple[list[Row], list[Row]]:
    """Node rows with ``vs_one_gpu``: their throughput over the most one GPU of the same
    profile carried, under the same policy, mix, SLO and seed, at any load it was run at (the
    largest one-GPU throughput is the strongest baseline: a load past its capacity shows what it
    carries at best). Returns (node rows, the one-GPU rows with the most each carried)."""
    best: dict[tuple[Any, ...], Row] = {}
    for r in rows:
        if r.get("gpus", 1) != 1:
            continue
        key = (r["gpu"], r["mix"], r["slo_mult"], r["seed"], r["policy"])
        if key not in best or r["throughput_rps"] > best[key]["throughput_rps"]:
            best[key] = r
    out = []
    for r in rows:
        if r.get("gpus", 1) < 2:
            continue
        one = best.get((r["gpu"], r["mix"], r["slo_mult"], r["seed"], r["policy"]))
        ratio = r["throughput_rps"] / one["throughput_rps"] if one else math.nan
        out.append({**r, "vs_one_gpu": ratio})
    return out, list(best.values())


def write_csv(rows: Sequence[Row], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row[k] for k in COLUMNS})


def plot(rows: Sequence[Row], path: Path) -> Path:
    """Energy per inference relative to ``max`` per cell and policy (mean over seeds), hatched
    where p99 > SLO in any seed; the oracle as a black dash."""
    from time2clock.plot import pyplot

    plt = pyplot()  # a clear error where the plots' extra is not installed
    from matplotlib.patches import Patch

    def order(key: str, subset: Sequence[Row]) -> list[Any]:
        return list(dict.fromkeys(r[key] for r in subset))

    gpus, policies = order("gpu", rows), order("policy", rows)
    fig, axes = plt.subplots(len(gpus), 1, figsize=(11, 3.2 * len(gpus)), squeeze=False)
    width = 0.8 / len(policies)
    for ax, gpu in zip(axes[:, 0], gpus, strict=True):
        mine = [r for r in rows if r["gpu"] == gpu]
        cells = list(dict.fromkeys((r["load"], r["slo_mult"]) for r in mine))

        def of(c: tuple[Any, ...], policy: str | None = None, mine: list[Row] = mine) -> list[Row]:
            return [
                r for r in mine if (r["load"], r["slo_mult"]) == c and policy in (None, r["policy"])
            ]

        for i, policy in enumerate(policies):
            for x, c in enumerate(cells):
                runs = of(c, policy)
                if not runs:  # best-fixed-cell, where no clock meets the p99 on every seed
                    continue
                ax.bar(
                    x + i * width,
                    float(np.mean([r["vs_max"] for r in runs])),
                    width,
                    color=f"C{i}",
                    hatch="//" if any(r["p99_over_slo"] > 1 for r in runs) else None,
                    edgecolor="black",
                    linewidth=0.3,
                )
        (oracle,) = ax.plot(
            [x + 0.4 - width / 2 for x in range(len(cells))],
            [
                float(
                    np.mean(
                        [
                            r["oracle_energy_per_inference_j"]
                            / (r["energy_per_inference_j"] / r["vs_max"])
                            for r in of(c, policies[0])
                        ]
                    )
                )
                for c in cells
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
        # A swatch per policy, plain whatever its first cell's hatch.
        swatches = [Patch(facecolor=f"C{i}", label=p) for i, p in enumerate(policies)]
        ax.legend(
            handles=[oracle, *swatches], fontsize=7, ncol=len(policies) + 1, loc="upper center"
        )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


#: The policies ``tune`` sweeps, and the :class:`Matrix` field that holds their parameters.
TUNABLE: dict[str, tuple[type, str]] = {
    "slack": (SlackParams, "slack"),
    "adaptive": (FeedbackParams, "feedback"),
}


def _typed(params: type, param: str, value: float) -> float | int:
    """``value`` as ``params``' numeric field ``param`` takes it; ValueError names an unknown
    field, one that is not a number, or a fraction given to a whole-number field."""
    kinds = {f.name: f.type for f in fields(params)}
    if param not in kinds:
        raise ValueError(f"unknown parameter {param!r}; known: {', '.join(kinds)}")
    kind = str(getattr(kinds[param], "__name__", kinds[param]))
    if kind == "int":
        if value != int(value):
            raise ValueError(f"{param} takes whole numbers, got {value:g}")
        return int(value)
    if kind in ("float", "float | None"):
        return float(value)
    raise ValueError(f"{param} is a {kind}, not a number: set it in a --config file")


def tune(
    base: Matrix,
    param: str,
    values: Sequence[float],
    seeds: Sequence[int],
    *,
    policy: str = "slack",
    jobs: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Row]:
    """For each value of one numeric parameter of ``policy`` (``slack``'s :class:`SlackParams`
    or ``adaptive``'s :class:`FeedbackParams`, the rest as ``base`` has them), over the
    (cell, seed) pairs where ``best-fixed`` meets the p99 SLO: :func:`against_best_fixed`'s
    summary (in how many the policy meets the p99 too, spends no more, and both; its energy
    against ``best-fixed`` and ``max``), for the whole matrix (``cell`` None) and for each cell,
    seeds together. ``max`` and ``best-fixed`` run once, on the same arrivals as every value.
    Every value is checked before anything runs."""
    if policy not in TUNABLE:
        raise ValueError(f"tune sweeps {' or '.join(TUNABLE)}, not {policy!r}")
    kind, attr = TUNABLE[policy]
    swept = [replace(getattr(base, attr), **{param: _typed(kind, param, v)}) for v in values]
    matrix = replace(base, seeds=tuple(seeds), policies=("max", BEST_FIXED))
    cells = resolve_capacities([replace(c, with_oracle=False) for c in matrix.configs()], jobs=jobs)
    baseline = run_all(cells, jobs=jobs, progress=progress)
    out = []
    for value, params in zip(values, swept, strict=True):
        mine = [replace(c, policy=policy, **{attr: params}) for c in cells if c.policy == "max"]
        rows = tabulate(baseline + run_all(mine, jobs=jobs, progress=progress))
        groups: dict[tuple[Any, ...] | None, list[Row]] = {None: rows}
        for r in rows:
            groups.setdefault(seeds_together(r), []).append(r)
        for key, group in groups.items():
            for s in against_best_fixed(group):
                if s["policy"] == policy:
                    out.append({"param": param, "value": value, "cell": key, **s})
    return out
