"""Arrivals for the simulator: Poisson, bursty (on/off), or a trace; and mixes of clients."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from scheduler.clients import ClientSpec

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def poisson_arrivals(rate_rps: float, duration_s: float, rng: np.random.Generator) -> FloatArray:
    """Arrival times (s) of a Poisson process at ``rate_rps`` over ``[0, duration_s)``."""
    if rate_rps <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be > 0")
    n = int(rng.poisson(rate_rps * duration_s))
    return np.sort(rng.uniform(0.0, duration_s, n))


def bursty_arrivals(
    rate_rps: float,
    duration_s: float,
    rng: np.random.Generator,
    *,
    burst_factor: float = 3.0,
    on_fraction: float = 0.25,
    mean_period_s: float = 1.0,
) -> FloatArray:
    """An on/off Poisson process with mean rate ``rate_rps``: bursts at ``burst_factor``× the
    mean for ``on_fraction`` of the time, a trickle in between; on/off spells are exponential
    with ``mean_period_s`` for a whole cycle."""
    if not 0 < on_fraction < 1 or burst_factor < 1 or burst_factor * on_fraction > 1:
        raise ValueError(
            "need 0 < on_fraction < 1, burst_factor >= 1 and burst_factor·on_fraction <= 1"
        )
    on_rate = rate_rps * burst_factor
    off_rate = max(0.0, rate_rps * (1 - burst_factor * on_fraction) / (1 - on_fraction))
    times: list[FloatArray] = []
    t, on = 0.0, bool(rng.random() < on_fraction)
    while t < duration_s:
        spell = rng.exponential(mean_period_s * (on_fraction if on else 1 - on_fraction))
        end = min(t + spell, duration_s)
        rate = on_rate if on else off_rate
        if rate > 0:
            n = int(rng.poisson(rate * (end - t)))
            times.append(rng.uniform(t, end, n))
        t, on = end, not on
    return np.sort(np.concatenate(times)) if times else np.zeros(0)


def trace_arrivals(path: Path) -> FloatArray:
    """Arrival times (s, one per line, ``#`` comments allowed) from a trace file, sorted."""
    values: list[float] = []
    for line_no, line in enumerate(Path(path).read_text().splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{path}:{line_no}: not a number of seconds: {text!r}") from None
        if value < 0 or not np.isfinite(value):
            raise ValueError(f"{path}:{line_no}: arrival times must be finite and >= 0")
        values.append(value)
    if not values:
        raise ValueError(f"{path}: no arrival times")
    return np.sort(np.asarray(values))


def assign_clients(n: int, clients: list[ClientSpec], rng: np.random.Generator) -> IntArray:
    """Which client (index into ``clients``) sends each of ``n`` arrivals, by share."""
    return rng.choice(len(clients), size=n, p=[c.share for c in clients])
