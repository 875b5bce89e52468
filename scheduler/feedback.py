"""Closing the loop on the tail: a controller that holds one SLO class's tail at a setpoint by
moving the speed the class asks of the GPU.

The analytical plan (:class:`scheduler.policies.SlackPolicy`) knows the mean time of every
execution at every clock, but not the tail a GPU, a load and its own clock changes produce
together: its fixed margins are right for the worst case and leave much of the SLO unused
elsewhere. This controller measures what the GPU actually achieves and moves the **base
speed** of the class: the clock below which it never runs the class's requests, as a speed
relative to the top clock's (``exp(level)``, 1 = the top clock). The plan still raises the
clock above the base at once when a queue needs it.

What it holds: the ``target`` quantile (0.99) of ``latency / SLO`` at ``setpoint`` (0.97). It is
a stochastic-approximation quantile tracker (Robbins-Monro): every completion over the setpoint
(a *near miss*) raises the level by ``gain · target``, every other completion lowers it by
``gain · (1 − target)``. The level stands still exactly where near misses are ``1 − target``
of the completions, whatever the load, the GPU's spread or the table's errors; no window to
estimate a p99 from a handful of samples.

* **Up fast, down slowly.** With the defaults (at the 1,000th completion) a near miss speeds
  the class up by 5%, and 99 completions inside the setpoint slow it by as much: a run of near
  misses is answered within that run, while a class with room walks its clock down a few
  percent a second at a hundred requests a second. ``fast_descent`` (off, 1, by default):
  while a hundred completions in a row stay under ``far_below`` (0.8) of the setpoint, the
  class walks down that many times faster. Those extra steps down are paid for by extra near
  misses, so with it more than ``1 − target`` of completions pass the setpoint (the tail for
  some energy). A young class (its first ``young_completions``, 1,000) walks down that way
  ``young_descent`` (4) times faster: a class that starts high, or that its first near misses
  (taken at the largest steps) pushed up, comes down within its first thousand requests, where
  at one step per completion it would take minutes at a low rate.
* **A gain that settles.** At a class's ``n``-th completion (rebases included) the step is
  ``gain · √(settle_completions / n)``, the step size of a converging Robbins-Monro tracker,
  and never under ``settled_gain``: ``gain`` (0.05) at the 1,000th, ``settled_gain`` (0.025)
  from the 4,000th on, and larger before (seven times at the first step, the 21st): a new
  class's first near misses take it up at once (the level stops at the top clock), and a
  settled class dithers half as far around its clock, so its tail sits nearer the setpoint
  and the setpoint nearer the SLO (a settled step still answers a run of near misses within
  the run, 2.5% of speed each).
* **No wind-up.** The policy passes the lowest level worth running at (its energy floor): the
  level never sinks below it, so a class that sat at the floor with room to spare has no
  credit to lose when the load comes back.
* **Saturated at the top.** Where even the top clock leaves more than ``1 − target`` near
  misses, a level capped at the top would be walked down by every completion in between and
  run the class below the top part of the time; the level may run ``overshoot`` past the top
  (the speed asked stays the top clock's), so near misses there are answered by staying, and
  it takes that many more completions with room to come back down.
* **Judged on enough.** The first ``min_samples`` completions of a class (and of a class
  rebased after a new table) move nothing.
* **A quiet class keeps its level**: nothing moves without completions.

For reports, the controller also keeps a sliding window (``window_s``, at most
``max_samples``) of ``latency / SLO``: its attainment and its ``target`` quantile. The defaults
are listed and explained in docs/design.md ("The adaptive policy"). Time is always passed in
(``now_s``), so tests drive it with injected time.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from scheduler.params import FeedbackParams as FeedbackParams
from scheduler.params import ScaleParams as ScaleParams


class TailController:
    """One SLO class's base speed (``level``, log of a speed relative to the top clock's);
    fed every completion of the class."""

    def __init__(self, params: FeedbackParams | None = None, level: float = 0.0) -> None:
        self.params = params or FeedbackParams()
        self.level = min(0.0, level)
        self._window: deque[tuple[float, float]] = deque()
        self._seen = 0
        self._since_high = 0
        self.near_misses = 0
        self.completions = 0
        self.rebases = 0

    @property
    def scale(self) -> float:
        """The base speed over the top clock's (1: the class asks for the top clock)."""
        return math.exp(min(self.level, 0.0))

    def observe(
        self, now_s: float, latency_ms: float, slo_ms: float, floor_level: float = -math.inf
    ) -> bool:
        """Record one completion; True if the level rose (the class needs a faster clock now).
        ``floor_level``: the lowest level worth running at (the policy's energy floor)."""
        p = self.params
        ratio = latency_ms / slo_ms
        self._window.append((now_s, ratio))
        while len(self._window) > p.max_samples or self._window[0][0] < now_s - p.window_s:
            self._window.popleft()
        self.completions += 1
        self._seen += 1
        near = ratio > p.setpoint
        self.near_misses += near
        self._since_high = 0 if ratio > p.far_below * p.setpoint else self._since_high + 1
        if self._seen <= p.min_samples:
            return False
        before = self.level
        gain = p.gain_at(self.completions)
        if near:
            self.level += gain * p.target
        else:
            # Far below the setpoint for as many completions as the target quantile needs
            # to see one past it: the tail has room to spare, walk down faster.
            far = self._since_high >= 1.0 / (1.0 - p.target)
            self.level -= gain * (1.0 - p.target) * (self._descent() if far else 1.0)
        self.level = min(p.overshoot, max(self.level, min(floor_level, 0.0)))
        return self.level > before

    def _descent(self) -> float:
        """How many times faster the level walks down while far below the setpoint: a young
        class (fewer than ``young_completions``) at least ``young_descent`` times."""
        p = self.params
        if self.completions < p.young_completions:
            return max(p.fast_descent, p.young_descent)
        return p.fast_descent

    def rebase(self) -> None:
        """The plan under the level changed (a new table): judge only what completes from now
        on, after a new warm-up; the level stays."""
        self._seen = 0
        self._window.clear()
        self.rebases += 1

    def attainment(self) -> float:
        """The share of the window's completions within their SLO (nan: none)."""
        if not self._window:
            return float("nan")
        return float(np.mean([r <= 1.0 for _, r in self._window]))

    def tail_ratio(self) -> float:
        """The ``target`` quantile of latency / SLO over the window (nan with fewer than
        ``min_samples``)."""
        if len(self._window) < max(1, self.params.min_samples):
            return float("nan")
        return float(np.quantile([r for _, r in self._window], self.params.target))


