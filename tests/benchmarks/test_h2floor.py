"""The minimal HTTP/2 server and client that ``benchmarks.grpcfloor`` measures talk to grpc.aio's
client and server correctly (else their figures would be floors of nothing), and the server's
framing holds for what a client may send that grpc.aio's does not: padded frames and header
blocks continued."""

from __future__ import annotations

import asyncio
import struct

import grpc
import hpack
import pytest

from api.embedded import free_port
from benchmarks import h2floor
from benchmarks.floor import model_infer_server
from benchmarks.h2floor import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PREFACE,
    GrpcStatusError,
    UnaryGrpcClient,
    UnaryGrpcProtocol,
    frame,
    unary_server,
)
from tests.h2wire import (
    RecordingTransport,
    assert_upper_hello_answered,
    frames_of,
    send_awkward_hello,
)

PATH = "/inference.GRPCInferenceService/ModelInfer"


def _reply(request: bytes) -> bytes:
    """A reply that shows the request arrived whole: its length, then a payload of the size
    the request asks for (its first 4 bytes)."""
    size: int = struct.unpack(">I", request[:4])[0]
    return struct.pack(">I", len(request)) + b"r" * size


def test_a_grpc_aio_client_gets_every_reply_whole() -> None:
    async def run() -> None:
        port = free_port()
        server = await unary_server(port, {PATH: _reply})
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary(PATH)
                for size, request_bytes in ((0, 4), (40_000, 4), (10, 1_000_000)):
                    request = struct.pack(">I", size) + b"q" * (request_bytes - 4)
                    replies = await asyncio.gather(*(call(request, timeout=10) for _ in range(8)))
                    for reply in replies:
                        assert reply == struct.pack(">I", request_bytes) + b"r" * size
                with pytest.raises(grpc.aio.AioRpcError) as missing:
                    await channel.unary_unary("/inference.GRPCInferenceService/Nothing")(b"")
                assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(run())


def test_padded_frames_and_a_continued_header_block_are_read() -> None:
    protocol = UnaryGrpcProtocol({PATH: lambda message: message.upper()})
    transport = send_awkward_hello(protocol, PATH)
    assert_upper_hello_answered(bytes(transport.written))


def test_a_reply_longer_than_a_frame_is_split() -> None:
    protocol = UnaryGrpcProtocol({PATH: lambda _: b"x" * 40_000})
    transport = RecordingTransport()
    protocol.connection_made(transport)
    block = hpack.Encoder().encode([(":method", "POST"), (":path", PATH)])
    protocol.data_received(
        PREFACE
        + frame(HEADERS, END_HEADERS, 3, block)
        + frame(DATA, END_STREAM, 3, b"\x00\x00\x00\x00\x00")
    )
    data = [p for ftype, _, stream, p in frames_of(bytes(transport.written)) if ftype == DATA]
    assert [len(p) for p in data] == [h2floor.MAX_FRAME_BYTES, h2floor.MAX_FRAME_BYTES, 7_237]
    assert b"".join(data) == b"\x00" + struct.pack(">I", 40_000) + b"x" * 40_000


def test_the_minimal_client_is_answered_by_grpc_aio_and_by_the_minimal_server() -> None:
    """Its requests are what a grpc.aio server takes (the replies whole, an unknown method
    UNIMPLEMENTED), so its figure is a gRPC client's."""

    async def echo(request: bytes, _: object) -> bytes:
        return _reply(request)

    async def run() -> None:
        aio_port, h2_port = free_port(), free_port()
        aio = await model_infer_server(aio_port, echo)
        ours = await unary_server(h2_port, {PATH: _reply})
        try:
            for port in (aio_port, h2_port):
                async with UnaryGrpcClient("127.0.0.1", port) as client:
                    for size, request_bytes in ((0, 4), (40_000, 4), (10, 40_000)):
                        request = struct.pack(">I", size) + b"q" * (request_bytes - 4)
                        replies = await asyncio.gather(
                            *(client.call(PATH, request) for _ in range(8))
                        )
                        for reply in replies:
                            assert reply == struct.pack(">I", request_bytes) + b"r" * size
                    with pytest.raises(GrpcStatusError) as missing:
                        await client.call("/inference.GRPCInferenceService/Nothing", b"")
                    assert missing.value.status == grpc.StatusCode.UNIMPLEMENTED.value[0]
        finally:
            ours.close()
            await ours.wait_closed()
            await aio.stop(0)

    asyncio.run(run())


def test_a_handler_that_awaits_answers_and_its_error_becomes_the_status() -> None:
    """A proxy's handler awaits its call onwards: the reply is written when it comes, and a
    status the call ends with is the client's."""

    async def later(request: bytes) -> bytes:
        await asyncio.sleep(0.01)
        return request[::-1]

    async def missing(_: bytes) -> bytes:
        raise GrpcStatusError(grpc.StatusCode.NOT_FOUND.value[0])

    async def run() -> None:
        port = free_port()
        server = await unary_server(port, {PATH: later, "/x/Missing": missing})
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                replies = await asyncio.gather(
                    *(channel.unary_unary(PATH)(b"abc%d" % i, timeout=10) for i in range(8))
                )
                assert replies == [b"%dcba" % i for i in range(8)]
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await channel.unary_unary("/x/Missing")(b"", timeout=10)
                assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(run())
