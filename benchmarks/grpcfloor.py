"""What gRPC costs before the sidecar does anything: the floor of its two gRPC hops.

A ``grpc.aio`` server in a process of its own answers ``ModelInfer`` with a fixed reply (no
parsing, no scheduling, no Triton), and this process calls it in a closed loop over one
``grpc.aio`` channel, as the sidecar's front end and its channel to Triton do. Printed: the
server's CPU per call (its own ``/proc`` accounting) and the client's (this process's CPU time).
The sidecar's gRPC path pays both per request, on top of its own work, so neither its CPU nor
its added latency can go below their sum with this library.

Beside it, the same fixed reply from grpcio's synchronous server (a thread pool): what a front
end on it would pay in the library, before the hand-off of each call to the sidecar's event loop
and back that such a front end would add (its handlers here return at once). And from the least
an HTTP/2 server written in Python on uvloop does for a unary call (:mod:`benchmarks.h2floor`):
what a front end that is not grpcio's could cost, called by the same grpc.aio client.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import uvloop

from api.embedded import INPUT_WIDTH, NOOP, free_port
from api.grpc_frontend.protocol import MODEL_INFER, method_path
from benchmarks.bench import process_cpu_s
from benchmarks.floor import (
    model_infer_server,
    ready_until_stdin_closes,
    serve_model_infer,
    server_process,
)
from benchmarks.h2floor import UnaryGrpcClient, unary_server
from loadgen.classes import RequestClass
from loadgen.engine import InputTensor
from loadgen.grpc_client import GrpcClient, grpc_payloads
from simulator.results import DEFAULT_DIR, markdown_table, write_results

REPLY = b"\n\x04noop\x12\x011"
# grpc.aio's server; grpcio's synchronous one on a thread pool; a minimal HTTP/2 one on uvloop
SERVERS = ("aio", "sync", "h2")
# The clients each server is called by: grpc.aio's always; the minimal HTTP/2 one against
# grpc.aio's server (a channel to Triton's gRPC port would be its use) and against its own.
CLIENTS = {"aio": ("aio", "h2"), "sync": ("aio",), "h2": ("aio", "h2")}
SYNC_WORKERS = 32


async def serve(port: int) -> None:
    """The server: a fixed reply to every ``ModelInfer``, until stdin closes."""

    async def infer(_: bytes, __: object) -> bytes:
        return REPLY

    server = await model_infer_server(port, infer)
    await ready_until_stdin_closes()
    await server.stop(0)


async def serve_h2(port: int) -> None:
    """The same fixed reply from :mod:`benchmarks.h2floor`, until stdin closes."""
    server = await unary_server(port, {method_path(MODEL_INFER): lambda _: REPLY})
    await ready_until_stdin_closes()
    server.close()


def serve_sync(port: int) -> None:
    """The same fixed reply from grpcio's synchronous server, until stdin closes."""

    def infer(_: bytes, __: grpc.ServicerContext) -> bytes:
        return REPLY

    server = grpc.server(ThreadPoolExecutor(max_workers=SYNC_WORKERS))
    serve_model_infer(server, port, infer)
    server.start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.read()
    server.stop(0)


