"""The best single clock in hindsight, found online: a class's recent arrivals replayed at
fixed clocks through a simple model of Triton's dispatch, on the model's latency table.

An operator who locks the GPU at one clock picks, after the fact, the lowest clock whose p99
meets the SLO on the arrivals that came. The policy sees every arrival, so it can ask the same
question of the last few thousand of them while they come: :func:`replay_tail` runs them
through one GPU at one clock (each execution takes every request waiting when the GPU frees,
up to the largest batch, as Triton's dynamic batcher does with nothing held back) with the
table's mean time for the batch plus a spread, and gives the ``quantile`` of ``latency / SLO``;
:class:`ClockReplay` finds the lowest clock where that meets a goal.

The spread is the table's: a gamma law of mean zero through the table's p90 and p99 margins
over the mean (a right-skewed spread, slow outliers rarer but farther than fast ones, as
measured), drawn once on a fixed grid of quantiles in a fixed order, so that the replay is
deterministic and two clocks are compared on the same draws.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from scipy import stats

FloatArray = npt.NDArray[np.float64]
NOISE_POINTS = 512  # draws of the spread, reused in turn
NORMAL_RATIO = 2.3263 / 1.2816  # p99 over p90 of a normal law: the lightest tail fitted


def spread_draws_ms(p90_ms: float, p99_ms: float, points: int = NOISE_POINTS) -> FloatArray:
    """``points`` draws (a quantile grid in a fixed shuffled order) of a gamma law of mean
    zero whose p90 and p99 are ``p90_ms`` and ``p99_ms``; zeros without a spread."""
    if not (p99_ms > 0.0 and p90_ms > 0.0):
        return np.zeros(points)
    ratio = max(p99_ms / p90_ms, NORMAL_RATIO * 1.001)

    def shape_ratio(k: float) -> float:
        return float(
            (stats.gamma.ppf(0.99, k) - k) / max(stats.gamma.ppf(0.9, k) - k, 1e-12)
        )

    lo, hi = 0.05, 400.0  # the ratio falls as the shape grows (towards the normal law's)
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if shape_ratio(mid) > ratio:
            lo = mid
        else:
            hi = mid
    k = math.sqrt(lo * hi)
    theta = p99_ms / (float(stats.gamma.ppf(0.99, k)) - k)
    grid = (np.arange(points) + 0.5) / points
    draws: FloatArray = theta * (stats.gamma.ppf(grid, k) - k)
    return np.random.default_rng(0).permutation(draws)


def replay_tail(
    arrivals_s: Sequence[float],
    slos_ms: Sequence[float],
    times_ms: Sequence[float],
    spread_ms: Sequence[float],
    quantile: float,
    instances: int = 1,
) -> float:
    """The ``quantile`` of ``latency / SLO`` of ``arrivals_s`` (ascending) run at one clock.

    ``times_ms[b]`` is the mean time of an execution of ``b`` requests there (row 0 unused).
    Up to ``instances`` executions run at once, each taking every request waiting when it
    starts (up to the largest batch); instances running together use the GPU as one batch of
    their combined size would (the simulator's assumption for concurrent kernels, see
    :func:`dvfs.simulated.shared_time_ms`), so each goes at the speed of that batch. Each
    execution takes ``spread_ms[j]`` more than its mean (in turn, never under 0.3 of it), as a
    share of its work."""
    n = len(arrivals_s)
    if n == 0:
        return 0.0
    max_batch = len(times_ms) - 1
    ratios = [0.0] * n
    m = len(spread_ms)
    # running executions: [first request, end (exclusive), work left in ms at batch 1 speed
    # scale: the fraction of the execution left times its work factor]
    running: list[list[float]] = []
    together = 0  # requests running
    now_s = arrivals_s[0]
    i = j = 0  # i: the first request not started; j: draws used
    while i < n or running:
        # start what can start now
        while len(running) < instances and i < n and arrivals_s[i] <= now_s:
            k = bisect.bisect_right(arrivals_s, now_s, i, min(n, i + max_batch))
            b = k - i
            mean_ms = times_ms[b]
            run_ms = mean_ms + spread_ms[j % m]
            j += 1
            factor = (run_ms if run_ms > 0.3 * mean_ms else 0.3 * mean_ms) / mean_ms
            running.append([i, k, factor])  # factor: work left, in units of t(f, together)
            together += b
            i = k
        if not running:
            now_s = arrivals_s[i]
            continue
        # every execution goes at the speed of one batch of all running requests
        unit_s = times_ms[min(together, max_batch)] / 1000.0
        first = min(running, key=lambda e: e[2])
        done_s = now_s + first[2] * unit_s
        if i < n and len(running) < instances and arrivals_s[i] < done_s:
            step = (arrivals_s[i] - now_s) / unit_s
            for e in running:
                e[2] -= step
            now_s = arrivals_s[i]
            continue
        step = first[2]
        for e in running:
            e[2] -= step
        now_s = done_s
        start, end = int(first[0]), int(first[1])
        for r in range(start, end):
            ratios[r] = (now_s - arrivals_s[r]) * 1000.0 / slos_ms[r]
        running.remove(first)
        together -= end - start
    ratios.sort()
    return ratios[min(n - 1, int(math.ceil(quantile * n)) - 1)]


class ClockReplay:
    """One model's recent arrivals (at most ``window`` of them) and the lowest clock at which
    they, replayed (:func:`replay_tail`), meet a goal."""

    def __init__(self, window: int) -> None:
        self.arrivals_s: deque[float] = deque(maxlen=window)
        self.slos_ms: deque[float] = deque(maxlen=window)
        self.index: int | None = None  # the last clock found (index into the plan's clocks)

    def add(self, arrival_s: float, slo_ms: float) -> None:
        self.arrivals_s.append(arrival_s)
        self.slos_ms.append(slo_ms)

    def lowest_index(
        self,
        times_ms: FloatArray,
        spread_ms: FloatArray,
        quantile: float,
        goal: float,
        lowest: int = 0,
        instances: int = 1,
    ) -> int:
        """The lowest clock (index into ``times_ms``'s columns, at least ``lowest``) whose
        replayed ``quantile`` of ``latency / SLO`` is at most ``goal`` (the top clock where
        none is): a walk from the last one found, a few replays when the load moved little."""
        arrivals = list(self.arrivals_s)
        if len(arrivals) > 1 and any(b < a for a, b in zip(arrivals, arrivals[1:], strict=False)):
            order = sorted(range(len(arrivals)), key=arrivals.__getitem__)
            arrivals = [arrivals[i] for i in order]
            slos = [self.slos_ms[i] for i in order]
        else:
            slos = list(self.slos_ms)
        top = times_ms.shape[1] - 1
        columns = {i: times_ms[:, i].tolist() for i in range(top + 1)}
        spread = spread_ms.tolist()

        def meets(i: int) -> bool:
            return replay_tail(arrivals, slos, columns[i], spread, quantile, instances) <= goal

        i = min(max(self.index if self.index is not None else top, lowest), top)
        if meets(i):
            step = 1
            while i > lowest:
                down = max(lowest, i - step)
                if not meets(down):
                    if step == 1:
                        break
                    step = 1  # overshot: walk back one at a time from where it met
                    continue
                i, step = down, step * 2
        else:
            step = 1
            while i < top:
                up = min(top, i + step)
                if meets(up):
                    # the lowest meeting clock is in (i, up]: bisect
                    lo, hi = i + 1, up
                    while lo < hi:
                        mid = (lo + hi) // 2
                        if meets(mid):
                            hi = mid
                        else:
                            lo = mid + 1
                    i = hi
                    break
                i, step = up, step * 2
            else:
                i = top
        self.index = i
        return i
