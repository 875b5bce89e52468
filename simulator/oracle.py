"""A lower bound on the energy any policy (clock and batching) could spend on given arrivals and
deadlines.

The model. Treat the GPU, running one model, as one processor whose operating points are every
(clock ``f``, batch ``b``) pair: speed ``σ(f, b) = b / t(f, b)`` requests per second (a batch of
``b`` taking the mean ``t(f, b)``), drawing ``P(f, b)``. Every instant of any schedule is either
idle (power ≥ ``P_idle_min``, the idle power at the lowest clock) or busy at some operating point,
doing work at a rate ≤ its ``σ``. Write the power above ``P_idle_min`` as a function of speed and
take the **lower convex hull** ``Q̂(σ)`` of the points ``(0, 0)`` (idle) and ``(σ(f, b),
P(f, b) − P_idle_min)`` for every clock on the ladder and every batch up to the model's largest.
``Q̂`` is what mixing operating points (or running fast then idling) can achieve at best; it is
convex and non-decreasing, and no instant of any schedule costs less than ``Q̂`` of its speed.

The bound. A schedule that meets every deadline must, for every time ``t``, have done at least
``D(t)`` requests (those whose deadline is ≤ ``t``) and at most ``A(t)`` (those that have
arrived). The cumulative work curve that minimises ``∫ Q̂(σ(t)) dt`` between these two curves is
the **taut string** from ``(0, 0)`` to ``(T, N)`` (for any convex ``Q̂``; with one SLO for all
requests the deadlines are agreeable and this is exactly Yao-Demers-Shenker's optimum, with mixed
SLOs the two curves are a relaxation, so the bound stays a bound). Hence

    E(any deadline-meeting schedule) ≥ P_idle_min · duration + ∫ Q̂(σ_string(t)) dt = oracle.

Several models. The GPU's busy time is shared: whatever share a model gets, its busy energy is
at least what its own bound needs with the whole timeline to itself (less time only forces
faster, costlier points, ``Q̂`` being convex), and busy energies above the idle floor add up over
time-shared executions. So the bound is ``P_idle_min · duration`` plus the sum of each model's
busy bound on its own arrivals and deadlines.

Why it is a lower bound and not an estimate: every relaxation goes the oracle's way: no
clock-change delay, perfect knowledge of arrivals, the speed of any batch size at any moment
(even a full batch with one request waiting: the work is treated as fluid), mixing operating
points for free, idle power at the lowest clock, and the mean service time (with random service
times the bound holds in expectation). Where even the fastest point cannot meet the deadlines,
that stretch is charged at the fastest point's energy per request and marked infeasible.

The batch-window bound. The string lets any instant run a full batch, even when one request is
waiting: at low load it prices every request at a full batch's energy, which no schedule can
form. A second bound counts what batches can be formed. At any instant the requests of a model
running on the GPU (its batches on every instance together, which run as one batch of their
combined size would) have all arrived and, in a schedule that meets every deadline, are not yet
due: there are at most ``L(τ)``, the model's requests live at ``τ`` (arrived, deadline not
passed). Request ``i`` runs inside ``[a_i, d_i]``, so always in an execution of at most
``L_i = max L(τ)`` over that window, and each unit of its work costs at least
``c(L_i) = min over f and b ≤ L_i of (P(f, b) − P_idle_min)·t(f, b)/b`` above the idle floor
(time-shared models draw their own power in turn, as above). Hence the busy energy is at least
``Σ work_i · c(L_i)``. Both bounds hold for every model; each model's busy bound is the larger of
the two, and the oracle is ``P_idle_min · duration`` plus their sum.

The clairvoyant bound. Given ``work`` (each request's actual work: the service time it drew
over the mean, as the simulator records it), the arrival and deadline curves count work, not
requests: a request that drew twice the mean time counts twice. That bound knows each request's
service time in advance, so it holds for the run as drawn, not only in expectation; the gap
between it and a policy is the price of not knowing the future (arrivals and service times),
and the gap between a policy's margins and it the price of the spread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dvfs.profiles import GpuProfile
from simulator.workload import FloatArray


@dataclass(frozen=True)
class OracleResult:
    energy_j: float
    idle_energy_j: float
    busy_energy_j: float
    infeasible_requests: float
    segments: int
    string_busy_j: float = 0.0  # the taut string's busy bound, every model together
    window_busy_j: float = 0.0  # the batch-window bound's


def energy_hull(profile: GpuProfile, model: str | None = None) -> tuple[FloatArray, FloatArray]:
    """Breakpoints ``(σ in requests/s, Q̂ in W)`` of the lower convex hull, from ``(0, 0)``."""
    idle = profile.idle_power_w(profile.min_clock_mhz)
    m = profile.model(model)
    pts = [(0.0, 0.0)] + [
        (b * 1000.0 / m.mean_latency_ms(f, b), m.busy_power_w(f, b) - idle)
        for f in profile.clocks_mhz
        for b in range(1, m.max_batch + 1)
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


def taut_string(
    arrivals_s: FloatArray, deadlines_s: FloatArray, work: FloatArray | None = None
) -> list[Segment]:
    """Segments ``(t0, t1, work)`` of the shortest path between the arrival and deadline curves.

    The path starts at ``(0, 0)``, stays at or below ``A(t)`` (work arrived so far) and at or
    above ``D(t)`` (work whose deadline has passed), and ends at ``(max deadline, total work)``.
    Constraint corners: just before the ``j``-th arrival at most the work of the ``j`` before it
    is done; at the ``k``-th deadline at least the work of the ``k`` first deadlines is.
    ``work`` (default: 1 each) is each request's work, in mean requests.
    """
    n = len(arrivals_s)
    if n == 0:
        return []
    weights = np.ones(n) if work is None else np.asarray(work, dtype=float)
    by_arrival, by_deadline = np.argsort(arrivals_s, kind="stable"), np.argsort(deadlines_s)
    before = np.concatenate(([0.0], np.cumsum(weights[by_arrival])[:-1]))
    due = np.cumsum(weights[by_deadline])
    # Corner points in time order: ("up", t, w) caps work at w just before t; ("low", t, w) needs w.
    upper = [(float(arrivals_s[i]), float(c)) for i, c in zip(by_arrival, before, strict=True)]
    lower = [(float(deadlines_s[i]), float(c)) for i, c in zip(by_deadline, due, strict=True)]
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


def live_batch_limits(arrivals_s: FloatArray, deadlines_s: FloatArray) -> FloatArray:
    """``L_i`` for each request: the most requests live at once (arrived, not yet due) at any
    moment between its arrival and its deadline, itself included."""
    n = len(arrivals_s)
    if n == 0:
        return np.zeros(0)
    times = np.concatenate((deadlines_s, arrivals_s))
    steps = np.concatenate((-np.ones(n), np.ones(n)))
    order = np.lexsort((steps, times))  # at equal times, deadlines first: due is not live
    live = np.cumsum(steps[order])  # requests live just after each event
    when = times[order]
    lo = np.searchsorted(when, arrivals_s, side="left")
    hi = np.searchsorted(when, deadlines_s, side="left")  # events in [a_i, d_i)
    # Range maxima over [lo, hi) from a sparse table: table[k][j] = max of live[j : j + 2^k].
    table = [live]
    while (1 << len(table)) <= len(live):
        prev, half = table[-1], 1 << (len(table) - 1)
        table.append(np.maximum(prev[:-half], prev[half:]))
    span = np.maximum(hi - lo, 1)
    k = np.floor(np.log2(span)).astype(int)
    out = np.empty(n)
    for level in np.unique(k):
        sel = k == level
        row = table[level]
        left = lo[sel]
        right = np.minimum(hi[sel] - (1 << level), len(row) - 1)
        out[sel] = np.maximum(row[np.minimum(left, len(row) - 1)], row[np.maximum(right, 0)])
    return np.maximum(out, 1.0)


def batch_costs_j(profile: GpuProfile, model: str | None = None) -> FloatArray:
    """``c(L)`` for ``L = 0..max_batch``: the least busy energy above the idle floor per
    request of any execution of at most ``L`` requests, at any clock (``c(0)`` unused)."""
    idle = profile.idle_power_w(profile.min_clock_mhz)
    m = profile.model(model)
    per_batch = np.array(
        [
            min(
                (m.busy_power_w(f, b) - idle) * m.mean_latency_ms(f, b) / 1000.0 / b
                for f in profile.clocks_mhz
            )
            for b in range(1, m.max_batch + 1)
        ]
    )
    cumulative: FloatArray = np.concatenate(([np.inf], np.minimum.accumulate(per_batch)))
    return cumulative


def window_bound_j(
    profile: GpuProfile,
    arrivals_s: FloatArray,
    deadlines_s: FloatArray,
    model: str | None = None,
    work: FloatArray | None = None,
) -> float:
    """The batch-window bound on one model's busy energy above the idle floor (see the module
    docstring)."""
    if len(arrivals_s) == 0:
        return 0.0
    costs = batch_costs_j(profile, model)
    limits = live_batch_limits(arrivals_s, deadlines_s)
    capped = np.minimum(limits, len(costs) - 1).astype(int)
    weights = np.ones(len(arrivals_s)) if work is None else np.asarray(work, dtype=float)
    return float(np.sum(weights * costs[capped]))


def oracle_energy(
    profile: GpuProfile,
    arrivals_s: FloatArray,
    deadlines_s: FloatArray,
    duration_s: float,
    models: Sequence[str] | None = None,
    work: FloatArray | None = None,
) -> OracleResult:
    """The lower bound described in the module docstring, in joules.

    ``models[i]`` is the model of request ``i`` (default: every request the GPU's CNN);
    ``work[i]`` its actual work in mean requests, for the clairvoyant bound (default: 1 each).
    """
    names = np.asarray(models if models is not None else [None] * len(arrivals_s), dtype=object)
    idle_j = profile.idle_power_w(profile.min_clock_mhz) * duration_s
    busy_j, string_j, window_j, infeasible, count = 0.0, 0.0, 0.0, 0.0, 0
    for model in dict.fromkeys(names.tolist()):
        mine = names == model
        xs, ys = energy_hull(profile, model)
        sigma_max = float(xs[-1])
        weights = None if work is None else work[mine]
        segments = taut_string(arrivals_s[mine], deadlines_s[mine], weights)
        count += len(segments)
        string = 0.0
        for t0, t1, done in segments:
            dt = t1 - t0
            speed = done / dt if dt > 0 else np.inf
            if speed <= sigma_max:
                string += float(np.interp(speed, xs, ys)) * dt
            else:
                string += float(ys[-1]) / sigma_max * done
                infeasible += done
        window = window_bound_j(profile, arrivals_s[mine], deadlines_s[mine], model, weights)
        string_j += string
        window_j += window
        busy_j += max(string, window)
    return OracleResult(
        energy_j=idle_j + busy_j,
        idle_energy_j=idle_j,
        busy_energy_j=busy_j,
        infeasible_requests=infeasible,
        segments=count,
        string_busy_j=string_j,
        window_busy_j=window_j,
    )
