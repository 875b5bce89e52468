"""The sidecar's HTTP protocol serving inference itself (no ASGI), fed bytes as the event loop
would feed them, in front of a fake Triton (:mod:`benchmarks.pathbench`): replies, bounds,
deadlines, and a client that leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, cast

import pytest
import uvicorn
from uvicorn.server import ServerState

from api.connection import bounded_protocol
from api.embedded import NOOP
from api.runtime import Runtime
from benchmarks import pathbench

BODY = (
    b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": '
    + str([1.0] * 16).encode()
    + b"}]}"
)


def request(path: str = f"/v2/models/{NOOP}/infer", body: bytes = BODY, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "host: sidecar", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Transport:
    """The client's end: what the protocol writes, and whether it closed."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Connection:
    def __init__(self, rt: Runtime, app: Any, timeout_s: float) -> None:
        config = uvicorn.Config(app, http=bounded_protocol(8192, timeout_s, rt), log_level="error")
        config.load()
        protocol_class = cast(Any, config.http_protocol_class)
        self.protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
        self.transport = Transport()
        self.protocol.connection_made(self.transport)

    def send(self, data: bytes) -> None:
        self.protocol.data_received(data)

    async def replies(self, n: int, timeout_s: float = 5.0) -> list[bytes]:
        """The first ``n`` writes that are replies (a 100 Continue is not one)."""
        async with asyncio.timeout(timeout_s):
            while len(self.out()) < n:
                await asyncio.sleep(0.001)
        return self.out()

    def out(self) -> list[bytes]:
        return [w for w in self.transport.written if not w.startswith(b"HTTP/1.1 100")]


class Asgi:
    """The app behind the protocol: records what reaches it."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def rt() -> Iterator[Runtime]:
    with pathbench.runtime(max_body_bytes=4096, max_inflight=1) as runtime:
        yield runtime


def run(rt: Runtime, test: Any) -> Any:
    async def main() -> Any:
        async with pathbench.serving(rt):
            return await test()

    return asyncio.run(main())


def outcomes(rt: Runtime, outcome: str) -> float:
    total = 0.0
    for metric in rt.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "sidecar_requests_total" and sample.labels["outcome"] == outcome:
                total += sample.value
    return total


def test_inference_is_answered_in_one_write_on_a_kept_alive_connection(rt: Runtime) -> None:
    app = Asgi()

    async def test() -> list[bytes]:
        conn = Connection(rt, app, 10.0)
        conn.send(request())
        await conn.replies(1)
        conn.send(request(f"/v2/models/{NOOP}/versions/1/infer", BODY, "expect: 100-continue"))
        replies = await conn.replies(2)
        assert conn.transport.written[1] == b"HTTP/1.1 100 Continue\r\n\r\n"
        assert not conn.transport.closing
        return replies

    replies = run(rt, test)
    for reply in replies:
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert f"content-length: {len(body)}".encode() in head
        assert body == pathbench.TRITON_REPLY.partition(b"\r\n\r\n")[2]
    assert app.paths == []  # nothing went through ASGI
    assert outcomes(rt, "ok") == 2


def test_other_paths_go_to_the_app(rt: Runtime) -> None:
    app = Asgi()

    async def test() -> list[bytes]:
        conn = Connection(rt, app, 10.0)
        conn.send(request("/v2/models/noop/ready"))
        return await conn.replies(1)

    assert run(rt, test)[0].startswith(b"HTTP/1.1 204")
    assert app.paths == ["/v2/models/noop/ready"]


def test_bodies_past_the_bound_are_413_and_the_connection_closes(rt: Runtime) -> None:
    async def test() -> tuple[bytes, bytes]:
        declared = Connection(rt, Asgi(), 10.0)
        declared.send(request(body=b"x" * 5000))
        chunked = Connection(rt, Asgi(), 10.0)
        head = f"POST /v2/models/{NOOP}/infer HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
        chunked.send(head.encode())
        for _ in range(5):  # 5 × 1000 bytes, no length announced
            chunked.send(b"3e8\r\n" + b"x" * 1000 + b"\r\n")
        a, b = await declared.replies(1), await chunked.replies(1)
        assert declared.transport.closing and chunked.transport.closing
        return a[0], b[0]

    for reply in run(rt, test):
        assert reply.startswith(b"HTTP/1.1 413") and b"max-body-bytes" in reply
    assert rt.dispatcher is not None and rt.dispatcher.scheduler.queue_len == 0


def test_a_body_that_stalls_is_cut_off(rt: Runtime) -> None:
    async def test() -> bytes:
        conn = Connection(rt, Asgi(), 0.05)
        conn.send(request()[:-10])  # the last 10 bytes never come
        reply = (await conn.replies(1))[0]
        assert conn.transport.closing
        return reply

    assert run(rt, test).startswith(b"HTTP/1.1 408")


def test_a_client_that_leaves_takes_its_request_out_of_the_queue(rt: Runtime) -> None:
    async def test() -> tuple[list[bytes], int]:
        first, second = Connection(rt, Asgi(), 10.0), Connection(rt, Asgi(), 10.0)
        first.send(request())
        second.send(request())
        await asyncio.sleep(0)  # both admitted: the first at Triton (cap 1), the second queued
        assert rt.dispatcher is not None
        queued = rt.dispatcher.scheduler.queue_len
        second.protocol.connection_lost(None)
        replies = await first.replies(1)
        await asyncio.sleep(0.01)
        assert second.out() == []
        return replies, queued

    replies, queued = run(rt, test)
    assert queued == 1
    assert replies[0].startswith(b"HTTP/1.1 200")
    assert rt.dispatcher is not None and rt.dispatcher.scheduler.queue_len == 0
    assert outcomes(rt, "abandoned") == 1 and outcomes(rt, "ok") == 1


def test_a_requests_time_counts_from_its_first_byte(rt: Runtime) -> None:
    """Its parse, body and admission are the sidecar's time: in its latency (and deadline)."""
    whole = request()
    split = len(whole) - len(BODY)

    async def test() -> None:
        conn = Connection(rt, Asgi(), 10.0)
        conn.send(whole[:split])  # the headers, then the body 50 ms later
        await asyncio.sleep(0.05)
        conn.send(whole[split:])
        await conn.replies(1)

    run(rt, test)
    latency = {
        s.name: s.value
        for metric in rt.metrics.registry.collect()
        for s in metric.samples
        if s.name.startswith("sidecar_request_duration_seconds")
    }
    assert latency["sidecar_request_duration_seconds_count"] == 1
    assert latency["sidecar_request_duration_seconds_sum"] >= 0.05
