"""The scheduling core: no I/O and no clock of its own, so one code path serves the live gateway
and the simulator. Callers pass the time (``now_s``) into every call and carry out the decisions
it returns (send this request, set this clock)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from scheduler.policies import ClockPolicy
from scheduler.queue import PriorityCfsQueue
from scheduler.request import Completion, Dispatch, EnqueueResult, Request
from scheduler.weights import NICE_MAX, NICE_MIN, weight_for_nice
from time2clock.table import Time2ClockTable

MIN_WORK_LEFT = 0.05
FAIR_FROM = 0.5
RESERVE = 0.1
RATE_WINDOW_S = 1.0


@dataclass(frozen=True)
class SchedulerConfig:
    """Bounds of one GPU's scheduler.

    ``priority_levels``: levels 1..N (1 highest); a request with priority 0 goes to
    ``default_priority_level`` (default: N, the lowest), as in Triton's model configuration.
    """

    max_inflight: int = 2
    max_queue: int = 1000
    priority_levels: int = 2
    default_priority_level: int | None = None
    default_slo_ms: float = 100.0

    def __post_init__(self) -> None:
        if self.max_inflight < 1 or self.max_queue < 1 or self.priority_levels < 1:
            raise ValueError("max_inflight, max_queue and priority_levels must all be >= 1")
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


def validate_hints(priority: int, nice: int, slo_ms: float, config: SchedulerConfig) -> str | None:
    """The problem with a request's scheduling hints, or None; names the field and its range."""
    if not 0 <= priority <= config.priority_levels:
        return (
            f"priority must be in 0..{config.priority_levels} (0 = the default level), "
            f"got {priority}"
        )
    if not NICE_MIN <= nice <= NICE_MAX:
        return f"nice must be in {NICE_MIN}..{NICE_MAX}, got {nice}"
    if not (slo_ms > 0 and math.isfinite(slo_ms)):
        return f"slo_ms must be a positive number of milliseconds, got {slo_ms}"
    return None