class ScaleController:
    """One SLO class's scale on the deadline a plan aims at, fed every completion of the class:
    the token policy's loop (:mod:`scheduler.tokens`) on its TTFT and TPOT budgets.

    It measures ``latency / SLO`` over a sliding window (``window_s``, at most ``max_samples``)
    and scales the deadline: **back off fast** (more than the budget of misses, ``1 − target``
    of the window, since the last cut: cut by ``backoff`` at once, cuts at least
    ``backoff_gap_s`` apart, no rise for ``settle_s`` after one); **creep up slowly** (every
    ``period_s``, the window's ``target`` quantile ``q`` since the last cut against
    ``setpoint``: below it the scale grows by ``(setpoint / q) ** gain``, at most ``max_step``;
    over the SLO it falls the same way); **bounded** within ``[min_scale, max_scale]``.

    **A budget kept over a horizon** (``horizon_s``, 0: off). The window's budget alone lets
    each window spend its ``1 − target`` of misses in full, so over many windows the misses come
    to the budget and the run's ``target`` quantile sits on the SLO, over it as often as under.
    With a horizon, completions and misses are also counted over it (decayed with that time
    constant); misses past ``1 − target`` of those completions are a *debt* (counted once the
    horizon holds a full window's ``max_samples``, so that a handful of early misses does not
    set it): the debt comes off the window's budget, and while it lasts the scale does not creep
    up.
    """

    def __init__(self, params: ScaleParams | None = None) -> None:
        self.params = params or ScaleParams()
        self.scale = self.params.start_scale
        self._window: deque[tuple[float, float]] = deque()
        self._misses: deque[float] = deque()  # when the window's misses since the last cut came
        self._last_cut_s = -np.inf
        self._last_step_s: float | None = None
        self.backoffs = 0
        self.raises = 0
        self.rebases = 0
        self._seen_w = 0.0  # completions over the horizon, decayed
        self._missed_w = 0.0  # and misses
        self._seen_at_s: float | None = None

    @property
    def debt(self) -> float:
        """Misses over the horizon past its budget (``1 − target`` of its completions); none
        until the horizon holds as many completions as a full window."""
        if self._seen_w < self.params.max_samples:
            return 0.0
        return self._missed_w - (1.0 - self.params.target) * self._seen_w

    def observe(self, now_s: float, latency_ms: float, slo_ms: float) -> bool:
        """Record one completion; True if the scale changed."""
        p = self.params
        ratio = latency_ms / slo_ms
        self._window.append((now_s, ratio))
        while len(self._window) > p.max_samples or self._window[0][0] < now_s - p.window_s:
            self._window.popleft()
        if p.horizon_s > 0:
            decay = (
                1.0
                if self._seen_at_s is None
                else math.exp(-max(0.0, now_s - self._seen_at_s) / p.horizon_s)
            )
            self._seen_at_s = now_s
            self._seen_w = self._seen_w * decay + 1.0
            self._missed_w = self._missed_w * decay + (1.0 if ratio > 1.0 else 0.0)
        if ratio > 1.0:
            self._misses.append(now_s)
            while self._misses[0] < now_s - p.window_s:
                self._misses.popleft()
            budget = max(1.0, (1.0 - p.target) * len(self._window) - max(0.0, self.debt))
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
        ``at_most`` and judge only what completes from now on in the window. The horizon's
        counts, and so its debt, are kept: a miss under the old plan was a miss all the same."""
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
        if q >= p.setpoint or self.debt > 0:
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
