from __future__ import annotations

import math

import numpy as np
import pytest

from time2clock.table import ClockPoint, InverseLinearFit, Time2ClockTable


def make_table(
    clocks: list[int], m: float = 6e-5, b: float = 0.0085, concurrency: int = 2
) -> Time2ClockTable:
    fit = InverseLinearFit(m, b, 1.0)
    points = tuple(ClockPoint(c, 10, fit.predict_ms(c), 0, 0, 0, 0, 0, 0) for c in sorted(clocks))
    return Time2ClockTable(
        "gpu",
        "model",
        0.2,
        concurrency,
        fit,
        points,
        {"p99": InverseLinearFit(m * 0.8, b * 0.8, 1.0)},
    )


def brute_force(
    table: Time2ClockTable, budget_ms: float, quantile: str | None = None
) -> tuple[int, bool]:
    ok = [c for c in table.clocks_mhz if table.predict_ms(c, quantile) <= budget_ms]
    return (min(ok), True) if ok else (max(table.clocks_mhz), False)


def test_closed_form_agrees_with_brute_force() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        lo = int(rng.integers(100, 500))
        clocks = sorted({lo + 15 * int(k) for k in rng.integers(0, 120, 40)})
        table = make_table(
            clocks, m=float(rng.uniform(2e-5, 2e-4)), b=float(rng.uniform(1e-3, 2e-2))
        )
        for budget in rng.uniform(1.0, 80.0, 20):
            for q in (None, "p99"):
                assert table.lowest_clock_mhz(float(budget), q) == brute_force(
                    table, float(budget), q
                )
        # Budgets exactly at a clock's prediction pick that clock.
        c = clocks[len(clocks) // 2]
        assert table.lowest_clock_mhz(table.predict_ms(c))[0] == c


def test_clock_for_queue_uses_rounds_of_concurrency() -> None:
    table = make_table(list(range(300, 2101, 15)), concurrency=2)
    slo = 40.0
    for queue in range(8):
        rounds = math.ceil((queue + 1) / 2)
        assert table.clock_for_queue(slo, queue) == table.lowest_clock_mhz(slo / rounds)
    assert table.clock_for_queue(slo, 3, concurrency=4) == table.lowest_clock_mhz(slo)
    assert table.clock_for_queue(5.0, 0) == (2100, False)
    with pytest.raises(ValueError):
        table.clock_for_queue(slo, -1)


def test_flat_or_rising_fit_still_chooses_sensibly() -> None:
    flat = make_table([300, 600, 900], m=-1e-7, b=0.1)
    assert flat.lowest_clock_mhz(20.0) == (300, True)
    assert flat.lowest_clock_mhz(5.0) == (300, False)
