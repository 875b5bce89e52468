"""Closing the loop on the tail: a controller that holds one SLO class's attainment at its
target by moving the deadline the clock plan aims at.

The analytical plan (:class:`scheduler.policies.SlackPolicy`) carries fixed margins: a p99
residual per execution, phantom arrivals at the 5% quantile of a burst, 5% of every deadline.
They are right for the worst GPU and load, and leave 15-35% of the SLO unused elsewhere. The
controller measures what the plan actually achieves and scales the deadline the plan aims at,
``arrival + scale · SLO``: above 1 the plan may use the room its margins leave, below 1 it
plans tighter than the SLO (a table that is too optimistic, a model that is slower than its
profile).

What it measures: ``latency / SLO`` of each completion, over a sliding window (``window_s``, at
most ``max_samples``). What it does:

* **Back off fast.** When more than the budget of misses (``1 − target`` of the window, at
  least one) has piled up in the window since the last cut, the scale is cut at once by
  ``backoff`` (× 0.7): a run of misses is answered within that run, not a window later.
* **A burst moves it a bounded amount.** Two back-offs are at least ``backoff_gap_s`` apart,
  so one burst of misses costs one cut, not one per miss; after a cut, the scale does not rise
  for ``settle_s``.
* **Creep up slowly.** Every ``period_s``, with at least ``min_samples`` in the window, the
  window's ``target`` quantile of ``latency / SLO`` since the last cut (its p99 for the
  default 99%) is compared with ``setpoint``: below it, the scale rises by
  ``(setpoint / q) ** gain``, at most ``max_step`` per period; above 1 (the tail over the
  SLO), it falls the same way, at most to ``backoff``.
* **Bounded.** The scale stays within ``[min_scale, max_scale]``: it cannot swing the clock
  between its extremes, and a class that falls silent keeps its last scale.

The defaults are listed and explained in docs/design.md ("The adaptive policy").
Time is always passed in (``now_s``), so tests drive it with injected time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FeedbackParams:
    """Knobs of :class:`TailController`; see the module docstring for each."""

    target: float = 0.99
    setpoint: float = 0.8
    window_s: float = 10.0
    max_samples: int = 2000
    min_samples: int = 50
    period_s: float = 1.0
    gain: float = 0.5
    max_step: float = 0.1
    backoff: float = 0.7
    backoff_gap_s: float = 0.5
    settle_s: float = 3.0
    min_scale: float = 0.5
    max_scale: float = 3.0
    start_scale: float = 1.0

    def __post_init__(self) -> None:
        if not 0.5 <= self.target < 1.0:
            raise ValueError(f"target attainment must be in [0.5, 1), got {self.target}")
        if not 0.0 < self.setpoint <= 1.0:
            raise ValueError(f"setpoint must be in (0, 1], got {self.setpoint}")
        if not 0.0 < self.min_scale <= self.start_scale <= self.max_scale:
            raise ValueError("need 0 < min_scale <= start_scale <= max_scale")
        if not 0.0 < self.backoff < 1.0:
            raise ValueError(f"backoff must be in (0, 1), got {self.backoff}")


class TailController:
    """One SLO class's scale on its deadline; fed every completion of the class."""

    def __init__(self, params: FeedbackParams | None = None) -> None:
        self.params = params or FeedbackParams()
        self.scale = self.params.start_scale
        self._window: deque[tuple[float, float]] = deque()
        self._misses: deque[float] = deque()  # when the window's misses since the last cut came
        self._last_cut_s = -np.inf
        self._last_step_s: float | None = None
        self.backoffs = 0
        self.raises = 0
        self.rebases = 0

    def observe(self, now_s: float, latency_ms: float, slo_ms: float) -> bool:
        """Record one completion; True if the scale changed."""
        p = self.params
        ratio = latency_ms / slo_ms
        self._window.append((now_s, ratio))
        while len(self._window) > p.max_samples or self._window[0][0] < now_s - p.window_s:
            self._window.popleft()
        if ratio > 1.0:
            self._misses.append(now_s)
            while self._misses[0] < now_s - p.window_s:
                self._misses.popleft()
            budget = max(1.0, (1.0 - p.target) * len(self._window))
            if len(self._misses) > budget and now_s >= self._last_cut_s + p.backoff_gap_s:
                self._cut(now_s, p.backoff)
                return True
        if self._last_step_s is None:
            self._last_step_s = now_s
        if now_s < self._last_step_s + p.period_s:
            return False
        self._last_step_s = now_s
        return self._step(now_s)

    def rebase(self, at_most: float) -> None:
        """The plan under the scale changed (a new table): keep the scale no higher than
        ``at_most`` and judge only what completes from now on."""
        if self.scale > at_most:
            self.scale = at_most
            self.rebases += 1
        self._window.clear()
        self._misses.clear()

    def attainment(self) -> float:
        """The share of the window's completions within their SLO (nan: none)."""
        if not self._window:
            return float("nan")
        return float(np.mean([r <= 1.0 for _, r in self._window]))

    def tail_ratio(self) -> float:
        """The ``target`` quantile of latency / SLO over the window's completions since the
        last cut (those before it led to the cut); nan with fewer than ``min_samples``."""
        recent = [r for t, r in self._window if t >= self._last_cut_s]
        if len(recent) < self.params.min_samples:
            return float("nan")
        return float(np.quantile(recent, self.params.target))

    def _step(self, now_s: float) -> bool:
        p = self.params
        if now_s < self._last_cut_s + p.settle_s:
            return False
        q = self.tail_ratio()
        if np.isnan(q) or q <= 0:
            return False
        if q > 1.0:
            self._cut(now_s, max(p.backoff, (p.setpoint / q) ** p.gain))
            return True
        if q >= p.setpoint:
            return False
        factor = min(1.0 + p.max_step, (p.setpoint / q) ** p.gain)
        new = min(p.max_scale, self.scale * factor)
        if new == self.scale:
            return False
        self.scale = new
        self.raises += 1
        return True

    def _cut(self, now_s: float, factor: float) -> None:
        self.scale = max(self.params.min_scale, self.scale * factor)
        self._last_cut_s = now_s
        self._misses.clear()
        self.backoffs += 1
