"""Clock policies: each decides, at the core's events, which clock the GPU should run at.

A policy returns a clock (MHz) to set, or None for "no change". ``initial_clock_mhz`` None means
"leave the clock to the GPU" (the device is reset, not locked).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from scheduler.request import Request
from time2clock.table import InverseLinearFit, Time2ClockTable

if TYPE_CHECKING:
    from scheduler.core import Scheduler


class ClockPolicy(ABC):
    """One way of choosing the clock; see each subclass for which."""

    name: ClassVar[str]

    def __init__(self, table: Time2ClockTable, clocks_mhz: list[int]) -> None:
        self.table = table
        self.clocks_mhz = sorted(clocks_mhz)
        self.fit: InverseLinearFit = table.mean_fit  # predicts when an in-flight request ends

    @abstractmethod
    def initial_clock_mhz(self) -> int | None:
        """The clock to start at; None leaves clocks to the GPU."""

    def on_enqueue(self, s: Scheduler, request: Request, now_s: float) -> int | None:
        return None

    def on_dispatch(self, s: Scheduler, request: Request, now_s: float) -> int | None:
        return None

    def on_complete(self, s: Scheduler, request: Request, now_s: float) -> int | None:
        return None

    def poll(self, s: Scheduler, now_s: float) -> int | None:
        """Called when :meth:`wake_at_s` falls due."""
        return None

    def wake_at_s(self) -> float | None:
        """When this policy wants :meth:`poll` called, if at all."""
        return None

    def _snap_up(self, clock_mhz: float) -> int:
        """The lowest ladder clock at or above ``clock_mhz`` (the top one if none)."""
        for c in self.clocks_mhz:
            if c >= clock_mhz:
                return c
        return self.clocks_mhz[-1]


class MaxPolicy(ClockPolicy):
    """Lock the top clock: what a latency-first deployment does today."""

    name = "max"

    def initial_clock_mhz(self) -> int | None:
        return self.clocks_mhz[-1]


class DefaultPolicy(ClockPolicy):
    """Leave clocks to the GPU's own boost logic (simulated: top while busy, bottom when idle)."""

    name = "default"

    def initial_clock_mhz(self) -> int | None:
        return None


class SeedPolicy(ClockPolicy):
    """Seed 003 exactly as written.

    Before enqueue: the lowest clock at which a request with the current queue ahead of it meets
    its SLO, from the time2clock mean fit (``ceil((Q+1)/C)·y(f) ≤ SLO``). At dequeue: queue delay
    so far + expected time at the current clock; if that breaks the SLO, raise the clock one step,
    meaning the clock it would pick for a queue one longer, and at least the next clock up.
    """

    name = "seed"

    def __init__(self, table: Time2ClockTable, clocks_mhz: list[int]) -> None:
        super().__init__(table, clocks_mhz)
        self.current_mhz = self.clocks_mhz[0]

    def initial_clock_mhz(self) -> int | None:
        return self.current_mhz

    def on_enqueue(self, s: Scheduler, request: Request, now_s: float) -> int | None:
        ahead = s.queue_len - 1
        clock, _ = self.table.clock_for_queue(request.slo_ms, ahead, s.config.max_inflight)
        self.current_mhz = self._snap_up(clock)
        return self.current_mhz

    def on_dispatch(self, s: Scheduler, request: Request, now_s: float) -> int | None:
        delay_ms = (now_s - request.arrival_s) * 1000.0
        if delay_ms + self.table.predict_ms(self.current_mhz) <= request.slo_ms:
            return None
        longer, _ = self.table.clock_for_queue(
            request.slo_ms, s.queue_len + 1, s.config.max_inflight
        )
        next_up = self._snap_up(self.current_mhz + 1)
        self.current_mhz = self._snap_up(max(longer, next_up))
        return self.current_mhz


@dataclass(frozen=True)
class SlackParams:
    """Knobs of :class:`SlackPolicy`; the defaults are argued in its docstring."""

    quantile: str = "p99"
    lookahead: int = 16
    hold_s: float = 0.05
    safety: float = 0.95
    change_delay_ms: float = 5.0


