"""The least HTTP/2 in Python on asyncio does for unary gRPC calls, at either end: measurement
floors for a gRPC front end and a channel to Triton that are not grpcio's, not code to serve
with (the sidecar's own, built on the same lines with everything listed below that these leave
out, are :mod:`api.grpc_frontend.h2server` and :mod:`api.grpc_frontend.channel`).

grpcio's servers (grpc.aio's and the synchronous one) cost more CPU per call than the sidecar's
whole gRPC target before any work of its own (``python -m benchmarks.grpcfloor``). This server
answers the same calls from the same grpc.aio client over one uvloop protocol: frames cut with
``struct``, request header blocks decoded by ``hpack`` (and kept, by their bytes, while they
leave HPACK's dynamic table as it was: a gRPC client's header block repeats once its fields are
indexed), the reply's header blocks constant bytes (literals without indexing, RFC 7541 §6.2.2).

What it does: the connection preface and SETTINGS (acknowledged), PING (answered), the
connection's receive window opened wide at the start and topped up, HEADERS (padded, with
priority, or continued in CONTINUATION frames), DATA (padded) gathered per stream until its end,
then one reply (the handler's bytes, or what it awaits: a proxy's call onwards): HEADERS, the
message in DATA frames of at most 16 KiB (the peer's default frame size), trailers with
``grpc-status``; a path it has no handler for gets ``UNIMPLEMENTED``;
RST_STREAM drops a stream. What it does not do, and a front end built on the same lines must:
respect the peer's send window for large replies, honour ``grpc-timeout`` and ``grpc-encoding``,
bound header lists and message sizes, streaming calls, GOAWAY on shutdown.

:class:`UnaryGrpcClient` is the other end: one connection, each call a new stream whose header
block is constant bytes (built once per path, literals without indexing) and whose reply ends at
the trailers; what it does not do is the same list, and a ``grpc-status`` other than 0 is
raised as :class:`GrpcStatusError`.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import cast

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
MAX_FRAME_BYTES = 16_384  # SETTINGS_MAX_FRAME_SIZE's default: what a peer accepts unasked
WINDOW_MAX = 2**31 - 1
_HEAD = struct.Struct(">BHBBI")  # 24-bit length, type, flags, stream id

# :status 200 (static index 8); content-type (static name 31), "application/grpc", not indexed.
REPLY_HEADERS = b"\x88\x0f\x10\x10application/grpc"


def _trailers(status: int) -> bytes:
    """``grpc-status: <status>``, a literal with a new name, not indexed."""
    value = str(status).encode()
    return b"\x00\x0bgrpc-status" + bytes([len(value)]) + value


OK_TRAILERS = _trailers(0)
UNIMPLEMENTED_TRAILERS = REPLY_HEADERS + _trailers(12)

# A path's handler: the request message's bytes → the reply's, or an awaitable of them.
Handler = Callable[[bytes], bytes | Awaitable[bytes]]


def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame (RFC 9113 §4.1)."""
    n = len(payload)
    return _HEAD.pack(n >> 16, n & 0xFFFF, ftype, flags, stream) + payload


def _unpadded(payload: bytes, flags: int) -> bytes:
    return payload[1 : len(payload) - payload[0]] if flags & PADDED else payload


