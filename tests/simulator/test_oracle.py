from __future__ import annotations

import numpy as np
import pytest

from dvfs.profiles import get_profile
from simulator.compare import DEFAULT_MIX, slo_models
from simulator.oracle import (
    batch_costs_j,
    energy_hull,
    live_batch_limits,
    oracle_energy,
    taut_string,
    window_bound_j,
)
from simulator.simulate import SimConfig, simulate


@pytest.mark.parametrize("model", ["resnet50", "bert-large"])
def test_hull_is_convex_from_idle_and_below_every_clock_and_batch(model: str) -> None:
    p = get_profile("v100")
    m = p.model(model)
    xs, ys = energy_hull(p, model)
    assert (xs[0], ys[0]) == (0.0, 0.0)
    slopes = np.diff(ys) / np.diff(xs)
    assert np.all(np.diff(slopes) >= -1e-9)
    idle = p.idle_power_w(p.min_clock_mhz)
    for f in p.clocks_mhz:
        for b in range(1, m.max_batch + 1):
            speed = b * 1000.0 / m.mean_latency_ms(f, b)
            assert np.interp(speed, xs, ys) <= m.busy_power_w(f, b) - idle + 1e-9
    # The fastest point is a full batch at the top clock, not one request at a time.
    assert xs[-1] == pytest.approx(m.capacity_rps())


def test_taut_string_by_hand() -> None:
    # Two requests at 0 due at 1, one at 1 due at 2: 2 units in [0,1], 1 in [1,2].
    assert taut_string(np.array([0.0, 0.0, 1.0]), np.array([1.0, 1.0, 2.0])) == [
        (0.0, 1.0, 2.0),
        (1.0, 2.0, 1.0),
    ]
    # One request, all the time in the world: as slow as allowed.
    assert taut_string(np.array([0.0]), np.array([2.0])) == [(0.0, 2.0, 1.0)]
    # Mixed deadlines: the tight one bends the string.
    assert taut_string(np.array([0.0, 0.5]), np.array([2.0, 0.6])) == [
        (0.0, 0.6, 1.0),
        (0.6, 2.0, 1.0),
    ]
    # The string never runs ahead of arrivals: work waits for the second request.
    segs = taut_string(np.array([0.0, 1.0]), np.array([0.1, 1.1]))
    assert segs[0] == (0.0, 0.1, 1.0)
    assert segs[-1][1] == pytest.approx(1.1)


def test_oracle_energy_of_one_request_by_hand() -> None:
    p = get_profile("v100")
    res = oracle_energy(p, np.array([0.0]), np.array([0.5]), duration_s=1.0)
    xs, ys = energy_hull(p)
    idle = p.idle_power_w(p.min_clock_mhz)
    string = np.interp(2.0, xs, ys) * 0.5  # 2 requests/s for half a second, as fluid work
    m = p.model()
    alone = min(  # but alone, it runs in a batch of one: at its best clock
        (m.busy_power_w(f, 1) - idle) * m.mean_latency_ms(f, 1) / 1000.0 for f in p.clocks_mhz
    )
    assert alone > string
    assert res.string_busy_j == pytest.approx(string)
    assert res.window_busy_j == pytest.approx(alone)
    assert res.energy_j == pytest.approx(idle * 1.0 + alone)
    assert res.infeasible_requests == 0


def test_live_batch_limits_by_hand() -> None:
    # 0: [0, 1); 1: [0.5, 1.5); 2: [1, 2) (the first is due when the third arrives: not both).
    arrivals, deadlines = np.array([0.0, 0.5, 1.0]), np.array([1.0, 1.5, 2.0])
    assert list(live_batch_limits(arrivals, deadlines)) == [2.0, 2.0, 2.0]
    # Ten at once, then one alone much later.
    arrivals = np.concatenate((np.zeros(10), [5.0]))
    assert list(live_batch_limits(arrivals, arrivals + 0.1)) == [10.0] * 10 + [1.0]


