from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from time2clock.fit import (
    fit_inverse_linear,
    fit_table,
    read_measurements,
    trimmed_mean,
    write_measurements,
)
from time2clock.table import TableError, Time2ClockTable

TRUE_M, TRUE_B = 6.0e-5, 0.0085  # ~7.4 ms at 2100 MHz, ~37 ms at 300 MHz


def synthetic(seed: int, outlier_share: float = 0.10, n: int = 50) -> dict[int, list[float]]:
    """Samples from a known 1/(m·x+b) with gaussian spread and heavy *upper* outliers."""
    rng = np.random.default_rng(seed)
    out: dict[int, list[float]] = {}
    for clock in range(300, 2101, 90):
        mean = 1.0 / (TRUE_M * clock + TRUE_B)
        vals = mean + rng.normal(0, 0.03 * mean, n)
        hit = rng.random(n) < outlier_share
        vals[hit] += rng.uniform(2.0, 4.0, hit.sum()) * mean  # 3x-5x slow requests
        out[clock] = list(vals)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_trimmed_fit_recovers_m_and_b_and_the_trim_is_why(seed: int) -> None:
    samples = synthetic(seed)
    trimmed = fit_table(samples, trim=0.2)
    assert trimmed.m == pytest.approx(TRUE_M, rel=0.02)
    # b is the intercept, extrapolated to 0 MHz, so its relative error is the larger one (~3% std
    # at 50 requests per clock); what the scheduler uses, the predicted time, is tighter still.
    assert trimmed.b == pytest.approx(TRUE_B, rel=0.07)
    for clock in samples:
        assert trimmed.predict_ms(clock) == pytest.approx(1.0 / (TRUE_M * clock + TRUE_B), rel=0.03)
    untrimmed = fit_table(samples, trim=0.0)
    # Without the trim the outliers drag 1/y down and the fit is far off.
    assert abs(untrimmed.m - TRUE_M) / TRUE_M > 0.10
    assert trimmed.r2 > untrimmed.r2


def test_the_tail_margin_is_the_spread_not_the_fits_error_at_one_clock() -> None:
    """Ten executions at each of eight clocks, 1% gaussian spread around the law, except the
    lowest clock, whose mean is 25% over it (what is not the GPU's work weighs most there): the
    fit misses that clock by several milliseconds, and the p99 margin is still the spread of one
    execution, the same at every clock, not that one clock's miss."""
    rng = np.random.default_rng(3)
    clocks = [135, 338, 532, 735, 930, 1132, 1328, 1530]
    samples: dict[int, list[float]] = {}
    means = {c: 1.0 / (TRUE_M * c + TRUE_B) * (1.25 if c == 135 else 1.0) for c in clocks}
    for clock, mean in means.items():
        samples[clock] = list(mean + rng.normal(0.0, 0.01 * mean, 10))
    table = fit_table(samples, trim=0.2)
    missed_ms = trimmed_mean(samples[135], 0.2) - table.predict_ms(135)
    assert missed_ms > 5.0  # the law cannot follow the lowest clock
    spread_ms = 3 * 0.01 * max(means.values())  # three standard deviations at the slowest
    assert 0.0 < table.tail_margin_ms("p90") < table.tail_margin_ms("p99") < spread_ms
    # pooled against the fit, the lowest clock's ten (of 80) would have been the p90 and up
    assert table.tail_margin_ms("p90") < missed_ms / 10.0


def test_exact_data_fits_exactly() -> None:
    clocks = [300.0, 900.0, 1500.0, 2100.0]
    fit = fit_inverse_linear(clocks, [1.0 / (TRUE_M * c + TRUE_B) for c in clocks])
    assert fit.m == pytest.approx(TRUE_M)
    assert fit.b == pytest.approx(TRUE_B)
    assert fit.r2 == pytest.approx(1.0)


def test_trimmed_mean_drops_floor_n_trim_each_side() -> None:
    assert trimmed_mean([1, 2, 3, 4, 5, 6, 7, 8, 9, 100], 0.2) == pytest.approx(5.5)
    assert trimmed_mean([7.0], 0.4) == 7.0
    with pytest.raises(ValueError, match="trim must be in"):
        trimmed_mean([1.0, 2.0], 0.5)


def test_table_has_every_documented_field_and_round_trips(tmp_path: Path) -> None:
    table = fit_table(synthetic(1), trim=0.2, gpu="titanrtx", model="inception", concurrency=2)
    data = table.to_json()
    for key in ("gpu", "model", "trim", "concurrency", "m", "b", "r2", "clocks_mhz", "points"):
        assert key in data
    for key in ("clock_mhz", "n", "trimmed_mean_ms", "p50_ms", "p90_ms", "p99_ms", "std_ms"):
        assert key in data["points"][0]
    assert set(data["tail_fits"]) == {"p90", "p99"}
    assert data["clocks_mhz"] == sorted(data["clocks_mhz"])
    table.save(tmp_path / "t.json")
    assert Time2ClockTable.load(tmp_path / "t.json") == table
    # The p99 fit predicts slower than the mean fit everywhere on the ladder.
    assert all(table.predict_ms(c, "p99") > table.predict_ms(c) for c in table.clocks_mhz)


def test_csv_round_trip_and_clear_errors(tmp_path: Path) -> None:
    samples = {"inception": {1: {300: [30.0, 31.0], 2100: [7.0]}}}
    path = tmp_path / "m.csv"
    write_measurements(path, samples)
    assert read_measurements(path) == samples
    bad = tmp_path / "bad.csv"
    bad.write_text("clock,latency\n300,30\n")
    with pytest.raises(TableError, match=r"missing column.*clock_mhz, latency_ms"):
        read_measurements(bad)
    bad.write_text("clock_mhz,latency_ms,extra\n300,thirty,x\n")
    with pytest.raises(TableError, match=r"bad.csv:2: .* must be numbers"):
        read_measurements(bad)
    bad.write_text("clock_mhz,latency_ms\n300,-1\n")
    with pytest.raises(TableError, match="positive"):
        read_measurements(bad)
    with pytest.raises(TableError, match="two or more distinct clocks"):
        fit_table({300: [1.0, 2.0]})
    with pytest.raises(TableError, match="no measurements file"):
        read_measurements(tmp_path / "missing.csv")


def test_load_rejects_broken_tables(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text("{not json")
    with pytest.raises(TableError, match="is not JSON"):
        Time2ClockTable.load(path)
    path.write_text('{"gpu": "x"}')
    with pytest.raises(TableError, match="not a time2clock table"):
        Time2ClockTable.load(path)
