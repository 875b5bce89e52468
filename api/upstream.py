"""The connection to Triton: pooled keep-alive HTTP/1.1 connections; bodies pass through as bytes.

A client of its own, small: an asyncio protocol per connection with httptools' C parser (the one
uvicorn already brings) reading the replies. A request is one write of its head and body, a reply
is parsed in C and only the headers worth forwarding are kept as text. A general-purpose client
(request and response objects, header multidicts, a cookie jar, tracing hooks) costs several
times that per request, and the request path pays it at every inference.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections import deque
from collections.abc import Awaitable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from functools import partial
from typing import cast
from urllib.parse import quote, urlsplit

import httptools
from mypy_extensions import mypyc_attr

from api.upstream_errors import UpstreamUnavailableError
from api.upstream_stream import UpstreamStream, open_stream

FORWARD_HEADERS = (
    "content-type",
    "inference-header-content-length",
    "accept-encoding",
    "content-encoding",
)
_SAFE_TARGET = re.compile(r"[A-Za-z0-9/_.~-]*")  # a path sent as is; anything else is quoted


class _StaleError(UpstreamUnavailableError):
    """A kept-alive connection closed before any of the reply came: Triton had closed it."""


@dataclass(slots=True)  # not frozen: built per request, and cheaper so
class UpstreamResponse:
    """A reply: its status, body and the headers kept; when the request was written and when
    the reply's headers had all come (monotonic seconds; what a load generator reports as the
    client's send and receive)."""

    status: int
    body: bytes
    headers: dict[str, str]
    sent_s: float = math.nan
    headers_s: float = math.nan

    @property
    def ok(self) -> bool:
        return self.status == 200


