"""The live demo's best single clock in hindsight: the simulator's search, one live run at a time.
Here with made-up runs (a tail that falls and an energy that is convex in the clock), so the
search can be checked against the same search that knows every run."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from benchmarks.live import BEST_FIXED, PolicyRun, best_fixed, best_fixed_step
from dvfs.profiles import get_profile
from simulator.bestfixed import STRIDE, cheapest_meeting

CLOCKS = sorted(get_profile("v100").clocks_mhz)
SLO_MS = 40.0


def fake_run(clock_mhz: int, *, lowest_mhz: int, optimum_mhz: int) -> PolicyRun:
    """A run whose p99 meets the SLO from ``lowest_mhz`` up, with the least energy per inference
    at ``optimum_mhz``."""
    p99_ms = SLO_MS * lowest_mhz / clock_mhz
    energy_j = 1.0 + ((clock_mhz - optimum_mhz) / 1000.0) ** 2
    return PolicyRun(
        policy=f"fixed:{clock_mhz}",
        rate_rps=40.0,
        achieved_rps=40.0,
        sent=100,
        completed=100,
        refused=0,
        throughput_rps=40.0,
        p50_ms=p99_ms / 2,
        p99_ms=p99_ms,
        slo_ms=SLO_MS,
        slo_attainment=1.0,
        energy_j=100 * energy_j,
        energy_per_inference_j=energy_j,
        mean_clock_mhz=float(clock_mhz),
        clocks_seen=1,
    )


@pytest.mark.parametrize(
    ("lowest_mhz", "optimum_mhz"),
    [(CLOCKS[40], CLOCKS[120]), (CLOCKS[130], CLOCKS[20]), (CLOCKS[0], CLOCKS[0]), (10_000, 1)],
)
def test_the_live_search_chooses_what_the_full_search_does_running_each_clock_once(
    lowest_mhz: int, optimum_mhz: int
) -> None:
    def make(clock: int) -> PolicyRun:
        return fake_run(clock, lowest_mhz=lowest_mhz, optimum_mhz=optimum_mhz)

    full = {c: make(c) for c in CLOCKS}
    _, expected = cheapest_meeting(
        len(CLOCKS),
        meets=lambda i: full[CLOCKS[i]].p99_ms <= SLO_MS,
        cost=lambda i: full[CLOCKS[i]].energy_per_inference_j,
        stride=STRIDE,
    )
    asked: list[int] = []

    async def run_fixed(clock: int) -> PolicyRun:
        asked.append(clock)
        return make(clock)

    top = replace(make(CLOCKS[-1]), policy="max")  # max's run stands for the top clock
    best = asyncio.run(best_fixed(CLOCKS[::-1], run_fixed, [top], max_runs=100))
    assert best.policy == BEST_FIXED and best.fixed_mhz == CLOCKS[expected]
    assert best.fixed_complete
    assert best.p99_ms == full[CLOCKS[expected]].p99_ms
    assert len(asked) == len(set(asked)) == best.fixed_runs  # no clock twice
    assert CLOCKS[-1] not in asked
    if lowest_mhz > CLOCKS[-1]:  # even the top misses: the top, and nothing else is run
        assert best.fixed_mhz == CLOCKS[-1] and asked == []


def test_a_search_past_its_budget_keeps_the_cheapest_run_that_met_the_slo() -> None:
    # The energy-optimal clock far above the lowest that meets the SLO: a long walk up.
    lowest_mhz, optimum_mhz = CLOCKS[40], CLOCKS[150]
    asked: list[int] = []

    async def run_fixed(clock: int) -> PolicyRun:
        asked.append(clock)
        return fake_run(clock, lowest_mhz=lowest_mhz, optimum_mhz=optimum_mhz)

    top = replace(
        fake_run(CLOCKS[-1], lowest_mhz=lowest_mhz, optimum_mhz=optimum_mhz), policy="max"
    )
    best = asyncio.run(best_fixed(CLOCKS, run_fixed, [top], max_runs=12))
    assert not best.fixed_complete and best.fixed_runs == len(asked) == 12
    assert max(asked) < optimum_mhz  # cut on the way up
    made = [fake_run(c, lowest_mhz=lowest_mhz, optimum_mhz=optimum_mhz) for c in asked] + [top]
    cheapest = min((r for r in made if r.p99_ms <= SLO_MS), key=lambda r: r.energy_j)
    assert best.fixed_mhz == int(cheapest.mean_clock_mhz) and best.p99_ms <= SLO_MS


def test_a_step_names_the_first_clock_the_search_has_no_run_of() -> None:
    needed, _ = best_fixed_step(CLOCKS, {})
    assert needed == CLOCKS[-1]  # the search starts with whether the top meets the SLO
    top = fake_run(CLOCKS[-1], lowest_mhz=CLOCKS[50], optimum_mhz=CLOCKS[100])
    needed, _ = best_fixed_step(CLOCKS, {CLOCKS[-1]: top})
    assert needed == CLOCKS[(len(CLOCKS) - 1) // 2]  # then the bisection's middle
