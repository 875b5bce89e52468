"""gRPC's messages and statuses, shared by the server (:mod:`.h2server`) and the channel to
Triton (:mod:`.channel`).

A message on the wire is a compressed flag, a 4-byte length and the bytes; a compressed one is
inflated by the call's ``grpc-encoding`` (gzip or deflate). :func:`cut_messages` takes whole
messages off the front of what a stream has received, each bounded twice: from its length
prefix, before any of it is held whole, and as it inflates, so neither a peer's large message
nor a small compressed one that inflates to a large one fills the sidecar's memory.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from enum import IntEnum

Metadata = tuple[tuple[str, str | bytes], ...]

PREFIX = struct.Struct(">BI")  # a message's compressed flag and length
INFLATE_BITS = {"gzip": 31, "deflate": 15}  # zlib's window bits for each grpc-encoding


class Status(IntEnum):
    """gRPC's status codes (``grpc-status``)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class GrpcError(Exception):
    """A call that ends with ``code`` (not OK), ``details`` and trailing metadata."""

    def __init__(self, code: int, details: str = "", trailing: Metadata = ()) -> None:
        name = Status(code).name if 0 <= code <= Status.UNAUTHENTICATED else str(code)
        super().__init__(f"{name}: {details}")
        self.code = code
        self.details = details
        self.trailing = trailing


def framed(message: bytes) -> bytes:
    """``message`` as it goes on the wire, uncompressed."""
    return PREFIX.pack(0, len(message)) + message


def cut_messages(body: bytearray, encoding: str | None, limit: int) -> Iterator[bytes]:
    """The whole messages at the front of ``body``, each taken off it as it is yielded; what
    is left is the start of a message still coming. Raises :class:`GrpcError`
    (``RESOURCE_EXHAUSTED``) as soon as a prefix gives a length over ``limit`` bytes, or a
    message inflates past it, and ``INTERNAL`` for a compressed message that does not inflate
    or comes without an encoding."""
    while len(body) >= 5:
        flag, length = PREFIX.unpack_from(body)
        if length > limit:  # in grpcio's words
            raise GrpcError(
                Status.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({length} vs. {limit})",
            )
        if len(body) < 5 + length:
            return
        message = bytes(body[5 : 5 + length])
        del body[: 5 + length]
        yield inflate(message, encoding, limit) if flag else message


def inflate(message: bytes, encoding: str | None, limit: int) -> bytes:
    """A compressed ``message`` inflated by ``encoding``, bounded by ``limit`` bytes."""
    bits = INFLATE_BITS.get(encoding or "")
    if bits is None:
        raise GrpcError(Status.INTERNAL, "a compressed message without grpc-encoding")
    inflater = zlib.decompressobj(bits)
    try:
        whole = inflater.decompress(message, limit + 1)
    except zlib.error as err:
        raise GrpcError(Status.INTERNAL, f"a message that does not inflate: {err}") from None
    if len(whole) > limit or inflater.unconsumed_tail:
        raise GrpcError(
            Status.RESOURCE_EXHAUSTED, f"Received message larger than max (over {limit} inflated)"
        )
    return whole
