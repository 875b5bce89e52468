"""Closing the loop on the tail: a controller that holds one SLO class's tail at a setpoint by
moving the speed the class asks of the GPU.

The analytical plan (:class:`scheduler.policies.SlackPolicy`) knows the mean time of every
execution at every clock, but not the tail a GPU, a load and its own clock changes produce
together: its fixed margins are right for the worst case and leave much of the SLO unused
elsewhere. This controller measures what the GPU actually achieves and moves the **base
speed** of the class: the clock below which it never runs the class's requests, as a speed
relative to the top clock's (``exp(level)``, 1 = the top clock). The plan still raises the
clock above the base at once when a queue needs it.

What it holds: the ``target`` quantile (0.99) of ``latency / SLO`` at ``setpoint`` (0.95). It is
a stochastic-approximation quantile tracker (Robbins-Monro): every completion over the setpoint
(a *near miss*) raises the level by ``gain · target``, every other completion lowers it by
``gain · (1 − target)``. The level stands still exactly where near misses are ``1 − target``
of the completions, whatever the load, the GPU's spread or the table's errors; no window to
estimate a p99 from a handful of samples.

* **Up fast, down slowly.** With the defaults a near miss speeds the class up by 5%, and 99
  completions inside the setpoint slow it by as much: a run of near misses is answered within
  that run, while a class with room walks its clock down a few percent a second at a hundred
  requests a second. While a hundred completions in a row stay under ``far_below`` (0.8) of
  the setpoint, the class walks down ``fast_descent`` (10) times faster: far from the
  setpoint a step costs nothing.
* **No wind-up.** The policy passes the lowest level worth running at (its energy floor): the
  level never sinks below it, so a class that sat at the floor with room to spare has no
  credit to lose when the load comes back, and the level never rises past the top clock.
* **Judged on enough.** The first ``min_samples`` completions of a class (and of a class
  rebased after a new table) move nothing.
* **A quiet class keeps its level**: nothing moves without completions.

For reports, the controller also keeps a sliding window (``window_s``, at most
``max_samples``) of ``latency / SLO``: its attainment and its ``target`` quantile. Time is
always passed in (``now_s``), so tests drive it with injected time.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FeedbackParams:
    """Knobs of ``adaptive``: its tail controller (:class:`TailController`), its idle clock and
    its energy floor (:mod:`scheduler.adaptive`).

    ``idle_depth``: how deep the clock may drop while the GPU is idle, as the most its next
    request may lose to the clock change (a share of the tightest SLO). ``idle_power_w`` and
    ``idle_power_top_w``: the GPU's power when idle at its lowest and at its top clock, if
    known; the energy floor then counts only the energy a request adds above idle (a slower
    clock shortens the idle time it replaces), and the idle clock weighs what idling lower
    saves against what the wake-up costs. ``floor_tolerance``: the floor is the lowest clock
    whose estimated energy is within this share of the least (lower clocks form bigger batches
    than the estimate counts). ``phantoms``: the plan's
    arrivals to come. ``raise_quantile``: the quantile of execution times the plan raises the
    clock for (the controller measures the tail, so the plan raises for the mean);
    ``batch_hold``: how long a model's requests may be held for a fuller batch, as a share of
    their SLO (``slack``'s, with the table's p99 margin).
    """

    target: float = 0.99
    setpoint: float = 0.95
    gain: float = 0.05
    far_below: float = 0.8
    fast_descent: float = 10.0
    min_samples: int = 20
    window_s: float = 10.0
    max_samples: int = 2000
    idle_depth: float = 0.2
    idle_power_w: float | None = None
    idle_power_top_w: float | None = None
    floor_tolerance: float = 0.05
    phantoms: int = 0
    raise_quantile: str = "mean"
    batch_hold: float = 0.4
    hold_while_busy: bool = False
    rest_while_holding: bool = False

    def __post_init__(self) -> None:
        if not 0.5 <= self.target < 1.0:
            raise ValueError(f"target attainment must be in [0.5, 1), got {self.target}")
        if not 0.0 < self.setpoint <= 1.0:
            raise ValueError(f"setpoint must be in (0, 1], got {self.setpoint}")
        if not 0.0 < self.gain < 1.0:
            raise ValueError(f"gain must be in (0, 1), got {self.gain}")
        if not 0.0 <= self.idle_depth <= 1.0:
            raise ValueError(f"idle_depth must be in [0, 1], got {self.idle_depth}")
        if self.min_samples < 0 or self.phantoms < 0:
            raise ValueError("min_samples and phantoms must be >= 0")


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
        return math.exp(self.level)

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
        if near:
            self.level += p.gain * p.target
        else:
            # Far below the setpoint for as many completions as the target quantile needs
            # to see one past it: the tail has room to spare, walk down faster.
            far = self._since_high >= 1.0 / (1.0 - p.target)
            self.level -= p.gain * (1.0 - p.target) * (p.fast_descent if far else 1.0)
        self.level = min(0.0, max(self.level, min(floor_level, 0.0)))
        return self.level > before

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
