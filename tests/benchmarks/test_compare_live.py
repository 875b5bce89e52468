"""The demo's comparison on the real stack: each policy measured on the same arrivals, after a
warm-up that is sent but not counted."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from benchmarks.live import compare_live
from loadgen.engine import schedule
from tests.api.live import embedded_config


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
    )
    assert [r.policy for r in runs] == ["max", "adaptive"]
    for run in runs:
        assert run.sent == run.completed == measured  # the warm-up's requests are not counted
        assert run.energy_j > 0 and run.energy_per_inference_j > 0
        assert 0 < run.p50_ms <= run.p99_ms
        # 30 requests cannot bound a p99 from above: no interval rather than a false one
        assert math.isnan(run.p99_low_ms) and math.isnan(run.p99_high_ms)
