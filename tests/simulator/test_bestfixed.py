"""The best single clock in hindsight, on the simulator."""

from __future__ import annotations

from dataclasses import replace

from dvfs.profiles import get_profile
from simulator.bestfixed import (
    BEST_FIXED,
    BEST_FIXED_CELL,
    STRIDE,
    best_fixed,
    best_fixed_cell,
    run_fixed,
)
from simulator.compare import DEFAULT_MIX, slo_models
from simulator.simulate import SimConfig, simulate

CFG = SimConfig(
    gpu="v100", load=0.3, models=slo_models("v100", DEFAULT_MIX, 3.0), duration_s=6.0, seed=1
)


def test_best_fixed_is_the_cheapest_clock_that_meets_the_tail() -> None:
    row = best_fixed(CFG)
    clocks = sorted(get_profile("v100").clocks_mhz)
    i = clocks.index(row["fixed_mhz"])
    assert row["policy"] == BEST_FIXED and row["p99_over_slo"] <= 1.0
    assert row["oracle_energy_j"] is not None  # the cell's bound comes with it
    top = simulate(replace(CFG, policy="max")).to_json()
    assert row["energy_per_inference_j"] < top["energy_per_inference_j"]
    # The next clock of the walk up costs more or misses; the clock below it misses or costs
    # more (the bisection's lowest clock that meets the SLO is at or below the choice).
    if i + STRIDE < len(clocks):
        up = run_fixed(CFG, clocks[i + STRIDE])
        assert up["energy_per_inference_j"] >= row["energy_per_inference_j"] or (
            up["p99_over_slo"] > 1.0
        )
    below = run_fixed(CFG, clocks[i - 1])
    assert below["p99_over_slo"] > 1.0 or (
        below["energy_per_inference_j"] >= row["energy_per_inference_j"]
    )


def test_when_no_clock_meets_the_tail_the_top_clock_is_reported_as_missing() -> None:
    hopeless = replace(CFG, load=1.5)
    row = best_fixed(hopeless)
    assert row["fixed_mhz"] == max(get_profile("v100").clocks_mhz)
    assert row["p99_over_slo"] > 1.0


def test_one_clock_per_cell_meets_the_tail_on_every_seed() -> None:
    cfgs = [replace(CFG, seed=seed, duration_s=4.0) for seed in (1, 2)]
    own = [best_fixed(cfg) for cfg in cfgs]
    clocks = sorted(get_profile("v100").clocks_mhz)
    for row in own:  # each seed's lowest clock that meets the tail: the one below misses
        assert row["lowest_mhz"] <= row["fixed_mhz"]
        below = clocks[clocks.index(row["lowest_mhz"]) - 1]
        assert run_fixed(cfgs[own.index(row)], below)["p99_over_slo"] > 1.0
    lowest = max(row["lowest_mhz"] for row in own)
    rows = best_fixed_cell(cfgs, lowest)
    assert [r["seed"] for r in rows] == [1, 2]
    assert {r["policy"] for r in rows} == {BEST_FIXED_CELL}
    (mhz,) = {r["fixed_mhz"] for r in rows}  # one clock for both seeds
    assert mhz >= lowest and all(r["p99_over_slo"] <= 1.0 for r in rows)
    # The walk up stopped where the next step misses on a seed or costs more on the whole.
    if clocks.index(mhz) + STRIDE < len(clocks):
        up = [run_fixed(cfg, clocks[clocks.index(mhz) + STRIDE]) for cfg in cfgs]
        assert any(r["p99_over_slo"] > 1.0 for r in up) or sum(
            r["energy_per_inference_j"] for r in up
        ) >= sum(r["energy_per_inference_j"] for r in rows)
