"""Arrivals for the simulator: Poisson, bursty (on/off), a compressed day with bursts, or a
trace; and mixes of clients."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from scheduler.clients import ClientSpec
from simulator.shapes import SHAPES, DayShape, cosine_day, read_numbers

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


@dataclass(frozen=True)
class DayCycle:
    """Load that moves: ``days`` days of a daily shape compressed into the run, with bursts on
    top.

    ``shape``: ``diurnal`` (the synthetic cosine day from ``trough`` of the peak to the peak),
    a named production shape (:data:`simulator.shapes.SHAPES`) or a file of relative rates
    (:meth:`simulator.shapes.DayShape.from_file`). Bursts start at exponential intervals of
    mean ``burst_gap_s`` and multiply the rate by ``burst_factor`` for ``burst_s``. The run's
    rate (``--rate``, or ``--load`` of the capacity) is the **highest** the curve reaches: a
    burst at the day's peak. So the day's peak is that over ``burst_factor``, and a load the
    top clock holds keeps every moment of the run within what it holds.
    """

    shape: str = "diurnal"
    days: float = 2.0
    trough: float = 0.15
    burst_factor: float = 1.5
    burst_s: float = 2.0
    burst_gap_s: float = 20.0

    def __post_init__(self) -> None:
        if self.days <= 0 or self.burst_s <= 0 or self.burst_gap_s <= 0:
            raise ValueError("days, burst_s and burst_gap_s must be > 0")
        if self.burst_factor < 1:
            raise ValueError(f"burst_factor must be >= 1, got {self.burst_factor}")

    def day_shape(self) -> DayShape:
        if self.shape == "diurnal":
            return cosine_day(self.trough)
        if self.shape in SHAPES:
            return SHAPES[self.shape]
        path = Path(self.shape)
        if path.is_file():
            return DayShape.from_file(path)
        raise ValueError(
            f"unknown day shape {self.shape!r}; known: diurnal, {', '.join(SHAPES)}, "
            "or a file of relative rates"
        )

    def bursts(self, duration_s: float, rng: np.random.Generator) -> FloatArray:
        """Start times of the bursts in ``[0, duration_s)``."""
        if self.burst_factor == 1.0:
            return np.zeros(0)
        starts: list[float] = []
        t = float(rng.exponential(self.burst_gap_s))
        while t < duration_s:
            starts.append(t)
            t += float(rng.exponential(self.burst_gap_s))
        return np.asarray(starts, dtype=float)

    def rate_rps(
        self, t_s: FloatArray, peak_rps: float, duration_s: float, bursts: FloatArray
    ) -> FloatArray:
        """The arrival rate at each time in ``t_s``, for a run whose highest rate (a burst at
        the day's peak) is ``peak_rps``."""
        t = np.asarray(t_s, dtype=float)
        base = peak_rps / self.burst_factor * self.day_shape().at(t * self.days / duration_s)
        if len(bursts):
            i = np.searchsorted(bursts, t, side="right") - 1
            inside = (i >= 0) & (t < bursts[np.maximum(i, 0)] + self.burst_s)
            base = np.where(inside, base * self.burst_factor, base)
        out: FloatArray = base
        return out


def day_arrivals(
    peak_rps: float, duration_s: float, cycle: DayCycle, rng: np.random.Generator
) -> FloatArray:
    """Arrival times (s) of a Poisson process whose rate follows ``cycle`` (its highest rate
    ``peak_rps``) over ``[0, duration_s)``: candidates at ``peak_rps``, each kept with
    probability rate / ``peak_rps`` (thinning, exact for any rate curve)."""
    if peak_rps <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be > 0")
    bursts = cycle.bursts(duration_s, rng)
    n = int(rng.poisson(peak_rps * duration_s))
    times = np.sort(rng.uniform(0.0, duration_s, n))
    keep = rng.random(n) * peak_rps < cycle.rate_rps(times, peak_rps, duration_s, bursts)
    out: FloatArray = times[keep]
    return out


def mean_rate_rps(peak_rps: float, duration_s: float, cycle: DayCycle) -> float:
    """The curve's mean rate over the run without bursts (what a day averages below its
    peak), for reports."""
    t = (np.arange(4000) + 0.5) * duration_s / 4000
    return float(cycle.rate_rps(t, peak_rps, duration_s, np.zeros(0)).mean())


def trace_arrivals(path: Path) -> FloatArray:
    """Arrival times (s, one per line, ``#`` comments allowed) from a trace file, sorted."""
    values = read_numbers(path, "a number of seconds", "arrival times")
    if not values:
        raise ValueError(f"{path}: no arrival times")
    return np.sort(np.asarray(values))


def assign_clients(n: int, clients: list[ClientSpec], rng: np.random.Generator) -> IntArray:
    """Which client (index into ``clients``) sends each of ``n`` arrivals, by share."""
    return rng.choice(len(clients), size=n, p=[c.share for c in clients])
