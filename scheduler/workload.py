"""Arrivals for the simulator: Poisson, bursty (on/off), or a trace; and mixes of clients."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from scheduler.weights import NICE_MAX, NICE_MIN

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class ClientSpec:
    """One class of clients: its share of the traffic and its scheduling hints."""

    name: str
    share: float = 1.0
    priority: int = 0
    nice: int = 0
    slo_ms: float | None = None  # None: the run's --slo-ms


def parse_clients(spec: str) -> list[ClientSpec]:
    """Parse ``"a:nice=-5,share=0.33;b:nice=0,share=0.33;c:priority=0,slo_ms=80"``.

    Shares are normalised to sum to 1; ValueError names the bad part.
    """
    clients: list[ClientSpec] = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, rest = part.partition(":")
        name = name.strip()
        if not name:
            raise ValueError(f"client spec {part!r}: a name comes before ':'")
        fields: dict[str, float] = {}
        for item in filter(None, (i.strip() for i in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq or key not in ("share", "priority", "nice", "slo_ms"):
                raise ValueError(
                    f"client {name!r}: {item!r} is not one of share=, priority=, nice=, slo_ms="
                )
            try:
                fields[key] = float(value)
            except ValueError:
                raise ValueError(
                    f"client {name!r}: {key} must be a number, got {value!r}"
                ) from None
        client = ClientSpec(
            name=name,
            share=fields.get("share", 1.0),
            priority=int(fields.get("priority", 0)),
            nice=int(fields.get("nice", 0)),
            slo_ms=fields.get("slo_ms"),
        )
        if client.share <= 0:
            raise ValueError(f"client {name!r}: share must be > 0")
        if not NICE_MIN <= client.nice <= NICE_MAX:
            raise ValueError(f"client {name!r}: nice must be in {NICE_MIN}..{NICE_MAX}")
        if client.priority < 0:
            raise ValueError(f"client {name!r}: priority must be >= 0")
        if client.slo_ms is not None and client.slo_ms <= 0:
            raise ValueError(f"client {name!r}: slo_ms must be > 0")
        clients.append(client)
    if not clients:
        raise ValueError("no clients in spec")
    if len({c.name for c in clients}) != len(clients):
        raise ValueError("client names must be unique")
    total = sum(c.share for c in clients)
    return [ClientSpec(c.name, c.share / total, c.priority, c.nice, c.slo_ms) for c in clients]


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