def test_batch_window_bound_prices_each_request_at_the_batch_it_could_join() -> None:
    p = get_profile("v100")
    costs = batch_costs_j(p)
    assert np.all(np.diff(costs[1:]) <= 0)  # a bigger batch never costs more per request
    assert costs[32] < 0.5 * costs[1]
    arrivals = np.concatenate((np.zeros(32), [5.0]))
    bound = window_bound_j(p, arrivals, arrivals + 0.5)
    assert bound == pytest.approx(32 * costs[32] + costs[1])
    # Steady low load, tight deadlines: the bound stays below what a run spends.
    r = simulate(
        SimConfig(
            gpu="v100",
            policy="max",
            rate_rps=20.0,
            models=slo_models("v100", "resnet50", 0.5),
            duration_s=10.0,
        )
    )
    assert r.oracle_energy_j is not None and r.oracle_energy_j < r.energy_j


def test_oracle_marks_impossible_deadlines() -> None:
    p = get_profile("v100")
    res = oracle_energy(p, np.zeros(10), np.full(10, 0.001), duration_s=1.0)
    assert res.infeasible_requests == 10


def test_oracle_of_two_models_adds_each_models_busy_bound() -> None:
    p = get_profile("v100")
    arrivals, deadlines = np.array([0.0, 0.1]), np.array([0.5, 0.6])
    both = oracle_energy(p, arrivals, deadlines, 1.0, ["resnet50", "bert-large"])
    cnn = oracle_energy(p, arrivals[:1], deadlines[:1], 1.0, ["resnet50"])
    bert = oracle_energy(p, arrivals[1:], deadlines[1:], 1.0, ["bert-large"])
    assert both.idle_energy_j == cnn.idle_energy_j
    assert both.busy_energy_j == pytest.approx(cnn.busy_energy_j + bert.busy_energy_j)


@pytest.mark.parametrize("policy", ["max", "slack", "default"])
def test_oracle_is_below_what_policies_spend(policy: str) -> None:
    models = slo_models("v100", DEFAULT_MIX, 3.0)
    r = simulate(SimConfig(gpu="v100", policy=policy, load=0.3, models=models, duration_s=10.0))
    assert r.oracle_energy_j is not None
    assert r.oracle_energy_j < r.energy_j


def test_clairvoyant_string_counts_each_requests_own_work() -> None:
    # Unit work: the same string as without weights.
    arrivals, deadlines = np.array([0.0, 0.0, 1.0]), np.array([1.0, 1.0, 2.0])
    assert taut_string(arrivals, deadlines, np.ones(3)) == taut_string(arrivals, deadlines)
    # The first request drew twice the mean time: 3 units due by 1, then 1.
    assert taut_string(arrivals, deadlines, np.array([2.0, 1.0, 1.0])) == [
        (0.0, 1.0, 3.0),
        (1.0, 2.0, 1.0),
    ]


def test_clairvoyant_oracle_with_unit_work_is_the_oracle() -> None:
    p = get_profile("v100")
    rng = np.random.default_rng(3)
    arrivals = np.sort(rng.uniform(0, 2, 50))
    deadlines = arrivals + 0.05
    plain = oracle_energy(p, arrivals, deadlines, 2.0)
    unit = oracle_energy(p, arrivals, deadlines, 2.0, work=np.ones(50))
    assert unit.energy_j == pytest.approx(plain.energy_j)
    heavier = oracle_energy(p, arrivals, deadlines, 2.0, work=np.full(50, 1.5))
    assert heavier.busy_energy_j > plain.busy_energy_j


def test_simulator_reports_the_clairvoyant_bound_below_what_it_spent() -> None:
    models = slo_models("v100", DEFAULT_MIX, 3.0)
    r = simulate(SimConfig(gpu="v100", policy="max", load=0.3, models=models, duration_s=10.0))
    assert r.clairvoyant_energy_j is not None and r.oracle_energy_j is not None
    assert r.clairvoyant_energy_j < r.energy_j
    # The run's draws differ from the mean: the two bounds differ, by little.
    assert r.clairvoyant_energy_j != r.oracle_energy_j
    assert abs(r.clairvoyant_energy_j / r.oracle_energy_j - 1.0) < 0.1
