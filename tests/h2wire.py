"""HTTP/2 on the wire for the tests of both HTTP/2 servers (the sidecar's gRPC front end and
the benchmark floor's): a transport that records what a protocol writes, that record cut back
into frames, and a request whose framing exercises what grpcio's client never sends."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import hpack

from api.grpc_frontend.h2 import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PADDED,
    PREFACE,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
)


class RecordingTransport(asyncio.Transport):
    """Keeps what is written; closing it does nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()

    def write(self, data: Any) -> None:
        self.written += data

    def close(self) -> None:
        pass


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each frame in ``data``."""
    frames, pos = [], 0
    while pos < len(data):
        high, low, ftype, flags, stream = struct.unpack_from(">BHBBI", data, pos)
        length = (high << 16) | low
        frames.append((ftype, flags, stream, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return frames


def decoded(decoder: hpack.Decoder, block: bytes) -> list[tuple[str, str]]:
    return [(str(k), str(v)) for k, v in decoder.decode(block)]


def awkward_request(path: str, message: bytes) -> bytes:
    """A client's preface and one unary call to ``path`` carrying ``message`` (its 5-byte prefix
    included), framed as a peer may but grpcio does not: a padded HEADERS frame continued in two
    CONTINUATION frames, the message split over a padded DATA frame and a second one."""
    block = hpack.Encoder().encode(
        [(":method", "POST"), (":scheme", "http"), (":path", path),
         ("content-type", "application/grpc"), ("x-big", "v" * 100)]
    )  # fmt: skip
    padding = b"\0" * 7
    return (
        PREFACE
        + frame(SETTINGS, 0, 0)
        + frame(HEADERS, PADDED, 1, bytes([len(padding)]) + block[:20] + padding)
        + frame(CONTINUATION, 0, 1, block[20:50])
        + frame(CONTINUATION, END_HEADERS, 1, block[50:])
        + frame(DATA, PADDED, 1, bytes([3]) + message[:4] + b"\0\0\0")
        + frame(DATA, END_STREAM, 1, message[4:])
    )


def send_awkward_hello(protocol: asyncio.Protocol, path: str) -> RecordingTransport:
    """Connect ``protocol`` to a recording transport and feed it :func:`awkward_request` of
    ``path`` carrying ``hello``, in 11-byte pieces as TCP may deliver it; the transport."""
    transport = RecordingTransport()
    protocol.connection_made(transport)
    wire = awkward_request(path, b"\x00" + struct.pack(">I", 5) + b"hello")
    for at in range(0, len(wire), 11):
        protocol.data_received(wire[at : at + 11])
    return transport


def assert_upper_hello_answered(written: bytes) -> None:
    """``written`` is a server's whole answer to :func:`awkward_request` carrying ``hello``,
    handled by upper-casing it: its settings, the connection's window opened, the client's
    settings acknowledged, then the reply (headers, ``HELLO``, trailers with status 0)."""
    frames = frames_of(written)
    kinds = [(ftype, flags, stream) for ftype, flags, stream, _ in frames]
    assert kinds == [
        (SETTINGS, 0, 0),
        (WINDOW_UPDATE, 0, 0),
        (SETTINGS, 0x1, 0),
        (HEADERS, END_HEADERS, 1),
        (DATA, 0, 1),
        (HEADERS, END_HEADERS | END_STREAM, 1),
    ]
    decoder = hpack.Decoder()
    assert (":status", "200") in decoded(decoder, frames[3][3])
    assert frames[4][3] == b"\x00" + struct.pack(">I", 5) + b"HELLO"
    assert ("grpc-status", "0") in decoded(decoder, frames[5][3])
