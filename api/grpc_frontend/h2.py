"""HTTP/2 (RFC 9113) as gRPC uses it, for both ends of the sidecar's gRPC path.

grpcio's server and client cost more CPU per call than the sidecar's whole gRPC budget before
any work of its own (``python -m benchmarks.grpcfloor``), so the front end (:mod:`.h2server`)
and the channel to Triton (:mod:`.channel`) speak HTTP/2 themselves on one asyncio protocol per
connection, as the HTTP front end speaks HTTP/1.1 with httptools.

:class:`Connection` is what both ends share: frames cut with ``struct``; SETTINGS (sent,
acknowledged, the peer's window size and frame size applied); PING answered; header blocks
gathered over CONTINUATION, bounded, and decoded by ``hpack`` (kept by their bytes while they
leave HPACK's dynamic table as it was: a gRPC peer's blocks repeat once their fields are
indexed); the receive window opened wide and topped up; and DATA sent within the peer's
connection and stream windows, the rest held per stream until WINDOW_UPDATE opens them. Header
blocks this end sends are literals without indexing (RFC 7541 §6.2.2), so the peer's HPACK
table size never matters. A peer that breaks the protocol gets GOAWAY and the connection ends.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import Iterable
from typing import Any, cast
from urllib.parse import quote, unquote

import hpack
from mypy_extensions import mypyc_attr

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY_FRAME, RST_STREAM, SETTINGS, PUSH_PROMISE = 0, 1, 2, 3, 4, 5
PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
# SETTINGS identifiers (RFC 9113 §6.5.2)
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6
# Error codes (RFC 9113 §7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW_BYTES = 65_535  # every window's size until SETTINGS says otherwise
MAX_FRAME_BYTES = 16_384  # SETTINGS_MAX_FRAME_SIZE's default: what either end accepts unasked
WINDOW_MAX = 2**31 - 1
# A header block (HEADERS and its CONTINUATIONs) longer than this ends the connection: HPACK's
# state cannot be kept without decoding it, and decoding it is what such a block attacks.
MAX_HEADER_BLOCK_BYTES = 256 * 1024
# Decoded header lists past this are refused per stream (gRPC's metadata bound is 8 KiB by
# default; this one leaves room for long tokens).
MAX_HEADER_LIST_BYTES = 16 * 1024
_HEAD = struct.Struct(">BHBBI")  # 24-bit length, type, flags, stream id
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")

Headers = list[tuple[str, str]]


class ProtocolError(Exception):
    """The peer broke HTTP/2: the connection ends with GOAWAY and ``code``."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame (RFC 9113 §4.1)."""
    n = len(payload)
    return _HEAD.pack(n >> 16, n & 0xFFFF, ftype, flags, stream) + payload


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) with ``first``'s high bits above its prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: str, value: str) -> bytes:
    """A header field as a literal with a new name, not indexed (RFC 7541 §6.2.2), no Huffman."""
    n, v = name.encode("latin-1"), value.encode("latin-1")
    return b"\x00" + _integer(len(n), 7, 0) + n + _integer(len(v), 7, 0) + v


def metadata_block(metadata: Iterable[tuple[str, str | bytes]]) -> bytes:
    """gRPC metadata as header fields: a binary value (its key ends in ``-bin``) in base64."""
    out = []
    for key, value in metadata:
        if isinstance(value, bytes):
            value = base64.b64encode(value).decode("ascii").rstrip("=")
        out.append(literal(key, value))
    return b"".join(out)


def metadata_of(headers: Headers, skip: tuple[str, ...]) -> tuple[tuple[str, str | bytes], ...]:
    """The gRPC metadata in ``headers``: every field but pseudo-headers and those starting with
    one of ``skip``; a ``-bin`` key's value decoded from base64 (padded or not)."""
    out: list[tuple[str, str | bytes]] = []
    for key, value in headers:
        if key.startswith(":") or key.startswith(skip):
            continue
        if key.endswith("-bin"):
            try:
                out.append((key, base64.b64decode(value + "=" * (-len(value) % 4))))
            except ValueError:
                continue  # not base64: dropped, as grpcio drops it
        else:
            out.append((key, value))
    return tuple(out)


