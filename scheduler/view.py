"""What a clock policy may read of the scheduler: a small read-only protocol.

Policies decide from this view and return a clock; they never touch the queue or the in-flight
set. :class:`scheduler.core.Scheduler` satisfies it; a test can hand a policy anything that does.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
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
    """How Triton serves one model: its largest batch, and how many instances run it.

    ``depth`` is the most requests worth having at Triton at once: every instance busy with a
    full batch and the next full batch waiting behind it, so that Triton's dynamic batcher is
    never starved while the sidecar's answer to a completion is on its way.
    """

    max_batch: int = 1
    instances: int = 1
    # A decoupled model (an LLM engine batching continuously): the sequences it may run at
    # once; 0 for a model that answers each request once.
    streams: int = 0

    def __post_init__(self) -> None:
        if self.streams < 0:
            raise ValueError(f"streams must be >= 0, got {self.streams}")
        if self.max_batch < 1 or self.instances < 1:
            raise ValueError(
                f"max_batch and instances must be >= 1, got {self.max_batch}, {self.instances}"
            )

    @property
    def depth(self) -> int:
        if self.streams:
            return self.streams
        return (self.instances + 1) * self.max_batch


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

    def iter_queue(self, limit: int) -> Iterator[QueuedRequest]: ...

    def earliest_deadline_s(self) -> float | None: ...

    def inflight_by_model(self) -> Mapping[str, list[QueuedRequest]]: ...

    def queued_by_model(self) -> Mapping[str, int]: ...

    def queued_of(self, model: str) -> Sequence[QueuedRequest]: ...

    def inflight_count(self, model: str) -> int: ...

    def arrival_rates_rps(self, now_s: float) -> dict[str, float]: ...

    def last_slo_ms(self, model: str) -> float: ...

    def last_completion_s(self, model: str) -> float: ...
