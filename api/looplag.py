"""How late the event loop runs what it was asked to run: its lag, sampled.

Every request the sidecar serves goes through one event loop, so a callback that runs long (a
refit, a plan rebuilt, a large body decoded) holds up every request meanwhile, and shows in
their tail and nowhere else. A timer asks to run every ``interval_s``; how late it runs is the
loop's lag at that moment, observed into ``sidecar_event_loop_lag_seconds``. A stall of ``d``
is caught with a chance of about ``d / interval_s`` (every time past ``interval_s``), as its
remaining length; cheap at 20 wakes a second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prometheus_client import Histogram

INTERVAL_S = 0.05
LAG_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class LoopLagProbe:
    """Observes the running loop's lag into ``histogram`` every ``interval_s`` (see the module
    docstring); ``clock`` is injectable for tests."""

    def __init__(
        self,
        histogram: Histogram,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.histogram = histogram
        self.interval_s = interval_s
        self._clock = clock
        self._handle: asyncio.TimerHandle | None = None
        self._due_s = 0.0
        self.worst_s = 0.0  # the largest lag seen

    def start(self) -> None:
        self._arm(asyncio.get_running_loop())

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._due_s = self._clock() + self.interval_s
        self._handle = loop.call_later(self.interval_s, self._tick, loop)

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        lag_s = max(0.0, self._clock() - self._due_s)
        self.histogram.observe(lag_s)
        self.worst_s = max(self.worst_s, lag_s)
        self._arm(loop)