class Scheduler:
    """One GPU's queue, in-flight set and clock policy."""

    def __init__(
        self, table: Time2ClockTable, policy: ClockPolicy, config: SchedulerConfig | None = None
    ) -> None:
        self.table = table
        self.policy = policy
        self.config = config or SchedulerConfig()
        self.queue = PriorityCfsQueue()
        self.inflight: dict[int, Request] = {}
        self.clock_target_mhz: int | None = policy.initial_clock_mhz()
        self._seq = 0
        self._rate_rps = 0.0
        self._rate_at_s: float | None = None
        self.last_slo_ms = self.config.default_slo_ms

    def set_policy(self, policy: ClockPolicy) -> None:
        """Swap the clock policy (the admin API does this); its initial clock becomes the target."""
        self.policy = policy
        self.clock_target_mhz = policy.initial_clock_mhz()

    # -- what policies read ---------------------------------------------------------------

    @property
    def queue_len(self) -> int:
        return len(self.queue)

    def expected_ms(self) -> float:
        """Expected service time at the clock now targeted (the top clock when unmanaged)."""
        clock = self.clock_target_mhz or self.policy.clocks_mhz[-1]
        return self.table.predict_ms(clock)

    def iter_queue(self, limit: int) -> Iterator[Request]:
        return self.queue.iter_order(limit, self.expected_ms())

    def earliest_deadline_s(self) -> float | None:
        return self.queue.earliest_deadline_s()

    def arrival_rate_rps(self, now_s: float) -> float:
        """Arrivals per second, an exponentially decayed count over ``RATE_WINDOW_S``."""
        if self._rate_at_s is None:
            return 0.0
        return self._rate_rps * math.exp(-(now_s - self._rate_at_s) / RATE_WINDOW_S)

    def _count_arrival(self, now_s: float) -> None:
        self._rate_rps = self.arrival_rate_rps(now_s) + 1.0 / RATE_WINDOW_S
        self._rate_at_s = now_s

    def inflight_work_left(self, now_s: float) -> list[tuple[float, float]]:
        """``(work left, deadline_s)`` of each in-flight request, least work first.

        Work is in requests: 1.0 just dispatched, 0 done, progressing at the policy's predicted
        speed of the clock targeted at each moment (rebased at every change), and never taken
        below ``MIN_WORK_LEFT``: a request past its predicted end is still running.
        """
        return sorted((self._work_left(r, now_s), r.deadline_s) for r in self.inflight.values())

    # -- events ---------------------------------------------------------------------------

    def _clock(self, proposed: int | None, now_s: float) -> int | None:
        """Record a policy's proposal; report it only when it changes the target.

        In-flight requests are rebased: what they have left is taken at the old clock's speed
        up to now, and goes at the new clock's speed from now on.
        """
        if proposed is None or proposed == self.clock_target_mhz:
            return None
        for request in self.inflight.values():
            request.work_left = self._work_left(request, now_s)
            request.work_left_at_s = now_s
        self.clock_target_mhz = proposed
        for request in self.inflight.values():
            request.predicted_ms = self._predicted_ms()
        return proposed

    @staticmethod
    def _work_left(request: Request, now_s: float) -> float:
        done = (now_s - request.work_left_at_s) * 1000.0 / request.predicted_ms
        return max(MIN_WORK_LEFT, request.work_left - done)

    def enqueue(self, request: Request, now_s: float) -> EnqueueResult:
        """Admit ``request`` (or refuse it, with the reason) and say whether to change the clock."""
        problem = validate_hints(request.priority, request.nice, request.slo_ms, self.config)
        if problem is not None:
            return EnqueueResult(accepted=False, reason=problem)
        request.level = self.config.level_of(request.priority)
        refusal = self._admission(request)
        if refusal is not None:
            return EnqueueResult(accepted=False, reason=refusal)
        request.seq = self._seq
        self._seq += 1
        self._count_arrival(now_s)
        self.last_slo_ms = request.slo_ms
        self.queue.push(request)
        return EnqueueResult(
            accepted=True,
            clock_mhz=self._clock(self.policy.on_enqueue(self, request, now_s), now_s),
        )

    def _admission(self, request: Request) -> str | None:
        """Why ``request`` cannot be queued, or None.

        The queue holds at most ``max_queue``. Past ``FAIR_FROM`` of that, a flow that already
        has requests waiting may hold only its weight's share of ``(1 − RESERVE)·max_queue``,
        shared with the other flows that are waiting; the reserve is room for flows with
        nothing waiting (a new client, a higher priority). Without this, under overload the
        queue fills in arrival order and refusals, not CFS, decide who gets the GPU.
        Accepted requests are never evicted.
        """
        limit, waiting = self.config.max_queue, len(self.queue)
        if waiting >= limit:
            return f"queue full ({limit} requests waiting); retry later"
        mine = self.queue.queued_for(request.level, request.client_id)
        if not mine or waiting < FAIR_FROM * limit:
            return None
        weight = weight_for_nice(request.nice)
        share = weight / self.queue.backlogged_weight()
        cap = (1.0 - RESERVE) * limit * share
        if mine >= cap:
            return (
                f"client {request.client_id!r} has its fair share of the queue waiting "
                f"({mine} of {limit}, share {share:.0%} by nice {request.nice}); retry later"
            )
        return None

    def next_dispatch(self, now_s: float) -> Dispatch | None:
        """The next request to send, if a slot is free and one is waiting."""
        if len(self.inflight) >= self.config.max_inflight:
            return None
        request = self.queue.pop(self.expected_ms())
        if request is None:
            return None
        request.dispatch_s = request.work_left_at_s = now_s
        request.work_left = 1.0
        request.predicted_ms = self._predicted_ms()
        self.inflight[request.seq] = request
        clock = self._clock(self.policy.on_dispatch(self, request, now_s), now_s)
        return Dispatch(request=request, clock_mhz=clock)

    def _predicted_ms(self) -> float:
        """The policy's prediction of one request's time at the clock now targeted."""
        return self.policy.fit.predict_ms(self.clock_target_mhz or self.policy.clocks_mhz[-1])

    def on_complete(self, request: Request, service_s: float, now_s: float) -> Completion:
        """``request`` finished after ``service_s`` on the GPU."""
        if self.inflight.pop(request.seq, None) is None:
            raise KeyError(f"request {request.seq} is not in flight")
        self.queue.settle(request, service_s * 1000.0)
        return Completion(
            request=request,
            clock_mhz=self._clock(self.policy.on_complete(self, request, now_s), now_s),
        )

    def cancel(self, request: Request) -> bool:
        """Forget a waiting ``request`` (abandoned by its client, or timed out); True if it was
        waiting. A request already dispatched is not recalled: it completes as usual."""
        return self.queue.remove(request)

    def drain(self) -> list[Request]:
        """Take every waiting request out of the queue (shutting down); none is charged."""
        drained = []
        while (request := self.queue.pop(0.0)) is not None:
            self.queue.settle(request, 0.0)
            drained.append(request)
        return drained

    def poll(self, now_s: float) -> int | None:
        """Run the policy's timer (hysteresis); a clock to set, if any."""
        return self._clock(self.policy.poll(self, now_s), now_s)

    def wake_at_s(self) -> float | None:
        return self.policy.wake_at_s()
