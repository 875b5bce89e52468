"""Factories for scheduler tests: a hand-made table and requests."""

from __future__ import annotations

from scheduler.request import Request
from time2clock.table import ClockPoint, InverseLinearFit, Time2ClockTable

CLOCKS = [300, 600, 900, 1200, 1500, 1800, 2100]
M, B = 6e-5, 0.0085  # 7.38 ms at 2100 MHz, 37.6 ms at 300 MHz


def make_table(
    *, energy_optimal_mhz: int | None = 900, margin_ms: float = 1.0, concurrency: int = 2
) -> Time2ClockTable:
    fit = InverseLinearFit(M, B, 1.0)
    points = tuple(
        ClockPoint(
            c,
            20,
            fit.predict_ms(c),
            0,
            0,
            0,
            0,
            0,
            0,
            energy_per_inference_j=None
            if energy_optimal_mhz is None
            else 1.0 + abs(c - energy_optimal_mhz) / 1000.0,
        )
        for c in CLOCKS
    )
    return Time2ClockTable(
        "gpu",
        "model",
        0.2,
        concurrency,
        fit,
        points,
        tail_fits={"p99": InverseLinearFit(M, B, 1.0)},
        residual_quantiles_ms={"p90": margin_ms / 2, "p99": margin_ms},
    )


def make_request(
    *,
    arrival_s: float = 0.0,
    slo_ms: float = 100.0,
    priority: int = 0,
    nice: int = 0,
    client_id: str = "default",
) -> Request:
    return Request(
        model="m",
        arrival_s=arrival_s,
        slo_ms=slo_ms,
        priority=priority,
        nice=nice,
        client_id=client_id,
    )
