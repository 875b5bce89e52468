"""Factories for scheduler tests: hand-made tables and requests."""

from __future__ import annotations

from scheduler.core import Scheduler, SchedulerConfig
from scheduler.policies import ClockPolicy
from scheduler.request import Request
from scheduler.view import ModelServing
from time2clock.table import ClockPoint, InverseLinearFit, ModelTable, TableSet, Time2ClockTable

CLOCKS = [300, 600, 900, 1200, 1500, 1800, 2100]
M, B = 6e-5, 0.0085  # 7.38 ms at 2100 MHz, 37.6 ms at 300 MHz
MODEL = "model"


def make_table(
    *,
    energy_optimal_mhz: int | None = 900,
    margin_ms: float = 1.0,
    concurrency: int = 2,
    batch: int = 1,
    slower: float = 1.0,
    model: str = MODEL,
) -> Time2ClockTable:
    """One curve: ``slower`` × the base law, energy lowest at ``energy_optimal_mhz``."""
    fit = InverseLinearFit(M / slower, B / slower, 1.0)
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
        model,
        0.2,
        concurrency,
        fit,
        points,
        tail_fits={"p99": InverseLinearFit(M / slower, B / slower, 1.0)},
        residual_quantiles_ms={"p90": margin_ms / 2, "p99": margin_ms},
        batch=batch,
    )


def make_model_table(
    *, batches: dict[int, float] | None = None, slower: float = 1.0, model: str = MODEL
) -> ModelTable:
    """Curves at each batch (batch -> its time over batch 1's); default: batch 1 only."""
    ratios = batches or {1: 1.0}
    return ModelTable(
        gpu="gpu",
        model=model,
        curves={
            b: make_table(batch=b, slower=slower * r, model=model, concurrency=1)
            for b, r in ratios.items()
        },
    )


def make_scheduler(
    policy: ClockPolicy,
    *tables: ModelTable,
    serving: dict[str, ModelServing] | None = None,
    **cfg: object,
) -> Scheduler[None]:
    table_set = TableSet(tables or (ModelTable.single(make_table()),))
    config = SchedulerConfig(**cfg)  # type: ignore[arg-type]
    return Scheduler(table_set, policy, config, serving or {MODEL: ModelServing(1, 2)})


def make_request(
    *,
    arrival_s: float = 0.0,
    slo_ms: float = 100.0,
    priority: int = 0,
    nice: int = 0,
    client_id: str = "default",
    model: str = MODEL,
) -> Request[None]:
    return Request(
        model=model,
        arrival_s=arrival_s,
        slo_ms=slo_ms,
        priority=priority,
        nice=nice,
        client_id=client_id,
    )
