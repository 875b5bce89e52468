"""The upstream client against a small HTTP server in the test's own event loop (loopback)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from api.upstream import Upstream
from api.upstream_errors import UpstreamUnavailableError

Reply = Callable[[bytes], bytes | None]  # the request's head -> the bytes to answer (None: none)


def reply(body: bytes, *, extra: str = "", close: bool = False) -> bytes:
    head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n{extra}"
    if close:
        head += "connection: close\r\n"
    return (head + "\r\n").encode() + body


@dataclass
class Server:
    """Answers each request as ``answer`` says; counts connections and keeps the requests."""

    answer: Reply
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    requests: list[bytes] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                data = self.answer(head)
                if data is None:
                    continue
                writer.write(data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open_now -= 1
            writer.close()


@asynccontextmanager
async def serving(answer: Reply, **options: Any) -> AsyncIterator[tuple[Server, Upstream]]:
    server = Server(answer)
    tcp = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    port = tcp.sockets[0].getsockname()[1]
    upstream = Upstream(f"127.0.0.1:{port}", max_connections=2, timeout_s=5.0, **options)
    await upstream.open()
    try:
        yield server, upstream
    finally:
        await upstream.close()
        for writer in server.writers:
            writer.close()
        tcp.close()
        await tcp.wait_closed()


def test_kept_alive_connections_are_reused_and_bounded() -> None:
    async def main() -> Server:
        async def slow(upstream: Upstream) -> int:
            return (await upstream.request("POST", "/v2/models/m/infer", b"x" * 10)).status

        async with serving(lambda head: reply(b"{}")) as (server, upstream):
            for _ in range(3):
                assert (await upstream.request("GET", "/v2/health/ready")).ok
            assert server.connections == 1
            statuses = await asyncio.gather(*(slow(upstream) for _ in range(6)))
            assert statuses == [200] * 6
            return server

    server = asyncio.run(main())
    assert server.most_open <= 2  # max_connections
    assert server.requests[3].endswith(b"\r\n\r\n" + b"x" * 10)


def test_a_chunked_reply_comes_whole_with_only_the_headers_forwarded() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: application/json\r\n"
        b'x-private: no\r\n\r\n3\r\n{"a\r\n4\r\n": 1\r\n1\r\n}\r\n0\r\n\r\n'
    )

    async def main() -> tuple[int, bytes, dict[str, str]]:
        async with serving(lambda head: chunked) as (_, upstream):
            r = await upstream.request("GET", "/v2")
            return r.status, r.body, r.headers

    assert asyncio.run(main()) == (200, b'{"a": 1}', {"content-type": "application/json"})


def test_the_headers_asked_for_are_kept_and_the_exchange_is_timed() -> None:
    answer = reply(b"{}", extra="content-type: application/json\r\nX-Sidecar-GPU: 1\r\n")

    async def main() -> list[tuple[float, float, float, float, dict[str, str]]]:
        out = []
        async with serving(lambda head: answer, keep_headers=("x-sidecar-gpu",)) as (_, up):
            for _ in range(2):  # a fresh connection, then a kept-alive one
                start = time.monotonic()
                r = await up.request("POST", "/v2/models/m/infer", b"{}")
                out.append((start, r.sent_s, r.headers_s, time.monotonic(), r.headers))
        return out

    for start, sent, headers_at, end, headers in asyncio.run(main()):
        assert start <= sent <= headers_at <= end
        assert headers == {"x-sidecar-gpu": "1"}  # content-type is not asked for


def test_a_connection_closed_while_idle_is_replaced_without_an_error() -> None:
    async def main() -> tuple[int, int]:
        async with serving(lambda head: reply(b"ok")) as (server, upstream):
            assert (await upstream.request("GET", "/a")).body == b"ok"
            for writer in server.writers:  # Triton drops the kept-alive connection
                writer.close()
            await asyncio.sleep(0.05)
            r = await upstream.request("POST", "/b", b"{}")
            return r.status, server.connections

    assert asyncio.run(main()) == (200, 2)


def test_begin_writes_on_an_idle_connection_before_the_reply_is_awaited() -> None:
    async def main() -> tuple[int, int, int, int]:
        async with serving(lambda head: reply(b"ok")) as (server, upstream):
            assert (await upstream.request("GET", "/warm")).ok  # one kept-alive connection
            pending = upstream.begin("POST", "/v2/models/m/infer", b"{}")
            for _ in range(100):  # the server reads it though nobody awaits the reply yet
                if len(server.requests) == 2:
                    break
                await asyncio.sleep(0.01)
            seen = len(server.requests)
            status = (await pending).status
            return seen, status, len(server.requests), server.connections

    assert asyncio.run(main()) == (2, 200, 2, 1)


def test_a_reply_given_up_on_closes_its_connection_and_frees_its_place() -> None:
    async def main() -> tuple[int, int, int]:
        async with serving(lambda head: None if b"/hang" in head else reply(b"ok")) as (
            server,
            upstream,
        ):
            for _ in range(3):  # each waiter cancelled: max_connections is 2
                waiter = asyncio.ensure_future(upstream.begin("GET", "/hang"))
                await asyncio.sleep(0.02)
                waiter.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiter
            status = (await upstream.request("GET", "/after", timeout_s=1.0)).status
            await asyncio.sleep(0.05)
            return status, server.connections, server.open_now

    # every hung connection was closed (the next request needed a fresh one and got it)
    assert asyncio.run(main()) == (200, 4, 1)


def test_no_answer_in_time_and_nobody_listening_are_unavailable() -> None:
    async def main() -> None:
        async with serving(lambda head: None) as (_, upstream):
            with pytest.raises(UpstreamUnavailableError, match=r"no answer in 0\.1 s"):
                await upstream.request("GET", "/hang", timeout_s=0.1)
        with pytest.raises(UpstreamUnavailableError, match="closed"):
            await upstream.request("GET", "/")  # closed with the block
        nobody = Upstream("127.0.0.1:1", timeout_s=1.0)
        await nobody.open()
        with pytest.raises(UpstreamUnavailableError, match="unavailable"):
            await nobody.request("GET", "/")

    asyncio.run(main())


def test_a_path_is_quoted_so_it_cannot_add_a_header() -> None:
    async def main() -> bytes:
        async with serving(lambda head: reply(b"")) as (server, upstream):
            await upstream.request("GET", "/v2/models/a b\r\nx-evil: 1/config")
            return server.requests[0]

    head = asyncio.run(main())
    assert head.startswith(b"GET /v2/models/a%20b%0D%0Ax-evil%3A%201/config HTTP/1.1\r\n")
    assert b"\r\nx-evil" not in head


def test_a_streamed_reply_arrives_in_pieces() -> None:
    head = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n"
    )

    async def main() -> tuple[int, dict[str, str], list[bytes]]:
        first = head + b"5\r\nhello\r\n"  # the rest only once the first piece is read
        async with (
            serving(lambda _: first) as (server, upstream),
            upstream.stream("POST", "/v2/models/m/generate_stream", b"{}") as s,
        ):
            pieces = []
            async for chunk in s.chunks:
                pieces.append(chunk)
                if len(pieces) == 1:
                    server.writers[0].write(b"5\r\nworld\r\n0\r\n\r\n")
            return s.status, s.headers, pieces

    status, headers, pieces = asyncio.run(main())
    assert (status, headers, pieces) == (
        200,
        {"content-type": "text/event-stream"},
        [b"hello", b"world"],
    )
