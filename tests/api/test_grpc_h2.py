"""The gRPC front end's HTTP/2 server and its channel to Triton, each against grpcio's other end
(an independent implementation of the same protocol): messages whole past every flow-control
window, statuses, metadata both ways, deadlines, cancellation, bounds, compression, streams,
the drain; and the server's framing for what a client may send that grpcio's does not."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from api.embedded import free_port
from api.grpc_frontend import h2server
from api.grpc_frontend.channel import TritonChannel, timeout_header
from api.grpc_frontend.h2 import (
    MAX_FRAME_BYTES,
)
from api.grpc_frontend.h2server import Call, GrpcConnection, GrpcServer
from api.grpc_frontend.messages import GrpcError, Status
from tests.h2wire import assert_upper_hello_answered, send_awkward_hello

PATH = "/test.Service/Unary"
STREAM = "/test.Service/Stream"
LIMIT = 2 * 2**20


def _reply(request: bytes) -> bytes:
    """A reply that shows the request arrived whole: its length, then as many bytes as the
    request's first 4 ask for."""
    size: int = struct.unpack(">I", request[:4])[0]
    return struct.pack(">I", len(request)) + b"r" * size


def _request(reply_bytes: int, request_bytes: int) -> bytes:
    return struct.pack(">I", reply_bytes) + b"q" * (request_bytes - 4)