class SlackPolicy(ClockPolicy):
    """Ours: the lowest clock at which every queued request still meets its own deadline.

    What it fixes in seed 003 (tails over the SLO on GPUs with wide spread, clocks set too low):

    * **Every request, its own deadline.** Requests are walked in dispatch order (the queue's own
      order, priority and CFS included). With ``C`` slots whose earliest free times are
      ``a_1 ≤ … ≤ a_C`` (in-flight requests' predicted ends), the ``k``-th request finishes at
      ``a_(k mod C) + (k div C + 1)·y(f)``; each gives a budget for ``y``, and the tightest
      budget sets the clock, in closed form from the fit. The first ``lookahead`` requests are
      walked exactly; the rest are bounded together by the earliest deadline among them at the
      last position (conservative; 16 covers every queue the matrix sees below saturation).
    * **The tail, not the mean.** ``y`` is the table's p99 fit, so a request that draws a slow
      sample still fits; and ``safety`` (0.95) keeps 5% of each budget back for what the model
      does not know (clock-change delay, jitter of the host).
    * **Never below the energy-optimal clock.** Below it a slower clock costs more energy per
      inference, not less; the floor is the table's measured optimum.
    * **Up at once, down after ``hold_s``.** A higher clock is set immediately; a lower one only
      after it has been enough for ``hold_s`` (50 ms, about 5-7 service times on these GPUs),
      so a momentary lull does not cost a clock change and a slow request right after it.
    """

    name = "slack"

    def __init__(
        self, table: Time2ClockTable, clocks_mhz: list[int], params: SlackParams | None = None
    ) -> None:
        super().__init__(table, clocks_mhz)
        self.params = params or SlackParams()
        self.fit = table.fit_for(self.params.quantile)
        optimum = table.energy_optimal_clock_mhz()
        self.floor_mhz = self._snap_up(optimum) if optimum is not None else self.clocks_mhz[0]
        self.current_mhz = self.floor_mhz
        self._lower_since_s: float | None = None

    def initial_clock_mhz(self) -> int | None:
        return self.current_mhz

    def budget_ms(self, s: Scheduler, now_s: float) -> float:
        """The longest per-request time ``y`` at which every request still meets its deadline.

        In-flight request ``i`` has ``u_i`` of its work left and needs ``u_i·y ≤ d_i − now``.
        Queued request ``k`` (dispatch order) goes to lane ``k mod C`` after ``k div C`` others,
        so it needs ``(u_lane + k div C + 1)·y ≤ d_k − now`` (lanes by work left; free = 0).
        """
        c = s.config.max_inflight
        inflight = s.inflight_work_left(now_s)
        lanes = [u for u, _ in inflight] + [0.0] * (c - len(inflight))
        lanes.sort()
        budget_ms = math.inf
        for u, deadline_s in inflight:
            budget_ms = min(budget_ms, (deadline_s - now_s) * 1000.0 / u)
        k = 0
        for request in s.iter_queue(self.params.lookahead):
            units = lanes[k % c] + k // c + 1
            budget_ms = min(budget_ms, (request.deadline_s - now_s) * 1000.0 / units)
            k += 1
        if s.queue_len > k:
            earliest = s.earliest_deadline_s()
            assert earliest is not None
            units = lanes[-1] + math.ceil(s.queue_len / c)
            budget_ms = min(budget_ms, (earliest - now_s) * 1000.0 / units)
        return budget_ms

    def target_mhz(self, s: Scheduler, now_s: float) -> int:
        """The clock the queue and the in-flight requests need now (before hysteresis)."""
        if not s.queue_len and not s.inflight:
            return self.floor_mhz
        budget_ms = self.budget_ms(s, now_s)
        clock, _ = self.fit.clock_for_budget_mhz(budget_ms * self.params.safety, self.clocks_mhz)
        if clock > self.current_mhz:
            # A raise lands change_delay_ms late; until then work goes at the current speed.
            budget_ms -= self.params.change_delay_ms
            clock, _ = self.fit.clock_for_budget_mhz(
                budget_ms * self.params.safety, self.clocks_mhz
            )
        return max(clock, self.floor_mhz)

    def _decide(self, s: Scheduler, now_s: float) -> int | None:
        target = self.target_mhz(s, now_s)
        if target > self.current_mhz:
            self._lower_since_s = None
            self.current_mhz = target
            return target
        if target == self.current_mhz:
            self._lower_since_s = None
            return None
        if self._lower_since_s is None:
            self._lower_since_s = now_s
            return None
        if now_s >= self._lower_since_s + self.params.hold_s:  # the same sum as wake_at_s
            self._lower_since_s = None
            self.current_mhz = target
            return target
        return None

    def on_enqueue(self, s: Scheduler, request: Request, now_s: float) -> int | None:
        return self._decide(s, now_s)

    def on_dispatch(self, s: Scheduler, request: Request, now_s: float) -> int | None:
        return self._decide(s, now_s)

    def on_complete(self, s: Scheduler, request: Request, now_s: float) -> int | None:
        return self._decide(s, now_s)

    def poll(self, s: Scheduler, now_s: float) -> int | None:
        return self._decide(s, now_s)

    def wake_at_s(self) -> float | None:
        if self._lower_since_s is None:
            return None
        return self._lower_since_s + self.params.hold_s


POLICIES: dict[str, type[ClockPolicy]] = {
    p.name: p for p in (MaxPolicy, DefaultPolicy, SeedPolicy, SlackPolicy)
}


def make_policy(name: str, table: Time2ClockTable, clocks_mhz: list[int]) -> ClockPolicy:
    """The policy called ``name``; ValueError lists the known ones."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    return cls(table, clocks_mhz)
