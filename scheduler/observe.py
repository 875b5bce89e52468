"""Live measurements of a model's execution time, found in the scheduler's own events.

The sidecar never sees Triton's batches, only when each request left and came back. One case
is clean: an *isolated execution*. A group of requests of one model sent while nothing was at
Triton (so the GPU was idle), all within ``window_s`` of the first (slack's hold lets a whole
batch go at once), at most the model's largest batch, with nothing else sent and no change of
the clock target until all of them are back. Its time, last completion − first dispatch, is
what ``time2clock.profile`` measures (an isolated execution through Triton), plus the
per-request CPU cost that profiling on an idle machine does not see: exactly what the
scheduler must plan with. A group is only a sample when the clock target had been in force for
``settle_s`` before its first dispatch (a clock change takes time to land), and never when the
clock is left to the GPU (policy ``default``: the clock is not known).
"""

from __future__ import annotations

from time2clock.online import ExecutionSample

WINDOW_S = 0.001
SETTLE_S = 0.02


class _Group:
    """The requests sent together since the GPU was last idle: a sample while not spoiled."""

    def __init__(self, model: str, clock_mhz: int, first_s: float, max_batch: int) -> None:
        self.model = model
        self.clock_mhz = clock_mhz
        self.first_s = first_s
        self.max_batch = max_batch
        self.pending: set[int] = set()
        self.size = 0
        self.spoiled = False


class ExecutionObserver:
    """Turns dispatches, completions and clock changes into :class:`ExecutionSample` s."""

    def __init__(self, *, window_s: float = WINDOW_S, settle_s: float = SETTLE_S) -> None:
        self.window_s = window_s
        self.settle_s = settle_s
        self._group: _Group | None = None
        self._inflight = 0  # requests at Triton, every model
        self._clock_since_s: float | None = -float("inf")  # None: changed, time not known yet

    def clock_changed(self, now_s: float | None) -> None:
        """The clock target changed (``now_s`` None: at a moment not known, e.g. a new policy):
        whatever is running is no longer a clean sample."""
        self._clock_since_s = now_s
        if self._group is not None:
            self._group.spoiled = True

    def on_dispatch(
        self, model: str, seq: int, clock_mhz: int | None, max_batch: int, now_s: float
    ) -> None:
        """Request ``seq`` of ``model`` was sent at ``now_s`` with ``clock_mhz`` the target."""
        if self._clock_since_s is None:
            self._clock_since_s = now_s
        group = self._group
        if self._inflight == 0:
            group = self._group = None
            settled = now_s - self._clock_since_s >= self.settle_s
            if clock_mhz is not None and settled:
                group = self._group = _Group(model, clock_mhz, now_s, max_batch)
        elif group is not None and not group.spoiled:
            joins = (
                model == group.model
                and clock_mhz == group.clock_mhz
                and now_s - group.first_s <= self.window_s
                and group.size < group.max_batch
            )
            if not joins:
                group.spoiled = True
        self._inflight += 1
        if group is not None and not group.spoiled:
            group.pending.add(seq)
            group.size += 1

    def on_complete(
        self, seq: int, now_s: float, *, measured: bool = True
    ) -> ExecutionSample | None:
        """Request ``seq`` came back (``measured`` False: it failed, or was never sent); the
        sample, when this completes a clean group."""
        self._inflight = max(0, self._inflight - 1)
        group = self._group
        if group is None or seq not in group.pending:
            return None
        group.pending.discard(seq)
        if not measured:
            group.spoiled = True
        if group.pending:
            return None
        self._group = None
        if group.spoiled:
            return None
        return ExecutionSample(
            group.model, group.clock_mhz, group.size, (now_s - group.first_s) * 1000.0, now_s
        )
