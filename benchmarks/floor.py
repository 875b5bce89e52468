"""The floor of a proxy in Python: what the sidecar's two hops cost before it does any work.

``python -m benchmarks.floor --triton-http HOST:PORT --triton-grpc HOST:PORT`` serves, in a
process of its own, the least a proxy in front of Triton can do with the libraries the sidecar
is built on:

- **HTTP**: uvloop and httptools, as the sidecar's inference path. Each client connection gets
  one kept-alive connection to Triton of its own (no pool to look up); a request's bytes are
  parsed only to find where it ends, sent to Triton as they came, and Triton's reply is parsed
  only to find where it ends and written back as it came, in one write each way.
- **gRPC**: the sidecar's own HTTP/2 server (:mod:`api.grpc_frontend.h2server`) whose one
  handler passes ``ModelInfer``'s bytes to Triton over the sidecar's own channel
  (:mod:`api.grpc_frontend.channel`) and its reply back, as the sidecar's gRPC path does.

No admission, no queue, no scheduling, no metrics. ``python -m benchmarks.bench`` measures it in
the same rounds as the sidecar (``floor`` in its table): the sidecar's CPU per request and added
latency cannot go below this process's on the same machine, whatever the sidecar's own code does.
The process prints ``ready HTTP_PORT GRPC_PORT`` once both listen, and stops when stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import grpc
import httptools
import uvloop

from api.embedded import free_port
from api.grpc_frontend.channel import TritonChannel
from api.grpc_frontend.h2server import Call, GrpcServer
from api.grpc_frontend.protocol import MODEL_INFER, SERVICE, method_path


class _Upstream(asyncio.Protocol):
    """One connection to Triton, owned by one client connection: replies go back whole."""

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.parser = httptools.HttpResponseParser(self)
        self.chunks: list[bytes] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        reply, self.chunks = b"".join(self.chunks), []
        self.client.reply(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    """One client connection: each request goes to Triton as it came, once it is whole."""

    def __init__(self, triton: tuple[str, int]) -> None:
        self.triton = triton
        self.parser = httptools.HttpRequestParser(self)
        self.chunks: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None
        self.waiting: list[bytes] = []  # requests whole before Triton's connection is up

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(lambda: _Upstream(self), *self.triton)
        except OSError:
            self.close()
            return
        self.upstream = upstream
        assert upstream.transport is not None
        for request in self.waiting:
            upstream.transport.write(request)
        self.waiting = []

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def on_message_complete(self) -> None:
        request, self.chunks = b"".join(self.chunks), []
        upstream = self.upstream
        if upstream is None or upstream.transport is None:
            self.waiting.append(request)
        else:
            upstream.transport.write(request)

    def reply(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _host_port(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").rstrip("/").rpartition(":")
    return host, int(port)


InferHandler = Callable[[bytes, "grpc.aio.ServicerContext[bytes, bytes]"], Awaitable[bytes]]
SyncInferHandler = Callable[[bytes, "grpc.ServicerContext"], bytes]


def serve_model_infer(
    server: grpc.Server | grpc.aio.Server, port: int, infer: InferHandler | SyncInferHandler
) -> None:
    """Give ``server`` (grpcio's or grpc.aio's, not started) one handler, ``infer``, taking and
    returning ``ModelInfer``'s raw bytes, on ``port`` of the loopback."""
    handler = grpc.unary_unary_rpc_method_handler(infer)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {MODEL_INFER: handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")


async def model_infer_server(port: int, infer: InferHandler) -> grpc.aio.Server:
    """A started ``grpc.aio`` server on ``port`` whose one handler, ``infer``, takes and
    returns ``ModelInfer``'s raw bytes."""
    server = grpc.aio.server()
    serve_model_infer(server, port, infer)
    await server.start()
    return server


@contextmanager
def server_process(
    what: str, module: str, *args: str
) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """``python -m MODULE ARGS``, once it prints its ready line (``ready`` and what it tells,
    ports say): the process and the words after ``ready``; stopped (:func:`stop_by_stdin`) on
    leaving."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        words = proc.stdout.readline().split()
        if words[:1] != ["ready"]:
            raise RuntimeError(f"{what} (python -m {module}) did not start")
        yield proc, words[1:]
    finally:
        stop_by_stdin(proc)


async def ready_until_stdin_closes(*words: object) -> None:
    """The server process's side of :func:`server_process`: print the ready line (``ready``
    and ``words``, ports say), then wait until the parent closes this process's stdin."""
    sys.stdout.write(" ".join(["ready", *map(str, words)]) + "\n")
    sys.stdout.flush()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


def stop_by_stdin(proc: subprocess.Popen[str]) -> None:
    """Stop a server process of these benchmarks: close its stdin, kill it if it lingers."""
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


async def serve(triton_http: str, triton_grpc: str, http_port: int, grpc_port: int) -> None:
    """Both floors until stdin closes."""
    loop = asyncio.get_running_loop()
    triton = _host_port(triton_http)
    http = await loop.create_server(lambda: _Client(triton), "127.0.0.1", http_port)
    channel = TritonChannel(triton_grpc.removeprefix("grpc://"))
    path = method_path(MODEL_INFER)

    async def infer(request: bytes, call: Call) -> bytes:
        return await channel.call(path, request)

    server = GrpcServer({path: infer}, {}, max_message_bytes=64 * 2**20)
    await server.start("127.0.0.1", grpc_port)
    await ready_until_stdin_closes(http_port, server.port)
    await server.stop(0)
    await channel.close()
    http.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__)
    parser.add_argument("--triton-http", required=True, help="Triton's HTTP HOST:PORT")
    parser.add_argument("--triton-grpc", required=True, help="Triton's gRPC HOST:PORT")
    parser.add_argument("--http-port", type=int, default=0, help="0: a free port")
    parser.add_argument("--grpc-port", type=int, default=0, help="0: a free port")
    args = parser.parse_args(argv)
    uvloop.run(
        serve(
            args.triton_http,
            args.triton_grpc,
            args.http_port or free_port(),
            args.grpc_port or free_port(),
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