class _Seen:
    """What the test server's handlers saw."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.metadata: tuple[tuple[str, str | bytes], ...] = ()

    async def hold(self) -> None:
        """A handler that has started and waits until it is cancelled."""
        self.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


def _server(seen: _Seen) -> GrpcServer:
    async def unary(message: bytes, call: Call) -> bytes:
        seen.metadata = call.metadata
        return _reply(message)

    async def slow(message: bytes, call: Call) -> bytes:
        await seen.hold()
        return b""

    async def fails(message: bytes, call: Call) -> bytes:
        raise GrpcError(Status.NOT_FOUND, "nothing here: 100% ünicode", (("x-why", "because"),))

    async def cancelled(message: bytes, call: Call) -> bytes:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # as a shutdown past its grace cancels what is left
        await asyncio.sleep(1)
        return b""

    async def echo_metadata(message: bytes, call: Call) -> bytes:
        call.trailing = tuple((k, v) for k, v in call.metadata if k.startswith("x-"))
        return message

    async def stream(requests: AsyncIterator[bytes], call: Call) -> AsyncIterator[bytes]:
        async for message in requests:
            yield _reply(message)
            yield _reply(message)

    return GrpcServer(
        {PATH: unary, "/test.Service/Slow": slow, "/test.Service/Fails": fails,
         "/test.Service/Metadata": echo_metadata, "/test.Service/Cancelled": cancelled},
        {STREAM: stream},
        max_message_bytes=LIMIT,
    )  # fmt: skip


def _with_server(test: Callable[[grpc.aio.Channel, _Seen, GrpcServer], Awaitable[None]]) -> None:
    async def run() -> None:
        seen = _Seen()
        server = _server(seen)
        port = await server.start("127.0.0.1", 0)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await test(channel, seen, server)
        finally:
            await server.stop(0)

    asyncio.run(run())


def test_grpcio_client_gets_every_reply_whole_past_the_windows() -> None:
    async def test(channel: grpc.aio.Channel, seen: _Seen, server: GrpcServer) -> None:
        call = channel.unary_unary(PATH)
        # 1 MB each way: past the 64 KiB windows a peer starts with, and split into frames.
        for reply_bytes, request_bytes in ((0, 4), (40_000, 4), (10, 1_000_000), (1_000_000, 8)):
            request = _request(reply_bytes, request_bytes)
            replies = await asyncio.gather(*(call(request, timeout=20) for _ in range(6)))
            assert replies == [_reply(request)] * 6
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await channel.unary_unary("/test.Service/Nothing")(b"", timeout=5)
        assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED

    _with_server(test)


def test_status_details_and_metadata_both_ways() -> None:
    async def test(channel: grpc.aio.Channel, seen: _Seen, server: GrpcServer) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await channel.unary_unary("/test.Service/Fails")(b"", timeout=5)
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        assert failed.value.details() == "nothing here: 100% ünicode"
        assert ("x-why", "because") in tuple(failed.value.trailing_metadata())
        call = channel.unary_unary("/test.Service/Metadata")(
            b"m", metadata=(("x-text", "a b"), ("x-blob-bin", b"\x00\xff\x10")), timeout=5
        )
        assert await call == b"m"
        trailing = tuple(await call.trailing_metadata())
        assert ("x-text", "a b") in trailing and ("x-blob-bin", b"\x00\xff\x10") in trailing
        with pytest.raises(grpc.aio.AioRpcError) as cancelled:  # a handler the sidecar cancels
            await channel.unary_unary("/test.Service/Cancelled")(b"", timeout=5)
        assert cancelled.value.code() == grpc.StatusCode.CANCELLED

    _with_server(test)


def test_a_deadline_and_a_cancel_stop_the_handler() -> None:
    async def test(channel: grpc.aio.Channel, seen: _Seen, server: GrpcServer) -> None:
        slow = channel.unary_unary("/test.Service/Slow")
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await slow(b"", timeout=0.3)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(seen.cancelled.wait(), 5)
        seen.cancelled.clear()
        seen.started.clear()
        call = slow(b"", timeout=30)
        await asyncio.wait_for(seen.started.wait(), 5)
        call.cancel()
        await asyncio.wait_for(seen.cancelled.wait(), 5)
        assert not any(c.calls for c in server.connections)

    _with_server(test)


def test_a_message_over_the_limit_is_refused_from_its_prefix() -> None:
    held: list[int] = []

    class Watched(GrpcConnection):
        def _data(self, call: Call, payload: bytes) -> None:
            super()._data(call, payload)
            held.append(len(call.body))

    async def test(channel: grpc.aio.Channel, seen: _Seen, server: GrpcServer) -> None:
        server.connection_type = Watched
        with pytest.raises(grpc.aio.AioRpcError) as big:
            await channel.unary_unary(PATH)(b"x" * (4 * LIMIT), timeout=20)
        assert big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert max(held) < 2 * MAX_FRAME_BYTES  # never gathered: refused at the first frame
        request = _request(3, 100)  # the connection serves on
        assert await channel.unary_unary(PATH)(request, timeout=5) == _reply(request)

    _with_server(test)


def test_gzip_requests_are_inflated_and_a_long_header_list_is_refused() -> None:
    async def test(channel: grpc.aio.Channel, seen: _Seen, server: GrpcServer) -> None:
        request = _request(5, 100_000)
        reply = await channel.unary_unary(PATH)(
            request, compression=grpc.Compression.Gzip, timeout=5
        )
        assert reply == _reply(request)
        with pytest.raises(grpc.aio.AioRpcError) as long:
            await channel.unary_unary(PATH)(request, metadata=(("x-long", "v" * 40_000),))
        assert long.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await channel.unary_unary(PATH)(request, timeout=5) == _reply(request)

    _with_server(test)


def test_a_stream_answers_each_request_as_it_comes_within_the_windows() -> None:
    async def test(channel: grpc.aio.Channel, seen: _Seen, server: GrpcServer) -> None:
        call = channel.stream_stream(STREAM)(timeout=20)
        sizes = [10, 300_000, 5]
        replies = []
        for size in sizes:
            await call.write(_request(size, 20))
            replies.append(await call.read())
            replies.append(await call.read())
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
        assert [len(r) for r in replies] == [4 + s for s in sizes for _ in range(2)]
        assert await call.code() == grpc.StatusCode.OK

    _with_server(test)


def test_stopping_finishes_the_calls_under_way_and_takes_no_more() -> None:
    async def run() -> None:
        gate = asyncio.Event()

        async def waits(message: bytes, call: Call) -> bytes:
            await gate.wait()
            return b"done"

        server = GrpcServer({PATH: waits}, {}, max_message_bytes=LIMIT)
        port = await server.start("127.0.0.1", 0)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            under_way = asyncio.ensure_future(channel.unary_unary(PATH)(b"", timeout=10))
            while not any(c.calls for c in server.connections):
                await asyncio.sleep(0.01)
            stopping = asyncio.ensure_future(server.stop(10))
            await asyncio.sleep(0.1)
            gate.set()
            assert await under_way == b"done"
            await stopping
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await channel.unary_unary(PATH)(b"", timeout=2)
            assert refused.value.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )

    asyncio.run(run())


def test_padded_frames_and_a_continued_header_block_in_pieces() -> None:
    async def upper(message: bytes, call: Call) -> bytes:
        return message.upper()

    async def run() -> bytes:
        server = GrpcServer({PATH: upper}, {}, max_message_bytes=LIMIT)
        transport = send_awkward_hello(GrpcConnection(server), PATH)
        for _ in range(5):
            await asyncio.sleep(0)
        return bytes(transport.written)

    assert_upper_hello_answered(asyncio.run(run()))


def test_a_timeout_header_reads_as_grpc_says() -> None:
    assert h2server.parse_timeout("100m") == pytest.approx(0.1)
    assert h2server.parse_timeout("2S") == 2.0
    assert h2server.parse_timeout("1H") == 3600.0
    assert h2server.parse_timeout("123456789m") is None  # over 8 digits
    assert h2server.parse_timeout("10x") is None
    assert h2server.parse_timeout("") is None
    for seconds in (0.0000001, 0.25, 99.0, 150.0, 86_400.0 * 365):  # the channel's, read back
        sent = h2server.parse_timeout(timeout_header(seconds))
        assert sent is not None and seconds <= sent <= seconds * 1.001 + 1e-6


# -- the channel to Triton, against a grpc.aio server -----------------------------------------


def _with_aio_server(test: Callable[[TritonChannel, _Seen], Awaitable[None]]) -> None:
    async def run() -> None:
        seen = _Seen()

        async def unary(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            seen.metadata = tuple(context.invocation_metadata() or ())
            context.set_trailing_metadata((("x-served-by", "7"),))
            return _reply(request)

        async def fails(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            context.set_trailing_metadata((("x-why", "because"),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad: 100% ünicode")
            raise AssertionError("abort raises")

        async def slow(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            await seen.hold()
            return b""

        async def replies(
            requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
        ) -> AsyncIterator[bytes]:
            """As many replies as the request's first byte, then a status from its second;
            255: one reply, then it waits."""
            async for request in requests:
                for i in range(1 if request[0] == 255 else request[0]):
                    yield bytes([i]) * 70_000  # past the first window by the second reply
                if request[1]:
                    await context.abort(grpc.StatusCode(_CODES[request[1]]), "stopped")
                if request[0] == 255:
                    await seen.hold()

        handlers: dict[str, Any] = {
            name: grpc.unary_unary_rpc_method_handler(handler)
            for name, handler in (("Unary", unary), ("Fails", fails), ("Slow", slow))
        }
        handlers["Stream"] = grpc.stream_stream_rpc_method_handler(replies)
        server = grpc.aio.server(options=(("grpc.max_receive_message_length", 2**30),))
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("test.Service", handlers),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = TritonChannel(f"127.0.0.1:{port}")
        try:
            await test(channel, seen)
        finally:
            await channel.close()
            await server.stop(0)

    asyncio.run(run())


def test_the_channel_is_answered_whole_by_grpcio_past_the_windows() -> None:
    async def test(channel: TritonChannel, seen: _Seen) -> None:
        for reply_bytes, request_bytes in ((0, 4), (1_000_000, 4), (10, 1_000_000)):
            request = _request(reply_bytes, request_bytes)
            replies = await asyncio.gather(*(channel.call(PATH, request) for _ in range(20)))
            assert replies == [_reply(request)] * 20
        with pytest.raises(GrpcError) as missing:
            await channel.call("/test.Service/Nothing", b"")
        assert missing.value.code == Status.UNIMPLEMENTED

    _with_aio_server(test)


def test_the_channel_carries_metadata_statuses_and_trailers() -> None:
    async def test(channel: TritonChannel, seen: _Seen) -> None:
        sent = (("x-text", "a b"), ("x-blob-bin", b"\x00\xff\x10"))
        await channel.call(PATH, _request(1, 8), sent)
        assert set(sent) <= set(seen.metadata)
        # An OK reply's trailers, where the caller asks for them (the load generator does).
        trailing: list[tuple[str, str | bytes]] = []
        assert await channel.call(PATH, _request(1, 8), (), None, trailing) == _reply(
            _request(1, 8)
        )
        assert trailing == [("x-served-by", "7")]
        with pytest.raises(GrpcError) as failed:
            await channel.call("/test.Service/Fails", b"")
        assert failed.value.code == Status.INVALID_ARGUMENT
        assert failed.value.details == "bad: 100% ünicode"
        assert ("x-why", "because") in failed.value.trailing

    _with_aio_server(test)


def test_the_channel_stops_triton_on_a_deadline_and_a_cancel() -> None:
    async def test(channel: TritonChannel, seen: _Seen) -> None:
        with pytest.raises(GrpcError) as late:
            await channel.call("/test.Service/Slow", b"", timeout_s=0.3)
        assert late.value.code == Status.DEADLINE_EXCEEDED
        await asyncio.wait_for(seen.cancelled.wait(), 5)
        seen.cancelled.clear()
        seen.started.clear()
        call = asyncio.ensure_future(channel.call("/test.Service/Slow", b""))
        await asyncio.wait_for(seen.started.wait(), 5)
        call.cancel()
        await asyncio.wait_for(seen.cancelled.wait(), 5)  # RST_STREAM reached the server
        request = _request(2, 8)
        assert await channel.call(PATH, request) == _reply(request)  # and it serves on

    _with_aio_server(test)


_CODES = {code.value[0]: code.value for code in grpc.StatusCode}


def test_the_channel_streams_replies_as_they_come_then_the_status() -> None:
    async def test(channel: TritonChannel, seen: _Seen) -> None:
        got = [r async for r in channel.stream(STREAM, bytes([3, 0]))]
        assert got == [bytes([i]) * 70_000 for i in range(3)]
        got = []
        with pytest.raises(GrpcError) as stopped:
            async for reply in channel.stream(STREAM, bytes([2, Status.NOT_FOUND])):
                got.append(reply)
        assert len(got) == 2 and stopped.value.code == Status.NOT_FOUND
        assert stopped.value.details == "stopped"
        # Left before its end: the call is reset, and the server's handler stops.
        async with contextlib.aclosing(channel.stream(STREAM, bytes([255, 0]))) as replies:
            async for _ in replies:
                break
        await asyncio.wait_for(seen.cancelled.wait(), 5)

    _with_aio_server(test)


def test_the_channel_bounds_tritons_replies_and_serves_on() -> None:
    async def test(channel: TritonChannel, seen: _Seen) -> None:
        bounded = TritonChannel(channel.url, max_message_bytes=60_000)
        try:
            with pytest.raises(GrpcError) as large:
                await bounded.call(PATH, _request(1_000_000, 8))
            assert large.value.code == Status.RESOURCE_EXHAUSTED
            assert "1000004 vs. 60000" in large.value.details
            with pytest.raises(GrpcError) as stream:
                async for _ in bounded.stream(STREAM, bytes([1, 0])):
                    pass
            assert stream.value.code == Status.RESOURCE_EXHAUSTED
            request = _request(50_000, 8)
            assert await bounded.call(PATH, request) == _reply(request)
        finally:
            await bounded.close()

    _with_aio_server(test)


def test_the_channel_to_nothing_is_unavailable() -> None:
    async def run() -> None:
        channel = TritonChannel(f"127.0.0.1:{free_port()}")
        with pytest.raises(GrpcError) as down:
            await channel.call(PATH, b"")
        assert down.value.code == Status.UNAVAILABLE
        await channel.close()

    asyncio.run(run())
    with pytest.raises(ValueError, match="host:port"):
        TritonChannel("no-port")
