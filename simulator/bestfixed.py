"""The best single clock in hindsight: what an operator who locks the GPU with
``nvidia-smi -lgc`` could reach at best on the same arrivals.

Among the GPU's clocks, the one with the least energy per inference whose p99 meets every
model's SLO, found by running the same arrivals under ``fixed:MHZ`` (batching as with any fixed
clock: Triton's dynamic batcher, nothing held back). The search assumes the p99 falls as the
clock rises (one run per step of a bisection over the ladder for the lowest clock that meets
it), then walks up from there while energy per inference keeps falling (below the GPU's
energy-optimal clock a faster clock costs less). Where even the top clock misses, the top
clock's run is the answer, marked as missing.

``best-fixed-cell`` is the same search with one clock for all of a cell's seeds: the clock an
operator would set once for a deployment, knowing its traffic but not the next hour's draw of
it. It is a weaker baseline than each seed's own best clock, reported beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from dvfs.profiles import get_profile
from simulator.node import run as simulate
from simulator.simulate import SimConfig

BEST_FIXED = "best-fixed"
BEST_FIXED_CELL = "best-fixed-cell"  # one clock for all of a cell's seeds
STRIDE = 4  # ladder steps per step of the walk up (v100: 30 MHz)

Row = dict[str, Any]


def run_fixed(cfg: SimConfig, clock_mhz: int) -> Row:
    """``cfg`` under ``fixed:clock_mhz``, without the oracle (it is the cell's, not the run's)."""
    return simulate(replace(cfg, policy=f"fixed:{clock_mhz}", with_oracle=False)).to_json()


def _meets(row: Row) -> bool:
    return bool(row["p99_over_slo"] <= 1.0)


def lowest_meeting(n: int, *, meets: Callable[[int], bool]) -> int | None:
    """The index, among ``n`` clocks in ascending order, of the lowest that meets the SLO (a
    bisection, assuming the tail falls as the clock rises); None where even the top misses.
    ``meets`` runs (and may cache) the clock's run."""
    top = n - 1
    if not meets(top):
        return None
    lo, hi = 0, top  # hi meets the SLO; the lowest that does is in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def walk_up(
    n: int,
    start: int,
    *,
    meets: Callable[[int], bool],
    cost: Callable[[int], float],
    stride: int = 1,
) -> int:
    """From ``start`` (a clock that meets the SLO), up by ``stride`` while the next meets it
    too and costs less: below the GPU's energy-optimal clock a faster clock costs less."""
    chosen = start
    step = start + stride
    while step < n and meets(step) and cost(step) < cost(chosen):
        chosen = step
        step += stride
    return chosen


def cheapest_meeting(
    n: int, *, meets: Callable[[int], bool], cost: Callable[[int], float], stride: int = 1
) -> tuple[int | None, int]:
    """Among ``n`` clocks in ascending order, the index of the lowest that meets the SLO (None
    where even the top misses) and of the best fixed clock: that lowest, then up by ``stride``
    while the next meets it too and costs less; where even the top misses, the top."""
    lowest = lowest_meeting(n, meets=meets)
    if lowest is None:
        return None, n - 1
    return lowest, walk_up(n, lowest, meets=meets, cost=cost, stride=stride)


def best_fixed(cfg: SimConfig) -> Row:
    """The best-fixed row for ``cfg``'s cell: the chosen clock's run, named ``best-fixed``,
    with ``fixed_mhz`` and ``fixed_runs`` (how many runs the search took)."""
    clocks = sorted(get_profile(cfg.gpu).clocks_mhz)
    runs: dict[int, Row] = {}

    def run(i: int) -> Row:
        if i not in runs:
            runs[i] = run_fixed(cfg, clocks[i])
        return runs[i]

    lowest, chosen = cheapest_meeting(
        len(clocks),
        meets=lambda i: _meets(run(i)),
        cost=lambda i: float(run(i)["energy_per_inference_j"]),
        stride=STRIDE,
    )
    # The chosen clock's run, with the cell's oracle (policy-independent: same arrivals).
    best = simulate(replace(cfg, policy=f"fixed:{clocks[chosen]}")).to_json()
    return {
        **best,
        "policy": BEST_FIXED,
        "fixed_mhz": clocks[chosen],
        "lowest_mhz": None if lowest is None else clocks[lowest],
        "fixed_runs": len(runs),
    }


def best_fixed_cell(cfgs: Sequence[SimConfig], lowest_mhz: int) -> list[Row]:
    """One clock for all of a cell's seeds (``cfgs``: the same cell, one config per seed),
    what an operator who sets one clock per deployment could reach at best, knowing every
    seed's arrivals: the lowest clock that meets the p99 on every seed (``lowest_mhz``, the
    highest of the seeds' lowest, as the p99 falls as the clock rises; higher if a seed
    misses there after all), then up by ``STRIDE`` while every seed still meets it and their
    mean energy per inference falls. Rows named ``best-fixed-cell``, one per seed."""
    clocks = sorted(get_profile(cfgs[0].gpu).clocks_mhz)
    runs: dict[int, list[Row]] = {}

    def run(i: int) -> list[Row]:
        if i not in runs:
            runs[i] = [run_fixed(cfg, clocks[i]) for cfg in cfgs]
        return runs[i]

    def meets(i: int) -> bool:
        return all(_meets(r) for r in run(i))

    start = clocks.index(lowest_mhz)
    while start < len(clocks) - 1 and not meets(start):
        start += 1
    chosen = walk_up(
        len(clocks),
        start,
        meets=meets,
        cost=lambda i: sum(float(r["energy_per_inference_j"]) for r in run(i)),
        stride=STRIDE,
    )
    return [
        {**r, "policy": BEST_FIXED_CELL, "fixed_mhz": clocks[chosen], "fixed_runs": len(runs)}
        for r in run(chosen)
    ]
