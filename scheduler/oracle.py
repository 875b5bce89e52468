"""A lower bound on the energy any clock policy could spend on given arrivals and deadlines.

The model. Treat the GPU as one processor whose speed at clock ``f`` is its throughput,
``σ(f) = C / y(f)`` requests per second (``C`` in flight, each taking the mean ``y(f)``), drawing
``P_busy(f)``. Every instant of any schedule is either idle (power ≥ ``P_idle_min``, the idle
power at the lowest clock) or busy at some clock, doing work at a rate ≤ ``σ(f)``. Write the power
above ``P_idle_min`` as a function of speed and take the **lower convex hull** ``Q̂(σ)`` of the
points ``(0, 0)`` (idle) and ``(σ(f), P_busy(f) − P_idle_min)`` for every clock on the ladder.
``Q̂`` is what mixing adjacent clocks (or running fast then idling) can achieve at best; it is
convex and non-decreasing, and no instant of any schedule costs less than ``Q̂`` of its speed.

The bound. A schedule that meets every deadline must, for every time ``t``, have done at least
``D(t)`` requests (those whose deadline is ≤ ``t``) and at most ``A(t)`` (those that have
arrived). The cumulative work curve that minimises ``∫ Q̂(σ(t)) dt`` between these two curves is
the **taut string** from ``(0, 0)`` to ``(T, N)`` (for any convex ``Q̂``; with one SLO for all
requests the deadlines are agreeable and this is exactly Yao-Demers-Shenker's optimum, with mixed
SLOs the two curves are a relaxation, so the bound stays a bound). Hence

    E(any deadline-meeting schedule) ≥ P_idle_min · duration + ∫ Q̂(σ_string(t)) dt = oracle.

Why it is a lower bound and not an estimate: every relaxation goes the oracle's way: no
clock-change delay, perfect knowledge of arrivals, the throughput of a full GPU even with one
request in flight, mixing clocks for free, idle power at the lowest clock, and the mean service
time (with random service times the bound holds in expectation). Where even the top clock
cannot meet the deadlines, that stretch is charged at the top clock's energy per request and
marked infeasible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dvfs.profiles import GpuProfile
from scheduler.workload import FloatArray


@dataclass(frozen=True)
class OracleResult:
    energy_j: float
    idle_energy_j: float
    busy_energy_j: float
    infeasible_requests: float
    segments: int


def energy_hull(profile: GpuProfile, concurrency: int) -> tuple[FloatArray, FloatArray]:
    """Breakpoints ``(σ in requests/s, Q̂ in W)`` of the lower convex hull, from ``(0, 0)``."""
    idle = profile.idle_power_w(profile.min_clock_mhz)
    pts = [(0.0, 0.0)] + [
        (concurrency * 1000.0 / profile.mean_latency_ms(f), profile.busy_power_w(f) - idle)
        for f in profile.clocks_mhz
    ]
    pts.sort()
    hull: list[tuple[float, float]] = []
    for p in pts:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) <= 0:
                hull.pop()
            else:
                break
        hull.append(p)
    xs, ys = np.array([h[0] for h in hull]), np.array([h[1] for h in hull])
    return xs, ys


Segment = tuple[float, float, float]


def taut_string(arrivals_s: FloatArray, deadlines_s: FloatArray) -> list[Segment]:
    """Segments ``(t0, t1, work)`` of the shortest path between the arrival and deadline curves.

    The path starts at ``(0, 0)``, stays at or below ``A(t)`` (arrivals so far) and at or above
    ``D(t)`` (deadlines passed), and ends at ``(max deadline, N)``. Constraint corners: just
    before the ``j``-th arrival at most ``j`` requests are done; at the ``k``-th deadline at least
    ``k`` are.
    """
    n = len(arrivals_s)
    if n == 0:
        return []
    # Corner points in time order: ("up", t, w) caps work at w just before t; ("low", t, w) needs w.
    upper = [(float(t), float(j)) for j, t in enumerate(np.sort(arrivals_s))]
    lower = [(float(t), float(k + 1)) for k, t in enumerate(np.sort(deadlines_s))]
    events: list[tuple[float, int, float]] = [(t, 0, w) for t, w in upper]
    events += [(t, 1, w) for t, w in lower]
    events.sort()
    segments: list[Segment] = []
    t0, w0, start = 0.0, 0.0, 0
    while start < len(events):
        lo_slope, lo_at = -np.inf, -1  # steepest slope the lower corners demand
        hi_slope, hi_at = np.inf, -1  # shallowest slope the upper corners allow
        bend = -1
        for i in range(start, len(events)):
            t, kind, w = events[i]
            dt = t - t0
            if dt <= 0:
                if kind == 1 and w > w0 + 1e-12:  # work due now: infinitely steep
                    slope = np.inf
                else:
                    continue
            else:
                slope = (w - w0) / dt
            if kind == 1 and slope > lo_slope:
                if slope > hi_slope:
                    bend = hi_at
                    break
                lo_slope, lo_at = slope, i
            elif kind == 0 and slope < hi_slope:
                if slope < lo_slope:
                    bend = lo_at
                    break
                hi_slope, hi_at = slope, i
        if bend < 0:
            bend = lo_at
        if bend < 0:
            break
        t1, _, w1 = events[bend]
        if t1 > t0 or w1 > w0:
            segments.append((t0, t1, w1 - w0))
        t0, w0, start = t1, w1, bend + 1
    return segments


def oracle_energy(
    profile: GpuProfile,
    arrivals_s: FloatArray,
    deadlines_s: FloatArray,
    duration_s: float,
    concurrency: int = 2,
) -> OracleResult:
    """The lower bound described in the module docstring, in joules."""
    xs, ys = energy_hull(profile, concurrency)
    sigma_max = float(xs[-1])
    idle_j = profile.idle_power_w(profile.min_clock_mhz) * duration_s
    busy_j, infeasible = 0.0, 0.0
    segments = taut_string(arrivals_s, deadlines_s)
    for t0, t1, work in segments:
        dt = t1 - t0
        speed = work / dt if dt > 0 else np.inf
        if speed <= sigma_max:
            busy_j += float(np.interp(speed, xs, ys)) * dt
        else:
            busy_j += float(ys[-1]) / sigma_max * work
            infeasible += work
    return OracleResult(
        energy_j=idle_j + busy_j,
        idle_energy_j=idle_j,
        busy_energy_j=busy_j,
        infeasible_requests=infeasible,
        segments=len(segments),
    )
