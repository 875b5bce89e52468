"""Streams of tokens through the sidecar: relayed as they come, timed token by token.

A streamed reply (Triton's ``generate_stream``, an OpenAI-compatible engine's ``stream: true``)
is a sequence of server-sent events, one per response of the model (a token, or a few). The
dispatcher keeps the request in flight for as long as its stream runs (a sequence in the engine);
the :class:`Relay` hands each chunk to the front end as it arrives, unchanged unless a
``transform`` re-frames it (the OpenAI front end in front of Triton), and the :class:`TokenMeter`
measures the time to the first token and between tokens, the figures a token SLO is about.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from api.dispatcher import Answer
from api.metrics import GatewayMetrics
from api.upstream import Upstream

DONE_EVENT = b"data: [DONE]"


def split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete server-sent events in ``buffer`` (without their blank-line ends), and the rest."""
    events: list[bytes] = []
    while True:
        end = buffer.find(b"\n\n")
        cut = 2
        crlf = buffer.find(b"\r\n\r\n")
        if crlf != -1 and (end == -1 or crlf < end):
            end, cut = crlf, 4
        if end == -1:
            return events, buffer
        events.append(buffer[:end])
        buffer = buffer[end + cut :]


TokenSlos = tuple[float | None, float | None]  # (ttft_ms, tpot_ms)


def token_slos(params: Any, headers: Mapping[str, str] | None = None) -> TokenSlos:
    """A stream's ``ttft_ms`` and ``tpot_ms`` from its parameters (or ``x-*`` headers), read
    leniently: admission checks them, and refuses the request before any token when bad."""
    slos: dict[str, float | None] = {"ttft_ms": None, "tpot_ms": None}
    if not isinstance(params, Mapping):
        params = {}
    for key in slos:
        value = params.get(key)
        if value is None and headers is not None:
            value = headers.get("x-" + key.replace("_", "-"))
        try:
            number = float(value) if value is not None else None
        except (TypeError, ValueError):
            number = None
        slos[key] = number if number is not None and number > 0 else None
    return slos["ttft_ms"], slos["tpot_ms"]


class TokenMeter:
    """Times one stream's tokens: each server-sent ``data:`` event (but ``[DONE]``) is one."""

    def __init__(
        self,
        *,
        arrival_s: float,
        metrics: GatewayMetrics,
        model_label: str,
        slos: TokenSlos = (None, None),
        time_source: Callable[[], float] = time.monotonic,
    ) -> None:
        self.arrival_s = arrival_s
        self.metrics = metrics
        self.model_label = model_label
        self.ttft_ms, self.tpot_ms = slos
        self._now = time_source
        self._pending = b""
        self._listeners: list[Callable[[float], None]] = []
        self.tokens = 0
        self.first_s: float | None = None
        self.last_s: float | None = None

    def listen(self, listener: Callable[[float], None]) -> None:
        """Call ``listener(now_s)`` at every token from now on (the scheduler's policy)."""
        self._listeners.append(listener)

    def feed(self, chunk: bytes) -> None:
        """Count the events that ``chunk`` completes."""
        events, self._pending = split_events(self._pending + chunk)
        for event in events:
            if b"data:" in event and not event.startswith(DONE_EVENT):
                self.on_token(self._now())

    def on_token(self, now_s: float) -> None:
        m = self.metrics
        if self.last_s is None:
            self.first_s = now_s
            m.ttft.labels(self.model_label).observe(now_s - self.arrival_s)
        else:
            m.inter_token.labels(self.model_label).observe(now_s - self.last_s)
        self.last_s = now_s
        self.tokens += 1
        m.output_tokens.labels(self.model_label).inc()
        for listener in self._listeners:
            listener(now_s)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_s is None else self.first_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (None with fewer than two)."""
        if self.first_s is None or self.last_s is None or self.tokens < 2:
            return None
        return (self.last_s - self.first_s) / (self.tokens - 1)

    def finish(self) -> None:
        """The stream ended: count its token SLOs as met or not."""
        for name, slo_ms, measured in (
            ("ttft", self.ttft_ms, self.ttft_s),
            ("tpot", self.tpot_ms, self.tpot_s),
        ):
            if slo_ms is None or measured is None:
                continue
            met = "true" if measured * 1000.0 <= slo_ms else "false"
            self.metrics.token_slo.labels(self.model_label, name, met).inc()


@dataclass(frozen=True, slots=True)
class StreamAnswer:
    """How a stream ended upstream: its status (200: it ran to its end)."""

    status: int
    tokens: int

    @property
    def ok(self) -> bool:
        return self.status == 200


Event = tuple[str, Any]  # ("start", (status, headers)) | ("chunk", bytes) | ("end", None)


class Reframer(Protocol):
    """Re-frames a stream's bytes for another protocol (the OpenAI front end over Triton's)."""

    def feed(self, chunk: bytes) -> bytes:
        """What to send for ``chunk`` (possibly nothing until an event is complete)."""

    def close(self) -> bytes:
        """What to send once the stream has ended."""


class Relay:
    """Chunks of one stream, from the dispatcher's send to the front end that writes them."""

    def __init__(self, transform: Reframer | None = None) -> None:
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.transform = transform

    def start(self, status: int, headers: dict[str, str]) -> None:
        self.events.put_nowait(("start", (status, headers)))

    def chunk(self, data: bytes, *, ok: bool = True) -> None:
        if self.transform is not None and ok:
            data = self.transform.feed(data)
        if data:
            self.events.put_nowait(("chunk", data))

    def end(self, *, ok: bool = True) -> None:
        tail = self.transform.close() if self.transform is not None and ok else b""
        self.events.put_nowait(("end", tail))


def stream_send(
    path: str, body: bytes, headers: dict[str, str], relay: Relay, meter: TokenMeter
) -> Callable[[Upstream], Awaitable[Answer]]:
    """A ``send`` that streams the reply to ``relay`` as it comes, timing its tokens."""

    async def send(upstream: Upstream) -> Answer:
        status = 0
        try:
            async with upstream.stream("POST", path, body, headers) as reply:
                status = reply.status
                relay.start(status, reply.headers)
                async for chunk in reply.chunks:
                    if status == 200:
                        meter.feed(chunk)
                    relay.chunk(chunk, ok=status == 200)
            if status == 200:
                meter.finish()
        finally:
            if status:
                relay.end(ok=status == 200)
        return StreamAnswer(status, meter.tokens)

    return send
