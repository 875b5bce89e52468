"""Unary gRPC calls to Triton over the sidecar's own HTTP/2 (:mod:`.h2`).

A call's request is written in the moment :meth:`TritonChannel.call` is called when the
connection is open (the dispatch pass sends a request before the task awaiting its answer
runs), as one write: a header block of constant bytes per method, then the client's metadata
and what is left of its deadline (``grpc-timeout``), the message within Triton's flow-control
windows. The reply's message comes back as Triton's bytes; a status other than OK as
:class:`GrpcError` with Triton's code, message and trailing metadata; Triton out of reach (no
connection, the connection lost, the stream refused) as ``UNAVAILABLE``. Cancelling the
awaiting task resets the stream (RST_STREAM CANCEL), so Triton stops working for nobody.
:meth:`TritonChannel.stream` is the same for a call with one request and a stream of replies
(one request of ``ModelStreamInfer``, a decoupled model's responses coming back as Triton sends
them); closing the iterator before its end resets the stream. A reply message over
``max_message_bytes`` (Triton's own limit, 2 GiB less a byte, unless told), from its length
prefix or as it inflates, ends its call with ``RESOURCE_EXHAUSTED`` and resets the stream.
A connection Triton says GOAWAY to, or that has used its stream ids or Triton's
``MAX_CONCURRENT_STREAMS``, takes no new call: the next call opens another.
"""

from __future__ import annotations

import asyncio
import math
import struct
from collections.abc import Awaitable
from functools import partial

from api.grpc_frontend.h2 import (
    CANCEL,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    MAX_HEADER_LIST_BYTES,
    MAX_HEADER_LIST_SIZE,
    PREFACE,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    Connection,
    Headers,
    ProtocolError,
    frame,
    literal,
    metadata_block,
    metadata_of,
    status_of,
)
from api.grpc_frontend.messages import GrpcError, Metadata, Status, cut_messages, framed

_LAST_STREAM_ID = 2**31 - 1
# Triton's own message limit (INT32_MAX): a reply message past it, compressed or inflated, ends
# its call with RESOURCE_EXHAUSTED instead of filling the sidecar's memory.
MAX_REPLY_BYTES = 2**31 - 1
_REPLY_SKIP = (
    "content-type",
    "grpc-status",
    "grpc-message",
    "grpc-encoding",
    "grpc-accept-encoding",
)


class _Reply:
    __slots__ = (
        "body",
        "encoding",
        "future",
        "messages",
        "replies",
        "started",
        "timer",
        "trailing",
    )

    def __init__(
        self,
        future: asyncio.Future[bytes],
        replies: asyncio.Queue[bytes | GrpcError | None] | None = None,
        trailing: list[tuple[str, str | bytes]] | None = None,
    ) -> None:
        self.future = future  # a unary call's reply; a stream's end
        self.replies = replies  # a stream's replies as they come, then None or its error
        self.body = bytearray()  # what came of a message still coming
        self.messages: list[bytes] = []  # a unary call's whole messages (one, if all is well)
        self.started = False  # its response headers came
        self.encoding: str | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.trailing = trailing  # where a caller asked for an OK reply's trailing metadata


