"""A reply that streams from Triton (server-sent events), on a connection of its own.

Apart from :mod:`api.upstream` because it is made of an async generator and an async context
manager, which the compiled modules cannot hold (docs/performance.md, "The compiled request path"):
:meth:`api.upstream.Upstream.stream` builds the request and hands it here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import cast

import httptools

from api.upstream_errors import UpstreamUnavailableError

STREAM_HEADERS = ("content-type", "cache-control")
_STREAM_FORWARD = frozenset(h.encode() for h in STREAM_HEADERS)


@dataclass(frozen=True, slots=True)
class UpstreamStream:
    """A reply that arrives in pieces (server-sent events): its status, headers, and chunks."""

    status: int
    headers: dict[str, str]
    chunks: AsyncIterator[bytes]


@asynccontextmanager
async def open_stream(
    host: str, port: int, url: str, request: bytes, timeout_s: float
) -> AsyncIterator[UpstreamStream]:
    """Write ``request`` (head and body) to ``host:port`` on a new connection and yield the
    reply's status, headers and chunks; leaving the block closes the connection."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            _, conn = await loop.create_connection(_StreamConnection, host, port)
    except (OSError, TimeoutError) as err:
        raise UpstreamUnavailableError(f"{url} is unavailable: {err}") from err
    try:
        assert conn.transport is not None
        conn.transport.write(request)
        try:
            async with asyncio.timeout(timeout_s):
                status, out = await conn.head
        except TimeoutError:
            raise UpstreamUnavailableError(
                f"{url} is unavailable: no answer in {timeout_s:g} s"
            ) from None
        yield UpstreamStream(status, out, _read(conn, timeout_s))
    finally:
        conn.close()


class _StreamConnection(asyncio.Protocol):
    """A connection of its own for one streamed reply: its head, then its chunks as they come
    (None at the end); closed after, so that a stream cut short ends upstream too."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.head: asyncio.Future[tuple[int, dict[str, str]]] = (
            asyncio.get_running_loop().create_future()
        )
        self.chunks: asyncio.Queue[bytes | UpstreamUnavailableError | None] = asyncio.Queue()
        self._headers: dict[str, str] = {}
        self._done = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(UpstreamUnavailableError(f"a reply from Triton that is not HTTP: {err}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._done:
            self._fail(UpstreamUnavailableError(f"the upstream closed the stream: {exc or 'EOF'}"))

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in _STREAM_FORWARD:
            self._headers[name.decode("latin-1")] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if not self.head.done():
            self.head.set_result((self.parser.get_status_code(), self._headers))

    def on_body(self, body: bytes) -> None:
        self.chunks.put_nowait(body)

    def on_message_complete(self) -> None:
        self._done = True
        self.chunks.put_nowait(None)

    def _fail(self, error: UpstreamUnavailableError) -> None:
        self._done = True
        if not self.head.done():
            self.head.set_exception(error)
        self.chunks.put_nowait(error)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def _read(conn: _StreamConnection, timeout_s: float) -> AsyncIterator[bytes]:
    while True:
        try:
            async with asyncio.timeout(timeout_s):
                chunk = await conn.chunks.get()
        except TimeoutError:
            raise UpstreamUnavailableError(f"no chunk of the stream in {timeout_s:g} s") from None
        if chunk is None:
            return
        if isinstance(chunk, UpstreamUnavailableError):
            raise chunk
        yield chunk
