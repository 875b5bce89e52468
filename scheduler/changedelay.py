"""The clock-change delay a GPU shows, learned from the raises the sidecar makes.

The policies plan every raise as landing ``change_delay_ms`` after they ask for it. What a GPU
takes is not known in advance (5 ms is an assumption, ``dvfs/profiles.py``), and planning with
less than it takes puts the tail over the SLO (docs/simulator.md, "The clock-change delay"). So
the sidecar times some of its own raises, from when the policy asked to when the GPU's reading
shows the clock (:func:`dvfs.clockdelay.time_landing` live; the simulated GPU's own landing in
the simulator), and plans with the ``quantile`` (p90, nearest rank) of the last ``window`` it
timed, from the first (``min_samples``): while it plans with too short a delay, a request that
arrives to a GPU below the clock it needs may pass its SLO, and at a low load the first seconds
of those can spend the whole share of misses a p99 allows in a run (docs/simulator.md). With few
samples the p90 is their largest, so one slow outlier raises the figure until ten more have
come; the first ``warmup`` raises are timed one after another to get there soon.

The figure configured is the least the policies plan with: a measured delay within
``tolerance_ms`` of it (what a reading polled every half millisecond from another thread adds
to the delay) leaves it as it is, a longer one replaces it. One raise is timed at a time, after
the warm-up at most one every ``every_s``; a raise the reading never shows (an idle GPU may rest
below its locked clock) counts as not landed, and the next is timed ``backoff`` times later.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from scheduler.policies import ClockPolicy


@dataclass(frozen=True)
class ChangeDelayParams:
    """How the delay is learned (module docstring)."""

    window: int = 64
    quantile: float = 0.9
    min_samples: int = 1
    warmup: int = 8
    tolerance_ms: float = 1.0
    every_s: float = 0.1
    backoff: float = 20.0

    def __post_init__(self) -> None:
        if self.window < 1 or not 1 <= self.min_samples <= self.window:
            raise ValueError("need window >= 1 and 1 <= min_samples <= window")
        if not 0.0 < self.quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1], got {self.quantile}")
        if self.tolerance_ms < 0 or self.every_s < 0 or self.backoff < 1 or self.warmup < 0:
            raise ValueError("need tolerance_ms >= 0, every_s >= 0, backoff >= 1, warmup >= 0")


class ChangeDelays:
    """The raises timed on one GPU, and the delay the policy should plan with."""

    def __init__(self, params: ChangeDelayParams | None = None) -> None:
        self.params = params or ChangeDelayParams()
        self._delays_ms: deque[float] = deque(maxlen=self.params.window)
        self._next_s = -math.inf  # when the next raise may be timed
        self.timed = 0  # raises timed in all (those cut short by the next change included)
        self.landed_count = 0
        self.not_landed = 0
        self._measured_ms: float | None = None
        # Whether raises are timed at all (off while the policy plans no delay).
        self.active = True

    def due(self, now_s: float) -> bool:
        """Whether a raise asked for at ``now_s`` should be timed."""
        return self.active and (self.landed_count < self.params.warmup or now_s >= self._next_s)

    def wants(self, now_s: float, locked_mhz: int | None, target_mhz: int | None) -> bool:
        """Whether to time the change from ``locked_mhz``, the clock locked last (None: none,
        or given back to the GPU), to ``target_mhz`` asked for at ``now_s``: a raise, when due
        (the caller also checks that the clock read back is not the target already)."""
        return (
            locked_mhz is not None
            and target_mhz is not None
            and target_mhz > locked_mhz
            and self.due(now_s)
        )

    def started(self, now_s: float) -> None:
        """A raise asked for at ``now_s`` is being timed."""
        self.timed += 1
        self._next_s = now_s + self.params.every_s

    def landed(self, delay_ms: float) -> None:
        """The raise timed showed on the GPU ``delay_ms`` after it was asked for."""
        if not delay_ms >= 0.0 or math.isinf(delay_ms):
            raise ValueError(f"a delay must be finite and >= 0, got {delay_ms}")
        self._delays_ms.append(delay_ms)
        self.landed_count += 1
        if len(self._delays_ms) >= self.params.min_samples:
            # nearest rank: the figure is one of the delays timed
            self._measured_ms = float(
                np.quantile(self._delays_ms, self.params.quantile, method="inverted_cdf")
            )

    def missed(self, now_s: float) -> None:
        """The raise timed (asked for at ``now_s``) never showed: time the next one later."""
        self.not_landed += 1
        self._next_s = now_s + self.params.every_s * self.params.backoff

    @property
    def measured_ms(self) -> float | None:
        """The ``quantile`` of the delays timed (None: fewer than ``min_samples``)."""
        return self._measured_ms

    def planning_ms(self, configured_ms: float) -> float:
        """What to plan a raise with, ``configured_ms`` being what the policy was given."""
        measured = self._measured_ms
        if measured is None or measured <= configured_ms + self.params.tolerance_ms:
            return configured_ms
        return measured

    def plan_for(self, policy: ClockPolicy) -> float | None:
        """Have ``policy`` plan its raises with what was learned; what it now plans with (None:
        it plans no delay, and nothing is timed while it runs)."""
        configured = policy.configured_change_delay_ms()
        self.active = configured is not None
        if configured is None:
            return None
        planned = self.planning_ms(configured)
        policy.plan_change_delay_ms(planned)
        return planned

    def state(self, configured_ms: float | None) -> dict[str, object]:
        """For the admin state: what was timed and what the policy plans with."""
        recent = list(self._delays_ms)
        return {
            "configured_ms": configured_ms,
            "planned_ms": None if configured_ms is None else self.planning_ms(configured_ms),
            "measured_ms": self._measured_ms,
            "quantile": self.params.quantile,
            "timed": self.timed,
            "landed": self.landed_count,
            "not_landed": self.not_landed,
            "recent_ms": [round(d, 3) for d in recent[-8:]],
        }
