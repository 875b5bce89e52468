"""The best single clock in hindsight: what an operator who locks the GPU with
``nvidia-smi -lgc`` could reach at best on the same arrivals.

Among the GPU's clocks, the one with the least energy per inference whose p99 meets every
model's SLO, found by running the same arrivals under ``fixed:MHZ`` (batching as with any fixed
clock: Triton's dynamic batcher, nothing held back). The search assumes the p99 falls as the
clock rises (one run per step of a bisection over the ladder for the lowest clock that meets
it), then walks up from there while energy per inference keeps falling (below the GPU's
energy-optimal clock a faster clock costs less). Where even the top clock misses, the top
clock's run is the answer, marked as missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dvfs.profiles import get_profile
from simulator.node import run as simulate
from simulator.simulate import SimConfig

BEST_FIXED = "best-fixed"
STRIDE = 4  # ladder steps per step of the walk up (v100: 30 MHz)

Row = dict[str, Any]


def run_fixed(cfg: SimConfig, clock_mhz: int) -> Row:
    """``cfg`` under ``fixed:clock_mhz``, without the oracle (it is the cell's, not the run's)."""
    return simulate(replace(cfg, policy=f"fixed:{clock_mhz}", with_oracle=False)).to_json()


def _meets(row: Row) -> bool:
    return bool(row["p99_over_slo"] <= 1.0)


def cheapest_meeting(
    n: int, *, meets: Callable[[int], bool], cost: Callable[[int], float], stride: int = 1
) -> int:
    """The index, among ``n`` clocks in ascending order, of the best fixed clock: the lowest
    that meets the SLO (a bisection, assuming the tail falls as the clock rises), then up by
    ``stride`` while the next meets it too and costs less. Where even the top misses, the
    top. ``meets`` and ``cost`` run (and may cache) the clock's run."""
    top = n - 1
    if not meets(top):
        return top
    lo, hi = 0, top  # hi meets the SLO; the lowest that does is in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid + 1
    chosen = hi
    step = hi + stride
    while step <= top and meets(step) and cost(step) < cost(chosen):
        chosen = step
        step += stride
    return chosen


def best_fixed(cfg: SimConfig) -> Row:
    """The best-fixed row for ``cfg``'s cell: the chosen clock's run, named ``best-fixed``,
    with ``fixed_mhz`` and ``fixed_runs`` (how many runs the search took)."""
    clocks = sorted(get_profile(cfg.gpu).clocks_mhz)
    runs: dict[int, Row] = {}

    def run(i: int) -> Row:
        if i not in runs:
            runs[i] = run_fixed(cfg, clocks[i])
        return runs[i]

    chosen = cheapest_meeting(
        len(clocks),
        meets=lambda i: _meets(run(i)),
        cost=lambda i: float(run(i)["energy_per_inference_j"]),
        stride=STRIDE,
    )
    # The chosen clock's run, with the cell's oracle (policy-independent: same arrivals).
    best = simulate(replace(cfg, policy=f"fixed:{clocks[chosen]}")).to_json()
    return {**best, "policy": BEST_FIXED, "fixed_mhz": clocks[chosen], "fixed_runs": len(runs)}
