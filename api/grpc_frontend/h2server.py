"""A gRPC server on the sidecar's own HTTP/2 (:mod:`.h2`): unary and bidirectional-streaming
calls, each handled by a coroutine of the front end's.

Per call it does what gRPC's HTTP/2 protocol asks of a server: the request's ``grpc-timeout``
becomes a deadline (past it the handler is cancelled and the client told
``DEADLINE_EXCEEDED``); ``grpc-encoding`` gzip and deflate messages are inflated (bounded);
every message is bounded from its length prefix, so one over the limit is refused with
``RESOURCE_EXHAUSTED`` as its first bytes arrive and never held whole; header lists are bounded;
the client's metadata reaches the handler (``-bin`` values as bytes) and the handler's trailing
metadata reaches the client; RST_STREAM, a connection that ends or a deadline cancels the
handler; an unknown method is ``UNIMPLEMENTED``. Replies respect the client's flow-control
windows, and a stream's handler waits while the client reads slower than it writes. Stopping
says GOAWAY, refuses new streams and lets those under way finish within a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from mypy_extensions import mypyc_attr

from api.grpc_frontend.h2 import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    MAX_CONCURRENT_STREAMS,
    MAX_HEADER_LIST_BYTES,
    MAX_HEADER_LIST_SIZE,
    NO_ERROR,
    PREFACE,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    WINDOW_MAX,
    WINDOW_UPDATE,
    Connection,
    Headers,
    ProtocolError,
    frame,
    literal,
    metadata_block,
    metadata_of,
    status_block,
)
from api.grpc_frontend.messages import (
    INFLATE_BITS,
    PREFIX,
    GrpcError,
    Metadata,
    Status,
    cut_messages,
    framed,
    inflate,
)

log = logging.getLogger(__name__)

MAX_CALLS_PER_CONNECTION = 1024
# A streaming call's replies held for a client that reads slower than the handler writes: past
# this, the handler waits.
MAX_HELD_BYTES = 1 << 20
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
# :status 200 (static index 8), then content-type: application/grpc as a literal.
REPLY_HEADERS = b"\x88" + literal("content-type", "application/grpc")
_OK_TRAILERS = status_block(Status.OK)
# Headers a handler never sees as the client's metadata (the transport's own).
TRANSPORT_HEADERS = ("te", "content-type", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding")

Unary = Callable[[bytes, "Call"], Coroutine[Any, Any, bytes]]
Streaming = Callable[[AsyncIterator[bytes], "Call"], AsyncIterator[bytes]]


def parse_timeout(value: str) -> float | None:
    """``grpc-timeout`` (up to 8 digits and a unit) in seconds; None if malformed."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * unit


class Messages:
    """The request messages of a streaming call, iterated with ``async for`` until the
    client's end (None in ``inbox``); a class, since compiled modules hold no async
    generators."""

    def __init__(self, inbox: asyncio.Queue[bytes | None]) -> None:
        self._inbox = inbox
        self._over = False

    def __aiter__(self) -> Messages:
        return self

    async def __anext__(self) -> bytes:
        if not self._over:
            message = await self._inbox.get()
            if message is not None:
                return message
            self._over = True
        raise StopAsyncIteration


@dataclass(slots=True, eq=False)
class Call:
    """One call as its handler sees it: the client's metadata and deadline, and the trailing
    metadata the handler sets for the reply."""

    stream: int
    path: str
    metadata: Metadata
    deadline_s: float | None  # time.monotonic()'s
    encoding: str | None
    trailing: Metadata = ()
    message: bytes | None = None  # a unary call's request
    inbox: asyncio.Queue[bytes | None] | None = None  # a streaming call's requests, then None
    body: bytearray = field(default_factory=bytearray)  # request bytes not yet a message
    input_open: bool = True
    headers_sent: bool = False
    received: int = 0  # DATA bytes since this stream's window was last topped up
    task: asyncio.Task[Any] | None = None
    timer: asyncio.TimerHandle | None = None

    def time_remaining(self) -> float | None:
        """Seconds left of the client's deadline, or None without one."""
        return None if self.deadline_s is None else max(0.0, self.deadline_s - time.monotonic())

    def messages(self) -> Messages:
        """A streaming call's request messages, as they arrive, until the client ends them."""
        assert self.inbox is not None
        return Messages(self.inbox)