def status_block(code: int, message: str = "") -> bytes:
    """``grpc-status`` and, when there is one, ``grpc-message`` (percent-encoded as gRPC's
    HTTP/2 protocol says)."""
    block = literal("grpc-status", str(code))
    if message:
        block += literal("grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"))
    return block


def status_of(headers: Headers) -> tuple[int, str]:
    """``grpc-status`` and ``grpc-message`` from trailers; no status is UNKNOWN (2)."""
    code, message = 2, ""
    for key, value in headers:
        if key == "grpc-status":
            code = int(value) if value.isdigit() else 2
        elif key == "grpc-message":
            message = unquote(value)
    return code, message


class _Pending:
    """What a stream has to send that its window (or the connection's) holds back: DATA, then
    the block that ends the stream."""

    __slots__ = ("data", "end")

    def __init__(self) -> None:
        self.data = bytearray()
        self.end: bytes | None = None  # the final HEADERS frame, once the stream has one


@mypyc_attr(allow_interpreted_subclasses=True)  # the server's and the channel's connections
class Connection(asyncio.Protocol):
    """One HTTP/2 connection, either end (see the module). Subclasses handle the streams'
    frames in :meth:`stream_frame` and their headers in :meth:`headers_received`."""

    preface_out = b""  # what this end sends first: a client's connection preface
    preface_in = b""  # what this end expects first: a server's is the client's preface

    def __init__(self, settings: dict[int, int] | None = None) -> None:
        # Made in the loop it serves (a protocol factory's call), looked up once: asyncio's
        # lookup asks the OS for the process id at every call on Python 3.11 (a system call).
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._buffer = b""
        self._preface_left = len(self.preface_in)
        self._decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_BLOCK_BYTES * 4)
        self._decoded: dict[bytes, Headers] = {}
        self._continued: tuple[int, int, bytearray] | None = None  # stream, flags, block
        self._received = 0  # DATA bytes since the connection's window was last topped up
        self._settings = {INITIAL_WINDOW_SIZE: WINDOW_MAX, ENABLE_PUSH: 0, **(settings or {})}
        # Sending: the peer's windows and frame size, and what waits for them.
        self.send_window = DEFAULT_WINDOW_BYTES
        self.stream_windows: dict[int, int] = {}
        self.peer_initial_window = DEFAULT_WINDOW_BYTES
        self.peer_max_frame = MAX_FRAME_BYTES
        self.peer_max_streams = WINDOW_MAX
        self._pending: dict[int, _Pending] = {}
        self._corked: list[bytes] = []
        self.closed = False

    # -- the connection ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not one
        settings = b"".join(_SETTING.pack(k, v) for k, v in self._settings.items())
        opened = _U32.pack(WINDOW_MAX - DEFAULT_WINDOW_BYTES)  # the connection's, wide open
        self.transport.write(
            self.preface_out + frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, opened)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pending.clear()

    def write(self, data: bytes) -> None:
        """Send ``data``. While other calls are under way on the connection, everything
        written in one turn of the event loop goes out in one send at its end (a send costs a
        system call, and at concurrency the replies and requests of a dispatch pass come
        together); a lone call's bytes go at once (waiting a turn would only add latency)."""
        if self.closed:
            return
        if self._corked:
            self._corked.append(data)
        elif self.in_flight() > 1:
            self._corked.append(data)
            self.loop.call_soon(self._uncork)
        elif self.transport is not None:
            self.transport.write(data)

    def in_flight(self) -> int:
        """Calls under way on this connection, counting the one being written."""
        return 0

    def _uncork(self) -> None:
        if not self._corked:
            return
        data = b"".join(self._corked) if len(self._corked) > 1 else self._corked[0]
        self._corked.clear()
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def close(self) -> None:
        """End the connection after what is queued."""
        self._uncork()
        if self.transport is not None:
            self.transport.close()

    def go_away(self, code: int, last_stream: int, message: str = "") -> None:
        """Say GOAWAY; with an error code, end the connection too."""
        self.write(frame(GOAWAY, 0, 0, _U32.pack(last_stream) + _U32.pack(code) + message.encode()))
        if code != NO_ERROR:
            self.close()
            self.closed = True

    def last_stream(self) -> int:
        return 0

    # -- reading -----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer + data if self._buffer else data
        pos = 0
        if self._preface_left:
            seen = len(self.preface_in) - self._preface_left
            take = min(self._preface_left, len(buffer))
            if buffer[:take] != self.preface_in[seen : seen + take]:
                self.go_away(PROTOCOL_ERROR, 0, "not the HTTP/2 connection preface")
                return
            self._preface_left -= take
            pos = take
        out: list[bytes] = []
        try:
            pos = self._frames(buffer, pos, out)
        except ProtocolError as err:
            self.write(b"".join(out))
            self.go_away(err.code, self.last_stream(), str(err))
            return
        self._buffer = buffer[pos:]
        if self._received > WINDOW_MAX // 2:
            out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._received)))
            self._received = 0
        if out:
            self.write(b"".join(out))

    def _frames(self, buffer: bytes, pos: int, out: list[bytes]) -> int:
        end = len(buffer)
        limit = self._settings.get(MAX_FRAME_SIZE, MAX_FRAME_BYTES)
        while end - pos >= 9 and not self.closed:
            high, low, ftype, flags, stream = _HEAD.unpack_from(buffer, pos)
            length = (high << 16) | low
            if length > limit:
                raise ProtocolError(f"a frame of {length} bytes", FRAME_SIZE_ERROR)
            if end - pos - 9 < length:
                break
            payload = buffer[pos + 9 : pos + 9 + length]
            pos += 9 + length
            stream &= 0x7FFFFFFF
            if self._continued is not None and ftype != CONTINUATION:
                raise ProtocolError("a header block not continued")
            if ftype == DATA:
                self._received += length
                self.stream_frame(ftype, flags, stream, _unpadded(payload, flags), out)
            elif ftype == HEADERS:
                block = _unpadded(payload, flags)
                if flags & PRIORITY:
                    block = block[5:]
                if flags & END_HEADERS:
                    self.headers_received(stream, flags, self._decode(block), out)
                else:
                    self._continued = (stream, flags, bytearray(block))
            elif ftype == CONTINUATION:
                self._continue(stream, flags, payload, out)
            elif ftype == SETTINGS:
                if not flags & ACK:
                    self._peer_settings(payload)
                    out.append(frame(SETTINGS, ACK, 0))
            elif ftype == PING:
                if not flags & ACK:
                    out.append(frame(PING, ACK, 0, payload))
            elif ftype == WINDOW_UPDATE:
                self._window_update(stream, payload)
            elif ftype == GOAWAY:
                self.goaway_received(_U32.unpack_from(payload)[0] & 0x7FFFFFFF)
            elif ftype in (RST_STREAM, PUSH_PROMISE):
                self.stream_frame(ftype, flags, stream, payload, out)
            # PRIORITY and unknown frame types are ignored (RFC 9113 §5.5)
        return pos

    def _continue(self, stream: int, flags: int, payload: bytes, out: list[bytes]) -> None:
        if self._continued is None or self._continued[0] != stream:
            raise ProtocolError("CONTINUATION without its HEADERS")
        started, first_flags, block = self._continued
        block += payload
        if len(block) > MAX_HEADER_BLOCK_BYTES:
            raise ProtocolError("a header block over its bound", ENHANCE_YOUR_CALM)
        if flags & END_HEADERS:
            self._continued = None
            self.headers_received(started, first_flags, self._decode(bytes(block)), out)

    def _decode(self, block: bytes) -> Headers:
        """``block`` decoded; kept by its bytes when decoding it left HPACK's dynamic table as
        it was (only indexed fields and literals not indexed): the same bytes then decode the
        same."""
        headers = self._decoded.get(block)
        if headers is not None:
            return headers
        table = self._decoder.header_table.dynamic_entries
        before = (len(table), id(table[0]) if table else None)
        try:
            # hpack says bytes and gives text (raw=False): Any, so no compiled check trips.
            fields: Any = self._decoder.decode(block)
            headers = [(str(k), str(v)) for k, v in fields]
        except Exception as err:  # hpack's HPACKError and its kinds
            raise ProtocolError(
                f"a header block HPACK cannot decode: {err}", COMPRESSION_ERROR
            ) from None
        if (len(table), id(table[0]) if table else None) == before and len(self._decoded) < 256:
            self._decoded[block] = headers
        return headers

    def _peer_settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise ProtocolError("SETTINGS of a length not a multiple of 6", FRAME_SIZE_ERROR)
        for at in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, at)
            if key == INITIAL_WINDOW_SIZE:
                if value > WINDOW_MAX:
                    raise ProtocolError("a window over 2^31-1", FLOW_CONTROL_ERROR)
                delta, self.peer_initial_window = value - self.peer_initial_window, value
                for stream in self.stream_windows:
                    self.stream_windows[stream] += delta
                if delta > 0:
                    self._flush()
            elif key == MAX_FRAME_SIZE:
                if not MAX_FRAME_BYTES <= value <= 2**24 - 1:
                    raise ProtocolError("SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value

    def _window_update(self, stream: int, payload: bytes) -> None:
        increment = _U32.unpack_from(payload)[0] & 0x7FFFFFFF
        if stream == 0:
            self.send_window += increment
        elif stream in self.stream_windows:
            self.stream_windows[stream] += increment
        else:
            return
        self._flush()

    # -- what subclasses handle ----------------------------------------------------------

    def stream_frame(
        self, ftype: int, flags: int, stream: int, payload: bytes, out: list[bytes]
    ) -> None:
        """DATA (unpadded), RST_STREAM or PUSH_PROMISE on ``stream``."""
        raise NotImplementedError

    def headers_received(self, stream: int, flags: int, headers: Headers, out: list[bytes]) -> None:
        """A whole header block on ``stream``; ``flags``: its HEADERS frame's."""
        raise NotImplementedError

    def goaway_received(self, last_stream: int) -> None:
        """The peer takes no stream after ``last_stream``."""

    # -- sending -----------------------------------------------------------------------

    def open_window(self, stream: int) -> None:
        self.stream_windows[stream] = self.peer_initial_window

    def forget(self, stream: int) -> None:
        """``stream`` is over: its window and what it had left to send are dropped."""
        self.stream_windows.pop(stream, None)
        self._pending.pop(stream, None)

    def send(self, stream: int, head: bytes, data: bytes, end: bytes | None) -> None:
        """Send ``head`` (frames that are not flow-controlled), then ``data`` as DATA frames
        within the windows, then ``end`` (the stream's last frame) once all of ``data`` is out.
        What the windows hold back waits for WINDOW_UPDATE, in order."""
        window = self.stream_windows.get(stream)
        if window is None:  # the stream is over (reset by the peer): nothing more goes out
            return
        if (
            stream not in self._pending
            and len(data) <= self.send_window
            and len(data) <= window
            and len(data) <= self.peer_max_frame
        ):  # the common case: everything fits, one write
            self.send_window -= len(data)
            self.stream_windows[stream] = window - len(data)
            self.write(head + (frame(DATA, 0, stream, data) if data else b"") + (end or b""))
            if end is not None:
                self.forget(stream)
            return
        if head:
            self.write(head)
        pending = self._pending.get(stream)
        if pending is None:
            pending = self._pending[stream] = _Pending()
        pending.data += data
        if end is not None:
            pending.end = end
        self._flush()

    def held_bytes(self, stream: int) -> int:
        """What ``stream`` has waiting for the peer's windows."""
        pending = self._pending.get(stream)
        return 0 if pending is None else len(pending.data)

    def _flush(self) -> None:
        out: list[bytes] = []
        for stream in list(self._pending):
            pending = self._pending[stream]
            sent = 0
            while sent < len(pending.data):
                room = min(
                    self.send_window,
                    self.stream_windows.get(stream, 0),
                    self.peer_max_frame,
                    len(pending.data) - sent,
                )
                if room <= 0:
                    break
                out.append(frame(DATA, 0, stream, bytes(pending.data[sent : sent + room])))
                sent += room
                self.send_window -= room
                self.stream_windows[stream] -= room
            del pending.data[:sent]
            if not pending.data and pending.end is not None:
                out.append(pending.end)
                self.forget(stream)
        if out:
            self.write(b"".join(out))
        self.flushed()

    def flushed(self) -> None:
        """Windows opened and what they held is sent: writers waiting may go on."""


def _unpadded(payload: bytes, flags: int) -> bytes:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolError("padding longer than its frame")
    return payload[1 : len(payload) - payload[0]]