class _TritonConnection(Connection):
    preface_out = PREFACE

    def __init__(self, max_message_bytes: int) -> None:
        super().__init__({MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_BYTES * 4})
        self.max_message_bytes = max_message_bytes
        self.calls: dict[int, _Reply] = {}
        self.next_stream = 1
        self.going_away = False

    def in_flight(self) -> int:
        return len(self.calls)

    def usable(self) -> bool:
        return (
            not self.closed
            and not self.going_away
            and self.next_stream < _LAST_STREAM_ID
            and len(self.calls) < self.peer_max_streams
        )

    def start(
        self,
        block: bytes,
        message: bytes,
        metadata: Metadata,
        timeout_s: float | None,
        replies: asyncio.Queue[bytes | GrpcError | None] | None = None,
        trailing: list[tuple[str, str | bytes]] | None = None,
    ) -> asyncio.Future[bytes]:
        stream, self.next_stream = self.next_stream, self.next_stream + 2
        future: asyncio.Future[bytes] = self.loop.create_future()
        reply = self.calls[stream] = _Reply(future, replies, trailing)
        if metadata:
            block += metadata_block(metadata)
        if timeout_s is not None:
            block += literal("grpc-timeout", timeout_header(timeout_s))
            reply.timer = self.loop.call_later(timeout_s, self._expire, stream)
        future.add_done_callback(partial(self._done, stream))
        self.open_window(stream)
        self.send(
            stream,
            frame(HEADERS, END_HEADERS, stream, block),
            framed(message),
            frame(DATA, END_STREAM, stream),
        )
        return future

    def _done(self, stream: int, future: asyncio.Future[bytes]) -> None:
        reply = self.calls.pop(stream, None)
        if reply is None:
            return
        if reply.timer is not None:
            reply.timer.cancel()
        self.forget(stream)
        if future.cancelled():  # the caller went away: Triton stops too
            self.write(frame(RST_STREAM, 0, stream, struct.pack(">I", CANCEL)))

    def _expire(self, stream: int) -> None:
        reply = self.calls.get(stream)
        if reply is not None and not reply.future.done():
            reply.future.set_exception(GrpcError(Status.DEADLINE_EXCEEDED, "Deadline Exceeded"))
            self.write(frame(RST_STREAM, 0, stream, struct.pack(">I", CANCEL)))

    # -- frames --------------------------------------------------------------------------

    def headers_received(self, stream: int, flags: int, headers: Headers, out: list[bytes]) -> None:
        reply = self.calls.get(stream)
        if reply is None:
            return
        if not reply.started:
            reply.started = True
            status = next((v for k, v in headers if k == ":status"), "")
            if status != "200":
                _settle(reply, GrpcError(_http_status(status), f"HTTP status {status or 'none'}"))
                return
            reply.encoding = next((v for k, v in headers if k == "grpc-encoding"), None)
            if not flags & END_STREAM:
                return
        if not flags & END_STREAM:
            raise ProtocolError(f"a second header block on stream {stream} that does not end it")
        code, message = status_of(headers)
        if code != Status.OK:
            _settle(reply, GrpcError(code, message, metadata_of(headers, _REPLY_SKIP)))
            return
        if reply.trailing is not None:
            reply.trailing.extend(metadata_of(headers, _REPLY_SKIP))
        if reply.body:
            _settle(reply, GrpcError(Status.INTERNAL, "Triton's reply ended inside a message"))
        elif reply.replies is not None:
            _settle(reply, b"")
        elif len(reply.messages) != 1:
            _settle(reply, GrpcError(Status.INTERNAL, "Triton's reply is not one message"))
        else:
            _settle(reply, reply.messages[0])

    def _cut(self, stream: int, reply: _Reply, out: list[bytes]) -> bool:
        """Take ``reply``'s whole messages off what has come, a stream's handed on at once,
        each bounded (:func:`cut_messages`); one over the bound, or that does not inflate, ends
        the call and resets the stream: False then."""
        try:
            for message in cut_messages(reply.body, reply.encoding, self.max_message_bytes):
                if reply.replies is not None:
                    reply.replies.put_nowait(message)
                else:
                    reply.messages.append(message)
        except GrpcError as err:
            _settle(reply, err)
            out.append(frame(RST_STREAM, 0, stream, struct.pack(">I", CANCEL)))
            return False
        return True

    def stream_frame(
        self, ftype: int, flags: int, stream: int, payload: bytes, out: list[bytes]
    ) -> None:
        if ftype == DATA:
            reply = self.calls.get(stream)
            if reply is not None and not reply.future.done():  # done: refused, reset, or over
                reply.body += payload
                if self._cut(stream, reply, out) and flags & END_STREAM:
                    _settle(
                        reply, GrpcError(Status.INTERNAL, "Triton's reply ended without status")
                    )
        elif ftype == RST_STREAM:
            reply = self.calls.get(stream)
            if reply is not None:
                code = struct.unpack(">I", payload[:4])[0] if len(payload) >= 4 else 0
                if code == REFUSED_STREAM:
                    error = GrpcError(Status.UNAVAILABLE, "Triton refused the stream")
                elif code == CANCEL:
                    error = GrpcError(Status.CANCELLED, "Triton cancelled the call")
                else:
                    error = GrpcError(Status.INTERNAL, f"Triton reset the stream (error {code})")
                _settle(reply, error)
        elif ftype == PUSH_PROMISE:
            raise ProtocolError("PUSH_PROMISE: server push is disabled")

    def goaway_received(self, last_stream: int) -> None:
        self.going_away = True
        for stream, reply in list(self.calls.items()):
            if stream > last_stream:  # never processed: safe to say unavailable
                _settle(reply, GrpcError(Status.UNAVAILABLE, "Triton is going away"))
        if not self.calls:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        for reply in list(self.calls.values()):
            _settle(reply, GrpcError(Status.UNAVAILABLE, "the connection to Triton was lost"))
        self.calls.clear()


def timeout_header(seconds: float) -> str:
    """``grpc-timeout`` for ``seconds``: the finest unit whose count fits its 8 digits,
    rounded up (a deadline never sent shorter than it is)."""
    for unit, per_s in (("u", 1e6), ("m", 1e3), ("S", 1.0), ("M", 1 / 60), ("H", 1 / 3600)):
        count = max(1, math.ceil(seconds * per_s))
        if count <= 99_999_999:
            return f"{count}{unit}"
    return "99999999H"


def _settle(reply: _Reply, result: bytes | GrpcError) -> None:
    future = reply.future
    if future.done():
        return
    if reply.replies is not None:  # a stream: its end (None) or its error, after its replies
        reply.replies.put_nowait(result if isinstance(result, GrpcError) else None)
        future.set_result(b"")
        return
    if isinstance(result, GrpcError):
        future.set_exception(result)
    else:
        future.set_result(result)