class _Connection(asyncio.Protocol):
    """One keep-alive connection to Triton, one request at a time."""

    def __init__(self, generation: int, keep: frozenset[bytes]) -> None:
        # Made in the loop it serves (a protocol factory's call), looked up once: asyncio's
        # lookup asks the OS for the process id at every call on Python 3.11 (a system call).
        self.loop = asyncio.get_running_loop()
        self.generation = generation
        self.keep = keep  # the reply's headers kept (lower case)
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[UpstreamResponse] | None = None
        self.used = False  # has answered a request before (so it may have gone stale)
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._sent_s = self._headers_s = math.nan
        self._got_bytes = False
        self._headers_done = False
        self._delimited = False  # the reply says where it ends (a length, or chunks)

    def send(self, data: bytes, body: bytes) -> asyncio.Future[UpstreamResponse]:
        assert self.transport is not None and self.waiter is None
        self.waiter = self.loop.create_future()
        if len(body) > 65536:
            self.transport.writelines((data, body))  # no copy of a large body
        else:
            self.transport.write(data + body)
        self._sent_s = time.monotonic()
        return self.waiter

    def abort(self, error: UpstreamUnavailableError) -> None:
        """Fail the request under way and drop the connection (its reply may still come)."""
        self._fail(error)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self.abort(UpstreamUnavailableError(f"a reply from Triton that is not HTTP: {err}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is None:
            return
        if self._headers_done and not self._delimited:  # a body that ends with the connection
            self.on_message_complete()
        elif not self._got_bytes and self.used:
            self._fail(_StaleError("Triton closed a kept-alive connection"))
        else:
            self._fail(UpstreamUnavailableError(f"Triton closed the connection: {exc or 'EOF'}"))

    # -- httptools callbacks ------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in self.keep:
            self._headers[name.decode("latin-1")] = value.decode("latin-1")
        elif name in (b"content-length", b"transfer-encoding"):
            self._delimited = True

    def on_headers_complete(self) -> None:
        self._headers_done = True
        self._headers_s = time.monotonic()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        keep_alive = self.parser.should_keep_alive() and not self.closed
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        response = UpstreamResponse(status, body, self._headers, self._sent_s, self._headers_s)
        self._reset()
        self.used = True
        waiter, self.waiter = self.waiter, None
        if not keep_alive:
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    def _fail(self, error: UpstreamUnavailableError) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)


@mypyc_attr(allow_interpreted_subclasses=True)  # fakes of Triton in the tests and benchmarks
class Upstream:
    """A Triton server at ``host:port``: up to ``max_connections`` kept-alive connections;
    of each reply's headers, those named in ``keep_headers`` are kept (the ones the sidecar
    passes on, by default)."""

    def __init__(
        self,
        url: str,
        *,
        max_connections: int = 64,
        timeout_s: float = 300.0,
        keep_headers: Iterable[str] = FORWARD_HEADERS,
    ) -> None:
        self._keep = frozenset(h.lower().encode("latin-1") for h in keep_headers)
        self._max_connections = max_connections
        self._timeout_s = timeout_s
        self._idle: list[_Connection] = []
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._open_count = 0  # connections open or opening
        self._generation = 0  # a retarget or a close leaves older connections unused
        self._closed = True
        self._set_url(url)

    def _set_url(self, url: str) -> None:
        self.url = url if url.startswith("http") else f"http://{url}"
        parts = urlsplit(self.url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"Triton's URL must be http://host:port, got {url!r}")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._host_line = f"host: {parts.netloc}\r\n"

    async def open(self) -> None:
        """Take requests from now on (connections open as requests need them)."""
        self._closed = False

    async def retarget(self, url: str) -> None:
        """Talk to Triton at ``url`` from now on (the embedded one restarted on new ports)."""
        new_url = url if url.startswith("http") else f"http://{url}"
        if new_url == self.url and not self._closed:
            return
        self._drop_connections()
        self._set_url(url)
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        self._drop_connections()

    def _drop_connections(self) -> None:
        self._generation += 1
        for conn in self._idle:
            conn.close()
            self._open_count -= 1
        self._idle.clear()

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> UpstreamResponse:
        """Send one request; :class:`UpstreamUnavailableError` when Triton cannot be reached
        (or does not answer within ``timeout_s``, default the client's)."""
        return await self.begin(method, path, body, headers, timeout_s=timeout_s)

    def begin(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> Awaitable[UpstreamResponse]:
        """Start one request and return its reply to await, as :meth:`request` answers it.

        When a kept-alive connection is idle the request is written before this returns, so
        that a caller which awaits the reply in a task of its own has it on its way to Triton
        before that task first runs (one turn of the event loop, on every request's latency);
        otherwise it is written once a connection is open, while the reply is awaited. A
        header that cannot be sent raises :class:`UpstreamUnavailableError` here."""
        head = self._head(method, path, body, headers)
        timeout = self._timeout_s if timeout_s is None else timeout_s
        conn = None if self._closed else self._take_idle()
        if conn is None:
            return self._exchange(head, body, timeout)
        return self._exchange(
            head, body, timeout, conn.used, self._start(conn, head, body, timeout)
        )

    async def _exchange(
        self,
        head: bytes,
        body: bytes,
        timeout_s: float,
        reused: bool = False,
        reply: asyncio.Future[UpstreamResponse] | None = None,
    ) -> UpstreamResponse:
        """The reply to ``head`` and ``body``: ``reply``, when already written on a connection
        (``reused``: one that had answered before), else written on one acquired here."""
        if reply is None and self._closed:
            raise UpstreamUnavailableError("the connection to Triton is closed")
        while True:
            if reply is None:
                conn = await self._acquire(timeout_s)
                reused, reply = conn.used, self._start(conn, head, body, timeout_s)
            try:
                return await reply
            except _StaleError:
                if not reused:
                    raise
                # Triton closed it while it sat idle; nothing was read: send on a fresh one.
                reply = None

    def stream(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> AbstractAsyncContextManager[UpstreamStream]:
        """Send one request whose reply streams, on a connection of its own: chunks as they
        come, each due within the client's timeout; leaving the block closes the connection,
        which tells the upstream that nobody reads any more (:mod:`api.upstream_stream`)."""
        if self._closed:
            raise UpstreamUnavailableError("the connection to Triton is closed")
        request = self._head(method, path, body, headers) + body
        return open_stream(self._host, self._port, self.url, request, self._timeout_s)

    def _head(self, method: str, path: str, body: bytes, headers: dict[str, str] | None) -> bytes:
        target = path if _SAFE_TARGET.fullmatch(path) else quote(path, safe="/")
        lines = [f"{method} {target} HTTP/1.1\r\n", self._host_line]
        if body or method not in ("GET", "HEAD"):
            lines.append(f"content-length: {len(body)}\r\n")
        if headers:
            for name, value in headers.items():
                if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                    raise UpstreamUnavailableError(f"header {name!r} cannot be sent on")
                lines.append(f"{name}: {value}\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("latin-1")

    def _start(
        self, conn: _Connection, head: bytes, body: bytes, timeout_s: float
    ) -> asyncio.Future[UpstreamResponse]:
        """Write one request on ``conn``; the connection goes back to the pool (or is closed)
        when its reply has come, failed, or been given up on (a cancelled reply: what comes
        after belongs to no one, so the connection is closed)."""
        reply = conn.send(head, body)
        timer = conn.loop.call_later(
            timeout_s,
            conn.abort,
            UpstreamUnavailableError(
                f"Triton at {self.url} is unavailable: no answer in {timeout_s:g} s"
            ),
        )
        reply.add_done_callback(partial(self._ended, conn, timer))
        return reply

    def _ended(
        self,
        conn: _Connection,
        timer: asyncio.TimerHandle,
        _: asyncio.Future[UpstreamResponse],
    ) -> None:
        timer.cancel()
        self._release(conn)

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
            self._open_count -= 1
        return None

    async def _acquire(self, timeout_s: float) -> _Connection:
        while True:
            conn = self._take_idle()
            if conn is not None:
                return conn
            if self._open_count < self._max_connections:
                return await self._connect(timeout_s)
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():
                    waiter.cancel()

    async def _connect(self, timeout_s: float) -> _Connection:
        self._open_count += 1
        generation = self._generation
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(generation, self._keep), self._host, self._port
                )
        except (OSError, TimeoutError) as err:
            self._open_count -= 1
            self._wake()
            raise UpstreamUnavailableError(f"Triton at {self.url} is unavailable: {err}") from err
        except BaseException:
            self._open_count -= 1
            self._wake()
            raise
        return conn

    def _release(self, conn: _Connection) -> None:
        if conn.closed or conn.waiter is not None or conn.generation != self._generation:
            conn.close()
            self._open_count -= 1
        else:
            self._idle.append(conn)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
