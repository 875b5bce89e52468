"""What a clock policy may read of the scheduler: a small read-only protocol.

Policies decide from this view and return a clock; they never touch the queue or the in-flight
set. :class:`scheduler.core.Scheduler` satisfies it; a test can hand a policy anything that does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from time2clock.table import ModelTable, TableSet


class QueuedRequest(Protocol):
    """The read-only face of a request."""

    @property
    def model(self) -> str: ...

    @property
    def seq(self) -> int: ...

    @property
    def arrival_s(self) -> float: ...

    @property
    def slo_ms(self) -> float: ...

    @property
    def deadline_s(self) -> float: ...

    @property
    def dispatch_s(self) -> float: ...

    @property
    def prompt_tokens(self) -> int: ...


@dataclass(frozen=True)
class ModelServing:
    """How Triton serves one model: its largest batch, how many instances run it, and its
    dynamic batcher's priority levels (``dynamic_batching.priority_levels``; 0: none, Triton
    serves the model's queue first come, first served). How many of its requests the sidecar
    keeps at Triton is :meth:`scheduler.core.Scheduler.release_depth`."""

    max_batch: int = 1
    instances: int = 1
    # A decoupled model (an LLM engine batching continuously): the sequences it may run at
    # once; 0 for a model that answers each request once.
    streams: int = 0
    priority_levels: int = 0
    default_priority_level: int = 0

    def __post_init__(self) -> None:
        if self.streams < 0:
            raise ValueError(f"streams must be >= 0, got {self.streams}")
        if self.max_batch < 1 or self.instances < 1:
            raise ValueError(
                f"max_batch and instances must be >= 1, got {self.max_batch}, {self.instances}"
            )
        if not 0 <= self.default_priority_level <= self.priority_levels:
            raise ValueError(
                f"priority_levels must be >= 0 and default_priority_level in "
                f"0..priority_levels, got {self.priority_levels}, {self.default_priority_level}"
            )

    def triton_priority(self, level: int) -> int | None:
        """The ``priority`` to send Triton for a request of the sidecar's ``level`` (1 the
        highest): the same level, the lowest of Triton's where the sidecar has more; None when
        the model has no priority levels (Triton would ignore it)."""
        if self.priority_levels < 1:
            return None
        return min(level, self.priority_levels)

    def orders(self, levels: tuple[int, ...]) -> bool:
        """Whether Triton's batcher serves requests of these sidecar ``levels`` apart, the
        higher first: the model has priority levels and no two of ``levels`` share one."""
        sent = {self.triton_priority(level) for level in levels}
        return None not in sent and len(sent) == len(levels)


class SchedulerView(Protocol):
    """Everything a policy reads; nothing it could change."""

    @property
    def tables(self) -> TableSet: ...

    @property
    def max_inflight(self) -> int: ...

    @property
    def queue_len(self) -> int: ...

    @property
    def clock_target_mhz(self) -> int | None: ...

    def table_for(self, model: str) -> ModelTable | None: ...

    def serving(self, model: str) -> ModelServing: ...

    def release_depth(self, model: str, now_s: float | None = None) -> int: ...

    def iter_queue(self, limit: int) -> Sequence[QueuedRequest]: ...

    def earliest_deadline_s(self) -> float | None: ...

    def inflight_by_model(self) -> Mapping[str, list[QueuedRequest]]: ...

    def queued_by_model(self) -> Mapping[str, int]: ...

    def queued_of(self, model: str) -> Sequence[QueuedRequest]: ...

    def inflight_count(self, model: str) -> int: ...

    def arrival_rates_rps(self, now_s: float) -> Mapping[str, float]: ...

    def last_slo_ms(self, model: str) -> float: ...

    def last_completion_s(self, model: str) -> float: ...

    def energy_floor_mhz(self, floor_mhz: int, now_s: float) -> int: ...