class _Connection(asyncio.Protocol):
    """What both ends of a connection do: open it (SETTINGS with a wide stream window, the
    connection's window opened wide), cut frames from what arrives and hand each to
    :meth:`_frame`, acknowledge SETTINGS and answer PING, keep HPACK's decoder, and top the
    receive window up."""

    preface = b""  # what this end sends first (a client's connection preface)

    def __init__(self) -> None:
        self._buffer = b""
        self._decoder = hpack.Decoder()
        self._decoded: dict[bytes, list[tuple[str, str]]] = {}
        self._received = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is not one
        settings = struct.pack(">HI", 0x4, WINDOW_MAX)  # SETTINGS_INITIAL_WINDOW_SIZE
        opened = struct.pack(">I", WINDOW_MAX - 65_535)  # the connection's window, wide open
        transport.write(
            self.preface + frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, opened)
        )

    def _read(self, buffer: bytes, pos: int) -> None:
        out: list[bytes] = []
        end = len(buffer)
        while end - pos >= 9:
            high, low, ftype, flags, stream = _HEAD.unpack_from(buffer, pos)
            length = (high << 16) | low
            if end - pos - 9 < length:
                break
            payload = buffer[pos + 9 : pos + 9 + length]
            pos += 9 + length
            if ftype == DATA:
                self._received += length
            if ftype == SETTINGS and not flags & ACK:
                out.append(frame(SETTINGS, ACK, 0))
            elif ftype == PING and not flags & ACK:
                out.append(frame(PING, ACK, 0, payload))
            else:
                self._frame(ftype, flags, stream & 0x7FFFFFFF, payload, out)
        self._buffer = buffer[pos:]
        if self._received > WINDOW_MAX // 2:
            out.append(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._received)))
            self._received = 0
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    def _decode(self, block: bytes) -> list[tuple[str, str]]:
        """``block`` decoded; kept by its bytes when decoding it left HPACK's dynamic table as
        it was (only indexed fields and literals not indexed): the same bytes then decode the
        same."""
        headers = self._decoded.get(block)
        if headers is None:
            table = self._decoder.header_table.dynamic_entries
            before = (len(table), id(table[0]) if table else None)
            headers = [(str(k), str(v)) for k, v in self._decoder.decode(block)]
            if (len(table), id(table[0]) if table else None) == before:
                self._decoded[block] = headers
        return headers

    def _frame(self, ftype: int, flags: int, stream: int, payload: bytes, out: list[bytes]) -> None:
        raise NotImplementedError


class UnaryGrpcProtocol(_Connection):
    """One client connection; ``handlers``: a gRPC path → its handler of the request message's
    bytes, returning the reply message's bytes."""

    def __init__(self, handlers: Mapping[str, Handler]) -> None:
        super().__init__()
        self._handlers = handlers
        self._preface_seen = False
        self._paths: dict[int, str] = {}
        self._bodies: dict[int, bytearray] = {}
        self._continued: tuple[int, bytearray, int] | None = None  # stream, block, flags
        self._pending: set[asyncio.Future[bytes]] = set()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer + data if self._buffer else data
        pos = 0
        if not self._preface_seen:
            if len(buffer) < len(PREFACE):
                self._buffer = buffer
                return
            if not buffer.startswith(PREFACE):
                assert self.transport is not None
                self.transport.close()
                return
            pos, self._preface_seen = len(PREFACE), True
        self._read(buffer, pos)

    def _frame(self, ftype: int, flags: int, stream: int, payload: bytes, out: list[bytes]) -> None:
        if ftype == DATA:
            body = self._bodies.get(stream)
            if body is not None:
                body += _unpadded(payload, flags)
                if flags & END_STREAM:
                    self._answer(stream, out)
        elif ftype == HEADERS:
            block = _unpadded(payload, flags)
            if flags & PRIORITY:
                block = block[5:]
            if flags & END_HEADERS:
                self._headers(stream, block)
            else:
                self._continued = (stream, bytearray(block), flags)
        elif ftype == CONTINUATION and self._continued is not None:
            started, continued, _ = self._continued
            continued += payload
            if flags & END_HEADERS:
                self._continued = None
                self._headers(started, bytes(continued))
        elif ftype == RST_STREAM:
            self._bodies.pop(stream, None)
            self._paths.pop(stream, None)

    def _headers(self, stream: int, block: bytes) -> None:
        headers = self._decode(block)
        path = next((v for k, v in headers if k == ":path"), "")
        self._paths[stream] = path
        self._bodies[stream] = bytearray()

    def _answer(self, stream: int, out: list[bytes]) -> None:
        body = self._bodies.pop(stream)
        handler = self._handlers.get(self._paths.pop(stream, ""))
        if handler is None:
            out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream, UNIMPLEMENTED_TRAILERS))
            return
        reply = handler(bytes(body[5:]))  # after the message's compressed flag and length
        if isinstance(reply, bytes):
            out.append(_reply_frames(stream, reply))
            return
        task = asyncio.ensure_future(reply)  # a handler that awaits (a proxy's call onwards)
        self._pending.add(task)
        task.add_done_callback(partial(self._answered, stream))

    def _answered(self, stream: int, task: asyncio.Future[bytes]) -> None:
        self._pending.discard(task)
        if self.transport is None or self.transport.is_closing() or task.cancelled():
            return
        error = task.exception()
        if error is None:
            self.transport.write(_reply_frames(stream, task.result()))
        else:
            status = error.status if isinstance(error, GrpcStatusError) else 2  # UNKNOWN
            block = REPLY_HEADERS + _trailers(status)
            self.transport.write(frame(HEADERS, END_HEADERS | END_STREAM, stream, block))

    def connection_lost(self, exc: Exception | None) -> None:
        for task in self._pending:
            task.cancel()


