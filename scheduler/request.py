"""A request as the scheduler sees it, and the plain decisions the core returns."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Generic, TypeVar

P = TypeVar("P")


@dataclass(slots=True, eq=False)
class Request(Generic[P]):
    """One inference request.

    ``priority`` follows Triton: 1 is the highest level, larger numbers are lower levels, 0 means
    the default level. ``nice`` is −20..19 as in Linux. ``slo_ms`` is the end-to-end latency
    target measured from ``arrival_s``. ``payload`` is opaque to the scheduler (the gateway keeps
    the body and the reply channel there).
    """

    model: str
    arrival_s: float
    slo_ms: float
    priority: int = 0
    nice: int = 0
    client_id: str = "default"
    payload: P | None = None
    seq: int = -1
    level: int = 0
    dispatch_s: float = math.nan
    charged_ms: float = 0.0  # GPU time its client's virtual runtime was charged when sent
    charge_final: bool = False  # charged_ms is its GPU time in full: completion corrects nothing
    ttft_ms: float | None = None  # a stream of tokens: its first within this
    prompt_tokens: int = 0  # a generative request: its prompt's length (estimated at the edge)
    tpot_ms: float | None = None  # and each next one within this

    @property
    def deadline_s(self) -> float:
        return self.arrival_s + self.slo_ms / 1000.0


@dataclass(slots=True)  # not frozen: built per request, and cheaper so
class EnqueueResult:
    """Accepted (with a sequence number) or refused (with the reason); a clock to set, if any."""

    accepted: bool
    clock_mhz: int | None = None
    reason: str | None = None


@dataclass(slots=True)  # not frozen: built per request, and cheaper so
class Dispatch(Generic[P]):
    """Send ``request`` to the GPU now; set ``clock_mhz`` first when it is not None."""

    request: Request[P]
    clock_mhz: int | None = None


@dataclass(slots=True)  # not frozen: built per request, and cheaper so
class Completion(Generic[P]):
    """A finished request and the clock to set now, if any."""

    request: Request[P]
    clock_mhz: int | None = None
