"""A request as the scheduler sees it, and the plain decisions the core returns."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Generic, TypeVar

P = TypeVar("P")


class Request(Generic[P]):
    """One inference request.

    ``priority`` follows Triton: 1 is the highest level, larger numbers are lower levels, 0 means
    the default level. ``nice`` is −20..19 as in Linux. ``slo_ms`` is the end-to-end latency
    target measured from ``arrival_s``. ``payload`` is opaque to the scheduler (the gateway keeps
    the body and the reply channel there). ``charged_ms``: the GPU time its client's virtual
    runtime was charged when it was sent; ``charge_final``: that is its GPU time in full (its
    completion corrects nothing). A stream of tokens has its first within ``ttft_ms`` and each
    next one within ``tpot_ms``; ``prompt_tokens`` is its prompt's length (estimated at the edge).

    A plain class with its fields written out (not a dataclass): compiled, a generic dataclass
    is what mypyc cannot build (mypyc issue 827); equality is identity, as it was.
    """

    __slots__ = (
        "arrival_s",
        "charge_final",
        "charged_ms",
        "client_id",
        "dispatch_s",
        "level",
        "model",
        "nice",
        "payload",
        "priority",
        "prompt_tokens",
        "seq",
        "slo_ms",
        "tpot_ms",
        "ttft_ms",
    )

    def __init__(
        self,
        model: str,
        arrival_s: float,
        slo_ms: float,
        priority: int = 0,
        nice: int = 0,
        client_id: str = "default",
        payload: P | None = None,
        seq: int = -1,
        level: int = 0,
        dispatch_s: float = math.nan,
        charged_ms: float = 0.0,
        charge_final: bool = False,
        ttft_ms: float | None = None,
        prompt_tokens: int = 0,
        tpot_ms: float | None = None,
    ) -> None:
        self.model = model
        self.arrival_s = arrival_s
        self.slo_ms = slo_ms
        self.priority = priority
        self.nice = nice
        self.client_id = client_id
        self.payload = payload
        self.seq = seq
        self.level = level
        self.dispatch_s = dispatch_s
        self.charged_ms = charged_ms
        self.charge_final = charge_final
        self.ttft_ms = ttft_ms
        self.prompt_tokens = prompt_tokens
        self.tpot_ms = tpot_ms

    @property
    def deadline_s(self) -> float:
        return self.arrival_s + self.slo_ms / 1000.0

    def __repr__(self) -> str:
        return (
            f"Request(model={self.model!r}, seq={self.seq}, arrival_s={self.arrival_s}, "
            f"slo_ms={self.slo_ms}, priority={self.priority}, nice={self.nice}, "
            f"client_id={self.client_id!r})"
        )


@dataclass(slots=True)  # not frozen: built per request, and cheaper so
class EnqueueResult:
    """Accepted (with a sequence number) or refused (with the reason); a clock to set, if any."""

    accepted: bool
    clock_mhz: int | None = None
    reason: str | None = None


class Dispatch(Generic[P]):
    """Send ``request`` to the GPU now; set ``clock_mhz`` first when it is not None."""

    __slots__ = ("clock_mhz", "request")

    def __init__(self, request: Request[P], clock_mhz: int | None = None) -> None:
        self.request = request
        self.clock_mhz = clock_mhz


class Completion(Generic[P]):
    """A finished request and the clock to set now, if any."""

    __slots__ = ("clock_mhz", "request")

    def __init__(self, request: Request[P], clock_mhz: int | None = None) -> None:
        self.request = request
        self.clock_mhz = clock_mhz