def _reply_frames(stream: int, reply: bytes) -> bytes:
    """A unary call's answer: headers, the message in frames of at most 16 KiB, trailers."""
    message = b"\x00" + struct.pack(">I", len(reply)) + reply
    frames = [frame(HEADERS, END_HEADERS, stream, REPLY_HEADERS)]
    for at in range(0, len(message), MAX_FRAME_BYTES):
        frames.append(frame(DATA, 0, stream, message[at : at + MAX_FRAME_BYTES]))
    frames.append(frame(HEADERS, END_HEADERS | END_STREAM, stream, OK_TRAILERS))
    return b"".join(frames)


async def unary_server(port: int, handlers: Mapping[str, Handler]) -> asyncio.Server:
    """A started server on ``port`` of the loopback answering ``handlers``' paths."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: UnaryGrpcProtocol(handlers), "127.0.0.1", port)


class GrpcStatusError(Exception):
    """A call that ended with a ``grpc-status`` other than 0."""

    def __init__(self, status: int) -> None:
        super().__init__(f"grpc-status {status}")
        self.status = status


def _literal(name: str, value: str) -> bytes:
    """A header field as a literal with a new name, not indexed (RFC 7541 §6.2.2); names and
    values short enough for one-byte lengths."""
    n, v = name.encode(), value.encode()
    assert len(n) < 127 and len(v) < 127
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v


class _ClientProtocol(_Connection):
    preface = PREFACE

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[int, tuple[asyncio.Future[bytes], bytearray]] = {}

    def data_received(self, data: bytes) -> None:
        self._read(self._buffer + data if self._buffer else data, 0)

    def _frame(self, ftype: int, flags: int, stream: int, payload: bytes, out: list[bytes]) -> None:
        if ftype == DATA:
            call = self.calls.get(stream)
            if call is not None:
                call[1].extend(_unpadded(payload, flags))
        elif ftype == HEADERS:  # every block, in order: HPACK's table is the connection's
            headers = self._decode(_unpadded(payload, flags))
            call = self.calls.pop(stream, None) if flags & END_STREAM else None
            if call is not None:  # the trailers (one block here: no CONTINUATION)
                self._finish(call, headers)

    def _finish(
        self, call: tuple[asyncio.Future[bytes], bytearray], headers: list[tuple[str, str]]
    ) -> None:
        future, body = call
        status = int(next((v for k, v in headers if k == "grpc-status"), "2"))
        if future.done():
            return
        if status != 0:
            future.set_exception(GrpcStatusError(status))
        else:
            future.set_result(bytes(body[5:]))

    def connection_lost(self, exc: Exception | None) -> None:
        for future, _ in self.calls.values():
            if not future.done():
                future.set_exception(ConnectionError("the connection closed"))
        self.calls.clear()


class UnaryGrpcClient:
    """One HTTP/2 connection to ``host:port`` for unary gRPC calls (see the module)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._protocol: _ClientProtocol | None = None
        self._next_stream = 1
        self._blocks: dict[str, bytes] = {}

    async def __aenter__(self) -> UnaryGrpcClient:
        loop = asyncio.get_running_loop()
        _, self._protocol = await loop.create_connection(_ClientProtocol, self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()

    def call(self, path: str, message: bytes) -> asyncio.Future[bytes]:
        """Send ``message`` to ``path``; the reply message's bytes."""
        protocol = self._protocol
        assert protocol is not None and protocol.transport is not None, "not connected"
        block = self._blocks.get(path)
        if block is None:
            block = self._blocks[path] = (
                b"\x83\x86"  # :method POST, :scheme http (static 3 and 6)
                + _literal(":path", path)
                + _literal(":authority", f"{self.host}:{self.port}")
                + _literal("content-type", "application/grpc")
                + _literal("te", "trailers")
            )
        stream, self._next_stream = self._next_stream, self._next_stream + 2
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        protocol.calls[stream] = (future, bytearray())
        body = b"\x00" + struct.pack(">I", len(message)) + message
        data = [
            frame(DATA, 0, stream, body[at : at + MAX_FRAME_BYTES])
            for at in range(0, len(body), MAX_FRAME_BYTES)
        ]
        last = data[-1]
        data[-1] = last[:4] + bytes([END_STREAM]) + last[5:]
        protocol.transport.write(frame(HEADERS, END_HEADERS, stream, block) + b"".join(data))
        return future
