"""The demo's comparison on the real stack: each policy measured on the same arrivals, after a
warm-up that is sent but not counted."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks.live import BEST_FIXED, compare_live
from dvfs.profiles import get_profile
from loadgen.engine import schedule
from tests.api.live import embedded_config

_V100 = sorted(get_profile("v100").clocks_mhz)
LADDER = (_V100[60], _V100[120], _V100[-1])  # the embedded default's GPU: about 585 MHz up


def test_each_policy_is_measured_on_the_same_arrivals_after_an_unmeasured_warm_up(
    tmp_path: Path,
) -> None:
    rate_rps, duration_s, seed = 20.0, 1.5, 3
    measured = len(schedule(rate_rps, duration_s, "poisson", np.random.default_rng(seed)))
    warm = len(schedule(rate_rps, 1.0, "poisson", np.random.default_rng(seed + 1)))
    assert measured > 0 and warm > 0
    runs = compare_live(
        policies=("max", "adaptive"),
        rate_rps=rate_rps,
        duration_s=duration_s,
        slo_ms=200.0,
        seed=seed,
        config=embedded_config(tmp_path, max_queue=100),
        warmup_s=1.0,
        best_fixed_clocks=LADDER,
    )
    assert [r.policy for r in runs] == ["max", "adaptive", BEST_FIXED]
    for run in runs:
        assert run.sent == run.completed == measured  # the warm-up's requests are not counted
        assert run.energy_j > 0 and run.energy_per_inference_j > 0
        assert 0 < run.p50_ms <= run.p99_ms
        # 30 requests cannot bound a p99 from above: no interval rather than a false one
        assert math.isnan(run.p99_low_ms) and math.isnan(run.p99_high_ms)
    # The best single clock: max's run stands for the top, the bisection runs the middle clock
    # and then the lowest (a 200 ms SLO is met at both); with three clocks there is no walk up.
    best = runs[-1]
    assert best.fixed_mhz == LADDER[0] and best.fixed_runs == 2 and best.fixed_complete
    assert best.mean_clock_mhz == pytest.approx(LADDER[0], abs=1.0)  # the clock was locked there
    assert best.p99_ms <= best.slo_ms
