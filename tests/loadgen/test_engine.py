"""The load generator's inference client against a small HTTP server in the test's own loop."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest

from api.embedded import free_port
from loadgen.classes import RequestClass
from loadgen.engine import Recorder, Target, build_payloads, new_session, send_one

REPLY = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-sidecar-gpu: 1\r\n\r\n{}"


def target(url: str) -> Target:
    data = np.ones((1, 4), dtype=np.float32)
    return Target(url, "m", build_payloads([RequestClass("c")], data=data), [1.0])


def test_samples_carry_the_reply_its_times_and_gpu_over_one_kept_alive_connection() -> None:
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                writer.write(REPLY)
        except asyncio.IncompleteReadError:
            writer.close()

    async def main() -> Recorder:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        rec = Recorder()
        async with new_session() as session:
            for _ in range(3):
                await send_one(session, target(url), 0, rec)
        server.close()
        await server.wait_closed()
        return rec

    rec = asyncio.run(main())
    assert connections == 1  # kept alive between requests, closed with the session
    assert [s.status for s in rec.samples] == [200, 200, 200]
    for s in rec.samples:
        assert s.start_s <= s.sent_s <= s.headers_s <= s.end_s
        assert s.gpu == "1"


def test_nobody_listening_is_status_zero_and_sessions_come_from_new_session() -> None:
    async def main() -> Recorder:
        rec = Recorder()
        async with new_session(timeout_s=5.0) as session:
            await send_one(session, target(f"127.0.0.1:{free_port()}"), 0, rec)
        async with aiohttp.ClientSession() as plain:
            with pytest.raises(ValueError, match="new_session"):
                await send_one(plain, target("127.0.0.1:1"), 0, rec)
        return rec

    rec = asyncio.run(main())
    assert [s.status for s in rec.samples] == [0]
    assert rec.errors == {0: 1}
