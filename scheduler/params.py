"""The scheduler's and its policies' settings: plain frozen dataclasses, apart from the code
that runs per request (which ``setup.py`` compiles), so that they stay what the config tree
reads (their fields' annotations, their defaults as class attributes) and what the simulator
extends, compiled or not. Each is imported from where it is used too (``scheduler.core``,
``scheduler.policies``, ``scheduler.feedback``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from time2clock.table import TAIL_QUANTILES


@dataclass(frozen=True)
class SchedulerConfig:
    """Bounds of one GPU's scheduler.

    ``max_inflight``: a cap on the requests at Triton at once, over every model; how many the
    scheduler actually releases of a model is ``triton_batches`` of its full batches
    (:meth:`Scheduler.release_depth`), or what the policy asks for below it, or less while a
    higher priority level must not wait behind more (:mod:`scheduler.waitbound`). Whatever is
    not at Triton waits in the sidecar's queue, where priority, nice weights, deadlines and
    cancellation still decide; Triton runs what it holds as it batches it, and a running batch
    is never preempted.

    ``triton_batches_alone``: the full batches kept at Triton instead (never fewer than
    ``triton_batches``) while one nice value alone arrived lately (``GUARD_S``) and either one
    priority level alone (:attr:`scheduler.waitbound.WaitBound.one_level`) or one model alone,
    whose Triton batcher has priority levels that keep the levels arriving apart (the
    sidecar sends each request's level as Triton's ``priority``, so a higher level's request
    is batched before the lower ones waiting there): no level waits behind what Triton holds
    beyond what the wait bound allows, and no weights have shares to keep. A second batch
    ready at Triton keeps the GPU busy through the round trip of the first through the
    sidecar, and lets several instances each run a full batch.

    ``priority_levels``: levels 1..N (1 highest); a request with priority 0 goes to
    ``default_priority_level`` (default: N, the lowest), as in Triton's model configuration.
    """

    max_inflight: int = 256
    max_queue: int = 1000
    priority_levels: int = 2
    default_priority_level: int | None = None
    default_slo_ms: float = 100.0
    triton_batches: int = 1
    triton_batches_alone: int = 2

    def __post_init__(self) -> None:
        if min(self.max_inflight, self.max_queue, self.priority_levels, self.triton_batches) < 1:
            raise ValueError(
                "max_inflight, max_queue, priority_levels and triton_batches must all be >= 1"
            )
        if self.triton_batches_alone < 1:
            raise ValueError("triton_batches_alone must be >= 1")
        level = self.default_level
        if not 1 <= level <= self.priority_levels:
            raise ValueError(f"default_priority_level must be in 1..{self.priority_levels}")

    @property
    def default_level(self) -> int:
        return (
            self.priority_levels
            if self.default_priority_level is None
            else self.default_priority_level
        )

    def level_of(self, priority: int) -> int:
        """The level a request's ``priority`` puts it in (Triton's rule: 0 means the default)."""
        return priority or self.default_level


@dataclass(frozen=True)
class SlackParams:
    """Knobs of :class:`SlackPolicy`; the defaults are argued in its docstring and measured by
    ``python -m scheduler tune``. ``learn_change_delay``: the sidecar (and the simulator) time
    the GPU's clock changes and the policy plans with what they take where that is longer than
    ``change_delay_ms`` (:mod:`scheduler.changedelay`)."""

    batch_hold: float = 0.25
    quantile: str = "p99"
    lookahead: int = 16
    phantoms: int = 16
    hold_s: float = 0.05
    safety: float = 0.95
    change_delay_ms: float = 5.0
    arrival_quantile: float = 0.05
    phantom_margin: float = 1.0
    hold_while_busy: bool = False
    learn_change_delay: bool = True

    def __post_init__(self) -> None:
        if self.quantile not in ("mean", *TAIL_QUANTILES):
            raise ValueError(
                f"quantile must be one of mean, {', '.join(TAIL_QUANTILES)}, got {self.quantile!r}"
            )
        if not (0.0 < self.safety <= 1.0 and 0.0 <= self.batch_hold <= 1.0):
            raise ValueError("need 0 < safety <= 1 and 0 <= batch_hold <= 1")
        if not 0.0 < self.arrival_quantile < 1.0:
            raise ValueError(f"arrival_quantile must be in (0, 1), got {self.arrival_quantile}")
        if min(self.lookahead, self.phantoms) < 0 or min(self.hold_s, self.change_delay_ms) < 0:
            raise ValueError("lookahead, phantoms, hold_s and change_delay_ms must be >= 0")
        if not self.phantom_margin > 0:
            raise ValueError(f"phantom_margin must be > 0, got {self.phantom_margin}")


@dataclass(frozen=True)
class FeedbackParams:
    """Knobs of ``adaptive``: its tail controller (:class:`TailController`), its idle clock and
    its energy floor (:mod:`scheduler.adaptive`).

    ``idle_depth``: how deep the clock may drop while the GPU is idle, as the most its next
    request may lose to the clock change (a share of the tightest SLO). ``idle_power_w`` and
    ``idle_power_top_w``: the GPU's power when idle at its lowest and at its top clock, if
    known; the energy floor then counts only the energy a request adds above idle (a slower
    clock shortens the idle time it replaces), and the idle clock weighs what idling lower saves
    against what the wake-up costs. ``floor_tolerance``: the floor is the lowest clock whose
    estimated energy is within this share of the least; 0, the default, takes the clock of least
    energy itself (the estimate already counts the batch the load forms at each clock, so a
    tolerance only trades energy for a lower clock). ``phantoms``: the plan's arrivals to come
    (one: the next, which may queue behind the request running; see :mod:`scheduler.adaptive`).
    ``raise_quantile``: the quantile of execution times the plan raises the clock for (the
    controller measures the tail, so the plan raises for the mean). ``batch_hold``: the longest
    a model's requests may be held for a fuller batch, as a share of their SLO (a hold also ends
    in time for the setpoint at the energy floor, with the table's p99 margin and a clock change
    for the raise, none where the GPU rests at or above the floor while holding);
    ``hold_while_busy``: hold them while the model's earlier batch runs too (what arrives
    meanwhile would otherwise run nearly alone beside it); ``rest_while_holding``: drop to the
    idle clock while every model waiting is held back (nothing runs until a hold ends).
    ``start_queue``: a new class starts at the top clock where no clock runs this many requests
    back to back (one waiting behind another) within the setpoint with the table's p99 margin:
    an SLO that leaves no room for a queue at any lower clock (1: only where one request alone
    does not fit; elsewhere a class starts where one request alone meets the setpoint).
    ``young_descent``: while a class has seen fewer than ``young_completions`` completions, it
    walks down this many times faster while far below the setpoint (as ``fast_descent`` does
    after), so that a class started high, or pushed up by its first near misses, comes down
    within its first thousand requests rather than over minutes.
    ``overshoot``: how far past the top clock (in log speed) the level may run while even the
    top leaves near misses (see the module docstring). ``quiet_s``: a class with no completion
    for this long no longer keeps the idle clock up (its tail was measured under load that has
    gone). ``count_drop``: the energy floor counts what a busy period's end costs at each clock
    (the GPU idles there until the drop to the idle clock lands, a clock change later), where
    the idle power at the top clock is known. ``rare_wakes``: a quiet class's requests may wake
    the GPU from as deep as their SLO alone allows only while they are fewer than the share of
    misses ``target`` allows; more, and they reach the tail the class measures, so they keep the
    room its base speed leaves (as a class that is not quiet does).
    """

    target: float = 0.99
    setpoint: float = 0.97
    gain: float = 0.05
    settled_gain: float = 0.025
    settle_completions: int = 1000
    far_below: float = 0.8
    fast_descent: float = 1.0
    young_descent: float = 4.0
    young_completions: int = 1000
    start_queue: int = 2
    min_samples: int = 20
    window_s: float = 10.0
    max_samples: int = 2000
    idle_depth: float = 1.0
    idle_power_w: float | None = None
    idle_power_top_w: float | None = None
    floor_tolerance: float = 0.0
    phantoms: int = 1
    overshoot: float = 0.1
    quiet_s: float = 0.25
    raise_quantile: str = "mean"
    batch_hold: float = 0.8
    hold_while_busy: bool = True
    rest_while_holding: bool = True
    count_drop: bool = True
    rare_wakes: bool = True

    def __post_init__(self) -> None:
        if not 0.5 <= self.target < 1.0:
            raise ValueError(f"target attainment must be in [0.5, 1), got {self.target}")
        if not 0.0 < self.setpoint <= 1.0:
            raise ValueError(f"setpoint must be in (0, 1], got {self.setpoint}")
        if not 0.0 < self.gain < 1.0:
            raise ValueError(f"gain must be in (0, 1), got {self.gain}")
        if not 0.0 < self.settled_gain <= self.gain:
            raise ValueError(
                f"settled_gain must be in (0, gain], got {self.settled_gain} (gain {self.gain})"
            )
        if self.settle_completions < 1:
            raise ValueError(f"settle_completions must be >= 1, got {self.settle_completions}")
        if not 0.0 <= self.idle_depth <= 1.0:
            raise ValueError(f"idle_depth must be in [0, 1], got {self.idle_depth}")
        if self.min_samples < 0 or self.phantoms < 0 or self.young_completions < 0:
            raise ValueError("min_samples, phantoms and young_completions must be >= 0")
        if not min(self.fast_descent, self.young_descent) >= 1.0:
            raise ValueError(
                "fast_descent and young_descent must be >= 1 (1: no faster), got "
                f"{self.fast_descent} and {self.young_descent}"
            )
        if self.start_queue < 1:
            raise ValueError(f"start_queue must be >= 1, got {self.start_queue}")

    def gain_at(self, completions: int) -> float:
        """The controller's step at a class's ``completions``-th completion (see the module
        docstring: ``gain · √(settle_completions / n)``, never under ``settled_gain``)."""
        return max(self.settled_gain, self.gain * math.sqrt(self.settle_completions / completions))


@dataclass(frozen=True)
class ScaleParams:
    """Knobs of :class:`ScaleController` (see its docstring)."""

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
    horizon_s: float = 0.0  # the miss budget is also kept over this long (0: the window only)

    def __post_init__(self) -> None:
        if self.horizon_s < 0:
            raise ValueError(f"horizon_s must be >= 0 (0: off), got {self.horizon_s}")
        if not 0.5 <= self.target < 1.0:
            raise ValueError(f"target attainment must be in [0.5, 1), got {self.target}")
        if not 0.0 < self.setpoint <= 1.0:
            raise ValueError(f"setpoint must be in (0, 1], got {self.setpoint}")
        if not 0.0 < self.min_scale <= self.start_scale <= self.max_scale:
            raise ValueError("need 0 < min_scale <= start_scale <= max_scale")
        if not 0.0 < self.backoff < 1.0:
            raise ValueError(f"backoff must be in (0, 1), got {self.backoff}")