def _http_status(status: str) -> int:
    """gRPC's mapping of an HTTP status without ``grpc-status`` to a code."""
    return {
        "400": Status.INTERNAL,
        "401": Status.UNAUTHENTICATED,
        "403": Status.PERMISSION_DENIED,
        "404": Status.UNIMPLEMENTED,
        "429": Status.UNAVAILABLE,
        "502": Status.UNAVAILABLE,
        "503": Status.UNAVAILABLE,
        "504": Status.UNAVAILABLE,
    }.get(status, Status.UNKNOWN)


class Replies:
    """A streaming call's replies, iterated with ``async for`` (an async generator's
    interface: ``aclose`` resets a call not yet ended, as a cancelled one is); a class, since
    compiled modules hold no async generators."""

    def __init__(
        self, channel: TritonChannel, path: str, message: bytes, metadata: Metadata
    ) -> None:
        self._channel, self._path, self._message, self._metadata = channel, path, message, metadata
        self._replies: asyncio.Queue[bytes | GrpcError | None] = asyncio.Queue()
        self._end: asyncio.Future[bytes] | None = None
        self._over = False

    def __aiter__(self) -> Replies:
        return self

    async def __anext__(self) -> bytes:
        if self._over:
            raise StopAsyncIteration
        if self._end is None:
            try:
                connection = await self._channel._connect()
            except BaseException:
                self._over = True
                raise
            block = self._channel._block(self._path)
            self._end = connection.start(block, self._message, self._metadata, None, self._replies)
        try:
            reply = await self._replies.get()
        except BaseException:
            await self.aclose()
            raise
        if reply is None:
            await self.aclose()
            raise StopAsyncIteration
        if isinstance(reply, GrpcError):
            await self.aclose()
            raise reply
        return reply

    async def aclose(self) -> None:
        """End the iteration; a call not yet ended is reset (RST_STREAM)."""
        self._over = True
        if self._end is not None:
            self._end.cancel()


class TritonChannel:
    """Unary gRPC calls to the Triton at ``url`` (``host:port``); see the module."""

    def __init__(self, url: str, max_message_bytes: int = MAX_REPLY_BYTES) -> None:
        host, _, port = url.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"a gRPC address must be host:port, got {url!r}")
        self.url = url
        self.max_message_bytes = max_message_bytes
        self.host, self.port = host.strip("[]"), int(port)
        self._connection: _TritonConnection | None = None
        self._connecting: asyncio.Task[_TritonConnection] | None = None
        self._blocks: dict[str, bytes] = {}
        self._old: set[_TritonConnection] = set()

    def call(
        self,
        path: str,
        message: bytes,
        metadata: Metadata = (),
        timeout_s: float | None = None,
        trailing: list[tuple[str, str | bytes]] | None = None,
    ) -> Awaitable[bytes]:
        """Call ``path`` with ``message``; the reply message's bytes. Written now when a
        connection is open. ``trailing``: a list that an OK reply's trailing metadata is
        added to (a failed call's is on its :class:`GrpcError`)."""
        connection = self._connection
        if connection is not None and connection.usable():
            return connection.start(self._block(path), message, metadata, timeout_s, None, trailing)
        return self._call_connecting(path, message, metadata, timeout_s, trailing)

    async def _call_connecting(
        self,
        path: str,
        message: bytes,
        metadata: Metadata,
        timeout_s: float | None,
        trailing: list[tuple[str, str | bytes]] | None,
    ) -> bytes:
        connection = await self._connect()
        return await connection.start(
            self._block(path), message, metadata, timeout_s, None, trailing
        )

    def stream(self, path: str, message: bytes, metadata: Metadata = ()) -> Replies:
        """Call ``path`` with one request, ``message``; its replies as they come. A status
        other than OK is raised after the replies before it; leaving the iteration before the
        end (``aclose``) resets the call."""
        return Replies(self, path, message, metadata)

    def _block(self, path: str) -> bytes:
        block = self._blocks.get(path)
        if block is None:
            block = self._blocks[path] = (
                b"\x83\x86"  # :method POST, :scheme http (static table, 3 and 6)
                + literal(":path", path)
                + literal(":authority", f"{self.host}:{self.port}")
                + literal("content-type", "application/grpc")
                + literal("te", "trailers")
            )
        return block

    async def _connect(self) -> _TritonConnection:
        connection = self._connection
        if connection is not None and connection.usable():
            return connection
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._open())
        return await asyncio.shield(self._connecting)

    async def _open(self) -> _TritonConnection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_connection(
                partial(_TritonConnection, self.max_message_bytes), self.host, self.port
            )
        except OSError as err:
            raise GrpcError(
                Status.UNAVAILABLE, f"failed to connect to Triton's gRPC at {self.url}: {err}"
            ) from None
        if self._connection is not None:
            self._old.add(self._connection)
        self._old = {c for c in self._old if not c.closed}
        for old in self._old:
            if not old.calls:
                old.close()
        self._connection = connection
        return connection

    async def close(self) -> None:
        for connection in (self._connection, *self._old):
            if connection is not None:
                connection.close()
        self._connection = None
        await asyncio.sleep(0)