class GrpcServer:
    """Serves ``unary`` and ``streaming`` (gRPC paths → handlers) on ``host:port``; a request
    message is bounded to ``max_message_bytes``."""

    def __init__(
        self,
        unary: Mapping[str, Unary],
        streaming: Mapping[str, Streaming],
        *,
        max_message_bytes: int,
    ) -> None:
        self.unary, self.streaming = unary, streaming
        self.max_message_bytes = max_message_bytes
        self.connections: set[GrpcConnection] = set()
        # What serves each connection: a subclass of GrpcConnection may watch or change it.
        self.connection_type: type[GrpcConnection] = GrpcConnection
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen; the port listened on (``port`` 0: a free one)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: self.connection_type(self), host, port)
        server: Any = self._server  # its sockets: uvloop's are a list, typeshed says a tuple
        self.port = int(server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self, grace_s: float) -> None:
        """Refuse new connections and streams (GOAWAY), let the calls under way finish within
        ``grace_s``, then end every connection (cancelling what is left)."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.drain()
        deadline = time.monotonic() + grace_s
        while any(c.calls for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            connection.close()
        await asyncio.sleep(0)  # connection_lost runs: the calls left are cancelled
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)


@mypyc_attr(allow_interpreted_subclasses=True)
class GrpcConnection(Connection):
    """One client's HTTP/2 connection to :class:`GrpcServer`."""

    preface_in = PREFACE

    def __init__(self, server: GrpcServer) -> None:
        super().__init__(
            {
                MAX_CONCURRENT_STREAMS: MAX_CALLS_PER_CONNECTION,
                MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_BYTES,
            }
        )
        self.server = server
        self.calls: dict[int, Call] = {}
        self._highest = 0
        self._draining = False
        self._drained: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.server.connections.discard(self)
        calls, self.calls = self.calls, {}
        for call in calls.values():
            _stop(call)
        self.flushed()

    def last_stream(self) -> int:
        return self._highest

    def in_flight(self) -> int:
        return len(self.calls) + 1  # a reply is written after its call has left ``calls``

    def drain(self) -> None:
        """GOAWAY: no new stream; those under way go on."""
        self._draining = True
        self.go_away(NO_ERROR, self._highest)
        if not self.calls:
            self.close()

    # -- frames --------------------------------------------------------------------------

    def headers_received(self, stream: int, flags: int, headers: Headers, out: list[bytes]) -> None:
        call = self.calls.get(stream)
        if call is not None:  # trailers from the client: its input ends
            if flags & END_STREAM:
                self._input_ended(call)
            return
        if stream % 2 == 0:
            raise ProtocolError(f"HEADERS opening stream {stream}, an even one")
        if stream <= self._highest:
            return  # a block for a stream already over (answered, refused or reset): dropped
        self._highest = stream
        if self._draining or len(self.calls) >= MAX_CALLS_PER_CONNECTION:
            out.append(frame(RST_STREAM, 0, stream, struct.pack(">I", REFUSED_STREAM)))
            return
        self.open_window(stream)
        path, content_type, timeout, encoding, size = "", "", "", None, 0
        for key, value in headers:
            size += len(key) + len(value) + 32  # RFC 9113 §6.5.2's measure
            if key == ":path":
                path = value
            elif key == "content-type":
                content_type = value
            elif key == "grpc-timeout":
                timeout = value
            elif key == "grpc-encoding":
                encoding = value
        if not content_type.startswith("application/grpc"):
            block = b"\x00" + literal(":status", "415")[1:]
            out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream, block))
            self._reset_if_open(stream, flags, out)
            return
        deadline_s = None
        if timeout:
            seconds = parse_timeout(timeout)
            if seconds is None:
                self._refuse(stream, flags, Status.INTERNAL, f"malformed grpc-timeout {timeout!r}")
                return
            deadline_s = time.monotonic() + seconds
        call = Call(stream, path, metadata_of(headers, TRANSPORT_HEADERS), deadline_s, encoding)
        if size > MAX_HEADER_LIST_BYTES:
            self._refuse(
                stream,
                flags,
                Status.RESOURCE_EXHAUSTED,
                f"header list of {size} bytes over the limit of {MAX_HEADER_LIST_BYTES}",
            )
            return
        if encoding is not None and encoding != "identity" and encoding not in INFLATE_BITS:
            self._refuse(
                stream, flags, Status.UNIMPLEMENTED, f"grpc-encoding {encoding!r} not supported"
            )
            return
        streaming = self.server.streaming.get(path)
        if streaming is None and path not in self.server.unary:
            self._refuse(stream, flags, Status.UNIMPLEMENTED, f"Method not found: {path}")
            return
        self.calls[stream] = call
        loop = self.loop
        if deadline_s is not None:
            call.timer = loop.call_at(
                loop.time() + (deadline_s - time.monotonic()), self._expire, call
            )
        if streaming is not None:
            call.inbox = asyncio.Queue()
            call.task = loop.create_task(self._run_stream(call, streaming))
        if flags & END_STREAM:
            self._input_ended(call)

    def stream_frame(
        self, ftype: int, flags: int, stream: int, payload: bytes, out: list[bytes]
    ) -> None:
        if ftype == DATA:
            call = self.calls.get(stream)
            if call is None:
                return  # a call already answered, refused or reset: its bytes are dropped
            if call.inbox is not None:
                call.received += len(payload)
                if call.received > WINDOW_MAX // 2:
                    out.append(frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", call.received)))
                    call.received = 0
            self._data(call, payload)
            if flags & END_STREAM and self.calls.get(stream) is call:
                self._input_ended(call)
        elif ftype == RST_STREAM:
            call = self.calls.pop(stream, None)
            self.forget(stream)
            if call is not None:
                _stop(call)
        elif ftype == PUSH_PROMISE:
            raise ProtocolError("PUSH_PROMISE from a client")

    def _data(self, call: Call, payload: bytes) -> None:
        """Cut ``payload`` (with what came before) into messages, each bounded from its
        length prefix and as it inflates."""
        limit = self.server.max_message_bytes
        try:
            if not call.body and len(payload) >= 5:  # the common case: one whole message
                flag, length = PREFIX.unpack_from(payload)
                if length + 5 == len(payload) and length <= limit:
                    message = payload[5:]
                    self._message(call, inflate(message, call.encoding, limit) if flag else message)
                    return
            call.body += payload
            for message in cut_messages(call.body, call.encoding, limit):
                self._message(call, message)
                if self.calls.get(call.stream) is not call:
                    return
        except GrpcError as err:
            self._fail(call, err.code, err.details)

    def _message(self, call: Call, message: bytes) -> None:
        if call.inbox is not None:
            call.inbox.put_nowait(message)
        elif call.message is None:
            call.message = message
        else:
            self._fail(call, Status.UNIMPLEMENTED, "a unary call with more than one request")

    def _input_ended(self, call: Call) -> None:
        call.input_open = False
        if call.inbox is not None:
            call.inbox.put_nowait(None)
            return
        message = call.message
        if call.body or message is None:
            self._fail(call, Status.UNIMPLEMENTED, "a unary call without its one whole request")
            return
        call.task = self.loop.create_task(
            self._run_unary(call, self.server.unary[call.path], message)
        )

    # -- answers -------------------------------------------------------------------------

    async def _run_unary(self, call: Call, handler: Unary, message: bytes) -> None:
        """``handler``'s answer to ``call``, written as the handler returns: in the same turn
        of the event loop, not in a done callback's (one turn less on every call's latency).
        A call reset, expired or whose connection is gone has nobody to answer."""
        try:
            reply = await handler(message, call)
        except asyncio.CancelledError:
            if self.calls.get(call.stream) is call:  # by the sidecar (a shutdown past its grace)
                code = Status.UNAVAILABLE if self._draining else Status.CANCELLED
                self._fail(call, code, "the call was cancelled in the sidecar")
            raise
        except GrpcError as err:
            if self.calls.get(call.stream) is call:
                self._fail(call, err.code, err.details, err.trailing)
            return
        except Exception as error:
            if self.calls.get(call.stream) is call:
                log.error("the gRPC handler of %s failed", call.path, exc_info=error)
                self._fail(call, Status.UNKNOWN, f"Unexpected error in the sidecar: {error!r}")
            return
        stream = call.stream
        if self.calls.get(stream) is not call:
            return
        del self.calls[stream]
        if call.timer is not None:
            call.timer.cancel()
        trailers = _OK_TRAILERS + metadata_block(call.trailing) if call.trailing else _OK_TRAILERS
        self.send(
            stream,
            frame(HEADERS, END_HEADERS, stream, REPLY_HEADERS),
            framed(reply),
            frame(HEADERS, END_HEADERS | END_STREAM, stream, trailers),
        )
        self._after_call()

    async def _run_stream(self, call: Call, handler: Streaming) -> None:
        code: int = Status.OK
        details, trailing = "", call.trailing
        stream = call.stream
        try:
            async for reply in handler(call.messages(), call):
                if self.calls.get(stream) is not call:
                    return
                head = b""
                if not call.headers_sent:
                    head, call.headers_sent = (
                        frame(HEADERS, END_HEADERS, stream, REPLY_HEADERS),
                        True,
                    )
                self.send(stream, head, framed(reply), None)
                while self.held_bytes(stream) > MAX_HELD_BYTES and not self.closed:
                    if self._drained is None:
                        self._drained = self.loop.create_future()
                    await self._drained
        except GrpcError as failed:
            code, details, trailing = failed.code, failed.details, failed.trailing
        except Exception as err:
            log.error("the gRPC stream handler of %s failed", call.path, exc_info=err)
            code, details = Status.UNKNOWN, f"Unexpected error in the sidecar: {err!r}"
        if self.calls.get(stream) is call:
            self._fail(call, code, details, trailing or call.trailing)

    def flushed(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _fail(self, call: Call, code: int, details: str, trailing: Metadata = ()) -> None:
        """End ``call`` with ``code``: trailers (trailers-only before any reply), and
        RST_STREAM(NO_ERROR) when the client is still sending (stop: the answer is given)."""
        if self.calls.pop(call.stream, None) is None:
            return
        _stop(call)
        block = status_block(code, details) + metadata_block(trailing)
        head = b"" if call.headers_sent else REPLY_HEADERS
        end = frame(HEADERS, END_HEADERS | END_STREAM, call.stream, head + block)
        if call.input_open:
            end += frame(RST_STREAM, 0, call.stream, struct.pack(">I", NO_ERROR))
        self.send(call.stream, b"", b"", end)
        self._after_call()

    def _refuse(self, stream: int, flags: int, code: int, details: str) -> None:
        """Answer a stream that never became a call: trailers-only with ``code``."""
        end = frame(
            HEADERS, END_HEADERS | END_STREAM, stream, REPLY_HEADERS + status_block(code, details)
        )
        if not flags & END_STREAM:
            end += frame(RST_STREAM, 0, stream, struct.pack(">I", NO_ERROR))
        self.send(stream, b"", b"", end)

    def _reset_if_open(self, stream: int, flags: int, out: list[bytes]) -> None:
        self.forget(stream)
        if not flags & END_STREAM:
            out.append(frame(RST_STREAM, 0, stream, struct.pack(">I", NO_ERROR)))

    def _expire(self, call: Call) -> None:
        if self.calls.get(call.stream) is call:
            self._fail(call, Status.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _after_call(self) -> None:
        if self._draining and not self.calls:
            self.close()


def _stop(call: Call) -> None:
    """Cancel ``call``'s handler (unless it is what ends the call) and its deadline."""
    if call.timer is not None:
        call.timer.cancel()
    task = call.task
    if task is not None and not task.done() and task is not asyncio.current_task():
        task.cancel()
