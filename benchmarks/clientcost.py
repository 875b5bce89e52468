"""What the load generator's own HTTP client costs per request, beside aiohttp's.

A load generator's client is part of every latency it reports, and on a small machine it takes
CPU from the sidecar and Triton it measures. ``python -m benchmarks.clientcost`` sends KServe v2
inference requests to a server that answers each at once with a fixed reply (uvloop and
httptools, in a process of its own), through ``loadgen``'s client (``send_one``: kept-alive
connections, replies parsed by httptools) and through a plain aiohttp session (the common Python
choice, and the one ``loadgen`` used before), in alternating rounds at each concurrency. It
reports the client process's CPU time per request and the p50 round trip, and writes
``clientcost.{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httptools
import numpy as np
import uvloop

from api.embedded import INPUT_WIDTH, free_port
from benchmarks.floor import ready_until_stdin_closes, server_process
from loadgen.classes import RequestClass
from loadgen.engine import Recorder, Sample, Target, build_payloads, new_session, send_one
from simulator.results import DEFAULT_DIR, markdown_table, write_results

MODEL = "noop"
REPLY_BODY = (
    b'{"model_name":"noop","outputs":'
    b'[{"name":"OUTPUT0","datatype":"FP32","shape":[1,1],"data":[0.0]}]}'
)
REPLY = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(REPLY_BODY),
    REPLY_BODY,
)
CLIENTS = ("loadgen", "aiohttp")


class _Answer(asyncio.Protocol):
    """Answers every request on the connection with :data:`REPLY` once its body is in."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.parser = httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.transport.write(REPLY)  # type: ignore[attr-defined]


async def serve(port: int) -> None:
    """Answer on ``port`` until stdin closes."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Answer, "127.0.0.1", port)
    await ready_until_stdin_closes(port)
    server.close()


async def cost(client: str, url: str, concurrency: int, requests: int) -> tuple[float, float]:
    """(CPU µs per request in this process, p50 round trip µs) of ``requests`` at
    ``concurrency`` through ``client``."""
    data = np.ones((1, INPUT_WIDTH), dtype=np.float32)
    target = Target(url, MODEL, build_payloads([RequestClass("bench")], data=data), [1.0])
    payload = target.payloads[0]
    async with new_session() as session:
        rec = Recorder()
        one: Callable[[], Awaitable[None]]
        if client == "loadgen":

            async def one() -> None:
                await send_one(session, target, 0, rec)

        else:
            plain = aiohttp.ClientSession()

            async def one() -> None:
                start = time.monotonic()
                async with plain.post(
                    f"http://{url}{target.path}", data=payload.body, headers=payload.headers
                ) as reply:
                    await reply.read()
                rec.add(Sample(start, time.monotonic(), 0, reply.status))

        each = max(1, requests // concurrency)

        async def loop(n: int) -> None:
            for _ in range(n):
                await one()

        await asyncio.gather(*(loop(20) for _ in range(concurrency)))  # connections open
        rec.samples.clear()
        started = time.process_time()
        await asyncio.gather(*(loop(each) for _ in range(concurrency)))
        cpu_s = time.process_time() - started
        if client != "loadgen":
            await plain.close()
    latencies = [s.latency_s for s in rec.samples]
    if len(latencies) != each * concurrency or any(s.status != 200 for s in rec.samples):
        raise RuntimeError(f"{client}: not every request was answered")
    return cpu_s / len(latencies) * 1e6, float(np.median(latencies)) * 1e6


def span(values: list[float]) -> str:
    """A sorted list's median (min-max)."""
    return f"{values[len(values) // 2]:.1f} ({values[0]:.1f}-{values[-1]:.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.clientcost", description=__doc__)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--requests", type=int, default=4000, help="per round and client")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        uvloop.run(serve(args.serve))
        return 0
    rows: list[dict[str, object]] = []
    table: list[tuple[str, int, str, str]] = []
    port = free_port()
    with server_process("the reply server", "benchmarks.clientcost", "--serve", str(port)):
        for c in (int(x) for x in args.concurrency.split(",")):
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name in CLIENTS}
            for _ in range(args.rounds):
                for name in CLIENTS:
                    runs[name].append(uvloop.run(cost(name, f"127.0.0.1:{port}", c, args.requests)))
            for name in CLIENTS:
                cpu = sorted(r[0] for r in runs[name])
                p50 = sorted(r[1] for r in runs[name])
                rows.append({"client": name, "concurrency": c, "cpu_us": cpu, "p50_us": p50})
                table.append((name, c, span(cpu), span(p50)))
                print(
                    f"  {name:>8} concurrency {c:>2}: CPU {cpu[len(cpu) // 2]:6.1f} µs per "
                    f"request, p50 round trip {p50[len(p50) // 2]:7.1f} µs",
                    flush=True,
                )
    md, _ = write_results(
        "clientcost",
        title="The load generator's HTTP client per request (python -m benchmarks.clientcost)",
        markdown=f"Against a server that answers at once (its own process); {args.rounds} "
        f"alternating rounds of {args.requests} requests per client and concurrency; median "
        "(min-max) over the rounds.\n\n"
        + markdown_table(
            ["client", "concurrency", "client CPU µs per request", "p50 round trip µs"],
            table,
        ),
        data={"settings": vars(args) | {"results_dir": str(args.results_dir)}, "cost": rows},
        directory=args.results_dir,
    )
    print(f"written to {md} (and .json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
