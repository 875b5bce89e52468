"""The p99's confidence interval that the demo prints beside each policy's p99."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from rich.console import Console

from benchmarks.demo import table
from benchmarks.live import PolicyRun, percentile_interval_ms


def test_the_interval_covers_the_true_p99_as_often_as_it_says() -> None:
    rng = np.random.default_rng(7)
    scale_s = 0.02
    true_p99_ms = -math.log(0.01) * scale_s * 1000.0  # the exponential's 99th percentile
    trials, covered = 400, 0
    for _ in range(trials):
        low, high = percentile_interval_ms(rng.exponential(scale_s, 770).tolist(), 99)
        covered += low <= true_p99_ms <= high
    assert 0.92 <= covered / trials <= 0.99


def test_its_ends_are_samples_around_the_samples_own_p99() -> None:
    latencies_s = np.random.default_rng(1).uniform(0.01, 0.05, 2000)
    low, high = percentile_interval_ms(latencies_s.tolist(), 99)
    p99_ms = float(np.percentile(latencies_s, 99)) * 1000.0
    assert low < p99_ms < high
    samples_ms = set((latencies_s * 1000.0).tolist())
    assert low in samples_ms and high in samples_ms


def test_too_few_samples_have_no_interval() -> None:
    assert all(math.isnan(x) for x in percentile_interval_ms([], 99))
    # 30 samples: the 99th percentile lies past the largest more often than not
    assert all(math.isnan(x) for x in percentile_interval_ms([0.01 * i for i in range(30)], 99))


def test_the_demo_table_prints_the_interval_or_a_dash() -> None:
    run = PolicyRun(
        policy="max",
        rate_rps=40.0,
        achieved_rps=40.0,
        sent=800,
        completed=800,
        refused=0,
        throughput_rps=40.0,
        p50_ms=13.0,
        p99_ms=20.5,
        slo_ms=40.0,
        slo_attainment=1.0,
        energy_j=1500.0,
        energy_per_inference_j=1.875,
        mean_clock_mhz=1530.0,
        clocks_seen=1,
        p99_low_ms=19.2,
        p99_high_ms=22.4,
    )
    short = replace(run, policy="adaptive", p99_low_ms=math.nan, p99_high_ms=math.nan)
    console = Console(record=True, width=200)
    console.print(table([run, short]))
    text = console.export_text()
    assert "19.2–22.4" in text
    assert "p99 95% CI" in text
    row = next(line for line in text.splitlines() if "adaptive" in line)
    assert "—" in row
