"""gRPC's message framing, shared by the server and the channel: whole messages cut from what
arrives in any pieces, each bounded from its length prefix and as it inflates."""

from __future__ import annotations

import gzip
import zlib

import pytest

from api.grpc_frontend.messages import (
    PREFIX,
    GrpcError,
    Status,
    cut_messages,
    framed,
    inflate,
)


def _compressed(message: bytes) -> bytes:
    return PREFIX.pack(1, len(message)) + message


def test_messages_are_cut_whole_from_any_pieces() -> None:
    wire = framed(b"") + framed(b"one") + framed(b"x" * 70_000) + framed(b"last")
    for piece in (1, 7, 4096, len(wire)):
        body, got = bytearray(), list[bytes]()
        for at in range(0, len(wire), piece):
            body += wire[at : at + piece]
            got += cut_messages(body, None, 100_000)
        assert got == [b"", b"one", b"x" * 70_000, b"last"]
        assert not body


def test_a_message_over_the_limit_is_refused_from_its_prefix() -> None:
    body = bytearray(PREFIX.pack(0, 10_000_000) + b"q" * 16_000)  # its first frame only
    with pytest.raises(GrpcError) as refused:
        list(cut_messages(body, None, 1_000_000))
    assert refused.value.code == Status.RESOURCE_EXHAUSTED
    assert "10000000 vs. 1000000" in refused.value.details


def test_compressed_messages_inflate_by_their_encoding() -> None:
    body = bytearray(
        _compressed(gzip.compress(b"hello " * 100))
        + _compressed(zlib.compress(b"world"))[:3]  # a deflate message still coming
    )
    assert list(cut_messages(body, "gzip", 1_000)) == [b"hello " * 100]
    assert list(cut_messages(bytearray(_compressed(zlib.compress(b"w"))), "deflate", 10)) == [b"w"]


def test_a_small_message_that_inflates_past_the_limit_is_refused() -> None:
    bomb = gzip.compress(b"\0" * 50_000_000)  # about 50 KB on the wire
    assert len(bomb) < 100_000
    with pytest.raises(GrpcError) as refused:
        inflate(bomb, "gzip", 1_000_000)
    assert refused.value.code == Status.RESOURCE_EXHAUSTED
    assert inflate(gzip.compress(b"\0" * 1_000_000), "gzip", 1_000_000) == b"\0" * 1_000_000


@pytest.mark.parametrize(
    ("message", "encoding", "words"),
    [
        (gzip.compress(b"x"), None, "without grpc-encoding"),
        (gzip.compress(b"x"), "identity", "without grpc-encoding"),
        (b"not deflated at all", "gzip", "does not inflate"),
    ],
)
def test_a_compressed_message_that_cannot_inflate_is_internal(
    message: bytes, encoding: str | None, words: str
) -> None:
    with pytest.raises(GrpcError) as failed:
        list(cut_messages(bytearray(_compressed(message)), encoding, 1_000))
    assert failed.value.code == Status.INTERNAL
    assert words in failed.value.details