async def load(
    url: str, concurrency: int, duration_s: float, server_pid: int, client_kind: str = "aio"
) -> dict[str, float]:
    """Closed loops of ``ModelInfer`` calls over one connection of ``client_kind`` (``aio``:
    the load generator's grpc.aio client; ``h2``: :class:`benchmarks.h2floor.UnaryGrpcClient`);
    the calls per second and each side's CPU per call."""
    tensors = [InputTensor("INPUT0", "FP32", np.ones((1, INPUT_WIDTH), dtype=np.float32))]
    raw = grpc_payloads([RequestClass("bench")], tensors, NOOP, None)[0].body
    calls = 0
    host, port = url.rsplit(":", 1)
    path = method_path(MODEL_INFER)
    h2 = UnaryGrpcClient(host, int(port))
    aio = GrpcClient(url, "grpcio")

    async def by_h2() -> None:
        if await h2.call(path, raw) != REPLY:
            raise RuntimeError("the server's reply is not the fixed one")

    async def by_aio() -> None:
        status, *_ = await aio.infer(raw)
        if status != 200:
            raise RuntimeError(f"the server answered {status}")

    one = by_h2 if client_kind == "h2" else by_aio  # chosen once, not per call
    async with h2 if client_kind == "h2" else aio:

        async def loop(until: float, count: bool) -> None:
            nonlocal calls
            while time.monotonic() < until:
                await one()
                calls += count

        await asyncio.gather(*(loop(time.monotonic() + 0.5, False) for _ in range(concurrency)))
        server0, client0 = process_cpu_s(server_pid), time.process_time()
        start = time.monotonic()
        await asyncio.gather(*(loop(start + duration_s, True) for _ in range(concurrency)))
        server_s, client_s = process_cpu_s(server_pid) - server0, time.process_time() - client0
    return {
        "calls_per_s": calls / duration_s,
        "server_cpu_us": server_s / calls * 1e6,
        "client_cpu_us": client_s / calls * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grpcfloor", description=__doc__)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument(
        "--results-dir", type=Path, default=DEFAULT_DIR, help="where grpcfloor.{md,json} go"
    )
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server process
    parser.add_argument("--server", choices=SERVERS, default="aio", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    if args.serve is not None:
        if args.server == "sync":
            serve_sync(args.serve)
        elif args.server == "h2":
            uvloop.run(serve_h2(args.serve))
        else:
            uvloop.run(serve(args.serve))
        return 0
    print("gRPC alone, a fixed reply, loopback (the floor of each of the sidecar's hops):")
    rows = []
    for kind in SERVERS:
        port = free_port()
        what = f"the fixed gRPC server ({kind})"
        args_ = ("--serve", str(port), "--server", kind)
        with server_process(what, "benchmarks.grpcfloor", *args_) as (server, _):
            for client_kind in CLIENTS[kind]:
                for c in concurrencies:
                    url = f"127.0.0.1:{port}"
                    r = uvloop.run(load(url, c, args.duration_s, server.pid, client_kind))
                    rows.append({"server": kind, "client": client_kind, "concurrency": c, **r})
                    print(
                        f"  {kind:>4} server, {client_kind:>3} client, concurrency {c:>2}: "
                        f"{r['calls_per_s']:.0f} calls/s; CPU per call: server "
                        f"{r['server_cpu_us']:.0f} µs, client {r['client_cpu_us']:.0f} µs"
                    )
    md, _ = write_results(
        "grpcfloor",
        title="What gRPC costs alone (python -m benchmarks.grpcfloor)",
        markdown="A server answering a fixed reply (`aio`: grpc.aio's; `sync`: grpcio's "
        f"synchronous server on {SYNC_WORKERS} threads, its handler returning at once; `h2`: "
        "the least an HTTP/2 server in Python on uvloop does for a unary call, "
        "`benchmarks/h2floor.py`, a floor and not a front end), called over one connection "
        "(`aio`: the load generator's grpc.aio channel; `h2`: the least HTTP/2 client in "
        f"Python, the same module) in closed loops of {args.duration_s:g} s; CPU per call of "
        "each side.\n\n"
        + markdown_table(
            [
                "server",
                "client",
                "concurrency",
                "calls/s",
                "server CPU µs/call",
                "client CPU µs/call",
            ],
            [
                (
                    r["server"],
                    r["client"],
                    r["concurrency"],
                    f"{r['calls_per_s']:.0f}",
                    f"{r['server_cpu_us']:.0f}",
                    f"{r['client_cpu_us']:.0f}",
                )
                for r in rows
            ],
        ),
        data={"settings": {"duration_s": args.duration_s}, "cost": rows},
        directory=args.results_dir,
    )
    print(f"written to {md} (and .json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
