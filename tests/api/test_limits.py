"""Connection limits: body and header sizes, slow clients, open connections."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.api.live import LiveSidecar, embedded_config

BODY = (
    b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": '
    + str([1.0] * 16).encode()
    + b"}]}"
)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveSidecar]:
    config = embedded_config(
        tmp_path_factory.mktemp("state"),
        max_body_bytes=1_000_000,
        max_header_bytes=8192,
        read_timeout_s=1.0,
        max_connections=40,
    )
    with LiveSidecar(config) as sc:
        yield sc


def raw(sc: LiveSidecar, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it."""
    host, port = sc.url.split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_body_over_the_limit_is_413(sidecar: LiveSidecar) -> None:
    big = b'{"inputs": [' + b" " * 2_000_000 + b"]}"
    r = sidecar.post("/v2/models/simnet/infer", content=big)
    assert r.status_code == 413 and "max-body-bytes" in r.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while it streams
        for _ in range(40):
            yield b" " * 50_000

    r = sidecar.post("/v2/models/simnet/infer", content=chunks())
    assert r.status_code == 413
    assert sidecar.post("/v2/models/simnet/infer", content=BODY).status_code == 200


def test_header_over_the_limit_is_431(sidecar: LiveSidecar) -> None:
    reply = raw(sidecar, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 64_000)
    assert reply.startswith(b"HTTP/1.1 431") and b'"error"' in reply


def test_a_refused_client_still_sending_reads_its_431(sidecar: LiveSidecar) -> None:
    """The header goes past the limit and keeps coming after the 431 is written: the sidecar
    reads and drops the rest until the client is done, so no reset overtakes its reply."""
    host, port = sidecar.url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: ")
        for _ in range(50):  # 800 KB after the 8 KB limit
            s.sendall(b"a" * 16_000)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    reply = b"".join(chunks)
    assert reply.startswith(b"HTTP/1.1 431") and b'"error"' in reply


def test_slow_headers_are_cut_off_and_others_are_served(sidecar: LiveSidecar) -> None:
    host, port = sidecar.url.split(":")
    slow = [socket.create_connection((host, int(port)), timeout=10) for _ in range(20)]
    try:
        for s in slow:
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\nX-Slow: ")
        assert sidecar.post("/v2/models/simnet/infer", content=BODY).status_code == 200
        for _ in range(30):  # 3 s of one byte per 0.1 s on each: headers that never end
            for s in slow:
                with contextlib.suppress(OSError):
                    s.sendall(b"a")
            time.sleep(0.1)
        replies = []
        for s in slow:
            try:
                replies.append(s.recv(4096))
            except OSError as err:  # reset after the reply: the reply was read or lost
                replies.append(repr(err).encode())
        assert sum(r.startswith(b"HTTP/1.1 408") for r in replies) >= 15, replies[:3]
    finally:
        for s in slow:
            s.close()


def test_open_connections_are_capped(sidecar: LiveSidecar) -> None:
    host, port = sidecar.url.split(":")
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(45)]
    try:
        time.sleep(0.2)
        r = httpx.get(f"http://{sidecar.url}/v2/health/live", timeout=10)
        assert r.status_code == 503
    finally:
        for s in idle:
            s.close()
    time.sleep(0.2)
    assert httpx.get(f"http://{sidecar.url}/v2/health/live", timeout=10).status_code == 200
