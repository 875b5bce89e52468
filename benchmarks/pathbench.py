"""The sidecar's own Python per inference request, in one process, without sockets or Triton.

The real code from the bytes of a request to the bytes of its reply: for HTTP the sidecar's
connection protocol is fed a request (as the event loop would), admission, the scheduler core
(policy ``max``), the dispatcher and the upstream client run as in production, and a fake
Triton answers each request on the next turn of the loop; for gRPC the front end's handler is
called with a ``ModelInferRequest`` and a fake Triton channel. CPU per request is this process's
CPU time over the run: what the code costs, apart from the kernel's share (socket reads and
writes) and other processes' load, so it moves only when the code does. ``make bench``'s live
figures (``python -m benchmarks.bench``) add the kernel and the real Triton.

A second table times one HTTP request at a time after the process has slept for an idle gap
(``--gaps-ms``), as a sidecar between sparse requests does: what the same path costs when it
starts cold (its code and data out of the core's caches, the core just woken), still without
sockets; beside it, a compact loop of about the same warm CPU, slept and timed the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np
import uvicorn
import uvloop
from uvicorn.server import ServerState

from api.config import from_options
from api.connection import bounded_protocol
from api.dispatcher import GpuDispatcher, Job
from api.embedded import INPUT_WIDTH, NOOP
from api.grpc_frontend.h2server import Call
from api.grpc_frontend.protocol import MODEL_INFER, method_path
from api.grpc_frontend.server import GrpcFrontend
from api.metrics import GatewayMetrics
from api.runtime import Runtime, serving_from_config
from api.upstream import Upstream, _Connection
from dvfs.simulated import SimulatedDevice
from loadgen.classes import RequestClass
from loadgen.engine import InputTensor, build_payloads
from loadgen.grpc_client import grpc_payloads
from scheduler.core import Scheduler
from simulator.results import DEFAULT_DIR, markdown_table, write_results
from time2clock.online import OnlineTables
from time2clock.table import TableSet

# What the embedded Triton says of ``noop``, and its reply to one request (as Triton sends it).
NOOP_CONFIG = {
    "name": NOOP,
    "max_batch_size": 8,
    "dynamic_batching": {},
    "instance_group": [{"count": 2}],
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [INPUT_WIDTH]}],
}
_REPLY_JSON = json.dumps(
    {
        "model_name": NOOP,
        "model_version": "1",
        "outputs": [
            {
                "name": "OUTPUT0",
                "datatype": "FP32",
                "shape": [1, INPUT_WIDTH],
                "parameters": {"binary_data_size": 4 * INPUT_WIDTH},
            }
        ],
    }
).encode()


def _http_reply(body: bytes, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n{extra}"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


TRITON_REPLY = _http_reply(
    _REPLY_JSON + bytes(4 * INPUT_WIDTH),
    f"inference-header-content-length: {len(_REPLY_JSON)}\r\n",
)
TRITON_CONFIG = _http_reply(json.dumps(NOOP_CONFIG).encode())


class _FakeTriton:
    """A transport to Triton that answers each request on the next turn of the loop."""

    def __init__(self, protocol: _Connection) -> None:
        self.protocol = protocol
        self.loop = asyncio.get_running_loop()
        self.closing = False

    def write(self, data: bytes) -> None:
        reply = TRITON_CONFIG if data.startswith(b"GET") else TRITON_REPLY
        self.loop.call_soon(self.protocol.data_received, reply)

    def writelines(self, data: Any) -> None:
        self.write(b"".join(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


class _FakeUpstream(Upstream):
    async def _connect(self, timeout_s: float) -> _Connection:
        self._open_count += 1
        conn = _Connection(self._generation, self._keep)
        conn.connection_made(cast(asyncio.Transport, _FakeTriton(conn)))
        return conn


class _Client:
    """The client's side of one connection to the sidecar: what the protocol writes."""

    def __init__(self) -> None:
        self.closing = False
        self.waiter: asyncio.Future[None] | None = None

    def write(self, data: bytes) -> None:
        if data.startswith(b"HTTP/1.1 100"):
            return
        waiter = self.waiter
        if waiter is None or waiter.done():
            raise RuntimeError(f"a reply nobody waits for: {data[:200]!r}")
        if data.startswith(b"HTTP/1.1 200"):
            waiter.set_result(None)
        else:
            waiter.set_exception(RuntimeError(f"the sidecar answered {data[:200]!r}"))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@contextmanager
def runtime(**options: Any) -> Iterator[Runtime]:
    """A runtime as ``python -m api serve --policy max`` runs it (``options``: other settings,
    as :func:`api.config.from_options` takes them; ``learn=False`` as ``--no-learn``), in front
    of the fake Triton. With the tables that learn (the default), every isolated execution is
    a sample and every change of what runs goes to the energy fit's log, as live; the energy
    counter's reader, a thread of its own live, is not run."""
    with tempfile.TemporaryDirectory() as tmp:
        device = SimulatedDevice("v100", state_path=Path(tmp) / "gpu.state")
        options = {"policy": "max", "max_queue": 10_000, **options}
        config = from_options(triton_url="127.0.0.1:1", **options)
        rt = Runtime(config, GatewayMetrics())
        upstream = _FakeUpstream("127.0.0.1:1")
        rt.upstream = upstream
        clocks = device.supported_clocks_mhz()
        learner = OnlineTables(clocks, gpu="v100") if config.learn else None
        scheduler: Scheduler[Job] = Scheduler(
            TableSet(), config.policy.build(clocks), config.scheduler, learner=learner
        )
        scheduler.set_serving(NOOP, serving_from_config(NOOP_CONFIG))
        rt.dispatcher = GpuDispatcher(
            gpu="0", scheduler=scheduler, device=device, upstream=upstream, metrics=rt.metrics
        )
        rt.models.known.add(NOOP)
        try:
            yield rt
        finally:
            device.close()


def http_client(rt: Runtime) -> Callable[[], Awaitable[None]]:
    """One kept-alive connection to the sidecar's protocol; each call sends one request (as
    the load generator does) and returns with its reply."""
    data = np.ones((1, INPUT_WIDTH), dtype=np.float32)
    payload = build_payloads([RequestClass("bench")], data=data)[0]
    head = [f"POST /v2/models/{NOOP}/infer HTTP/1.1", "Host: 127.0.0.1:8000"]
    head += [f"{k}: {v}" for k, v in payload.headers.items()]
    head += [f"Content-Length: {len(payload.body)}", "Accept: */*", "User-Agent: bench"]
    request = ("\r\n".join(head) + "\r\n\r\n").encode() + payload.body

    async def no_app(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError(f"not on the inference path: {scope.get('path')}")

    config = uvicorn.Config(no_app, http=bounded_protocol(64 * 1024, 10.0, rt), log_level="warning")
    config.load()
    protocol_class = cast(Any, config.http_protocol_class)
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
    client = _Client()
    protocol.connection_made(client)

    async def one() -> None:
        client.waiter = asyncio.get_running_loop().create_future()
        protocol.data_received(request)
        await client.waiter

    return one


def grpc_client(rt: Runtime) -> Callable[[], Awaitable[None]]:
    """The gRPC front end's handler, called as its HTTP/2 server calls it, Triton's channel
    faked."""
    data = np.ones((1, INPUT_WIDTH), dtype=np.float32)
    tensors = [InputTensor("INPUT0", "FP32", data)]
    raw = grpc_payloads([RequestClass("bench")], tensors, NOOP, None)[0].body
    frontend = GrpcFrontend(rt)
    frontend.open_channels()
    reply = b"\n\x04noop\x12\x011"

    class Triton:
        async def call(self, path: str, message: bytes, *_: Any) -> bytes:
            await asyncio.sleep(0)
            return reply

    fake = cast(Any, Triton())
    frontend._tritons = dict.fromkeys(frontend._tritons, fake)
    frontend._first = fake
    call = Call(1, method_path(MODEL_INFER), (("user-agent", "grpc-python"),), None, None)

    async def one() -> None:
        await frontend._infer(raw, call)

    return one


@asynccontextmanager
async def serving(rt: Runtime) -> AsyncIterator[Runtime]:
    """``rt`` (from :func:`runtime`) with its dispatcher running and its upstream open
    (``noop``'s config read from the fake Triton, as at start-up); the dispatcher stopped
    after."""
    assert rt.dispatcher is not None and rt.upstream is not None
    rt.dispatcher.start()
    try:
        await rt.upstream.open()
        if await rt.models.limits(NOOP) is None:
            raise RuntimeError("the fake Triton gave no config")
        yield rt
    finally:
        await rt.dispatcher.stop()


@asynccontextmanager
async def started(**options: Any) -> AsyncIterator[Runtime]:
    """A :func:`runtime` of ``options``, :func:`serving`."""
    with runtime(**options) as rt:
        async with serving(rt):
            yield rt


async def cost_us(protocol: str, concurrency: int, requests: int, *, learn: bool = True) -> float:
    """CPU µs per request of ``requests`` through ``protocol`` at ``concurrency``."""
    async with started(learn=learn) as rt:
        clients = [
            (http_client if protocol == "http" else grpc_client)(rt) for _ in range(concurrency)
        ]
        for one in clients:  # warm: first-time paths (labels, caches) out of the count
            for _ in range(20):
                await one()
        each = max(1, requests // concurrency)

        async def loop(one: Callable[[], Awaitable[None]]) -> None:
            for _ in range(each):
                await one()

        start = time.process_time()
        await asyncio.gather(*(loop(one) for one in clients))
        elapsed = time.process_time() - start
    return elapsed / (each * concurrency) * 1e6


IDLE_BUDGET_S = 4.0  # the idle time one gap's cell spends asleep, at most
COMPACT_PARSES = 40  # the compact loop's JSON parses: about the path's warm CPU here


def after_sleeps(gap_ms: float, requests: int) -> Iterator[None]:
    """Yields once per round, after the whole process slept ``gap_ms`` (as between sparse
    requests): ``requests`` rounds, fewer where they would sleep past ``IDLE_BUDGET_S``."""
    rounds = requests if gap_ms <= 0 else min(requests, int(IDLE_BUDGET_S * 1000.0 / gap_ms))
    for _ in range(max(20, rounds)):
        if gap_ms > 0:
            time.sleep(gap_ms / 1000.0)
        yield


async def cold_cost_us(gap_ms: float, requests: int, *, learn: bool = True) -> float:
    """CPU µs of one HTTP request sent after the process slept ``gap_ms`` (the sleep itself
    not counted; rounds as :func:`after_sleeps` gives them): the path's cost when it starts
    cold."""
    spent_s: list[float] = []
    async with started(learn=learn) as rt:
        one = http_client(rt)
        for _ in range(20):  # first-time paths (labels, caches) out of the count
            await one()
        for _ in after_sleeps(gap_ms, requests):
            start = time.process_time()
            await one()
            spent_s.append(time.process_time() - start)
    return float(np.mean(spent_s)) * 1e6


def compact_cost_us(gap_ms: float, requests: int) -> float:
    """The same measure for a compact loop (the request's JSON header parsed
    ``COMPACT_PARSES`` times): its code and data fit in a core's caches, so it shows what a
    sleep costs a small footprint, beside :func:`cold_cost_us`'s wide path."""
    header = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, INPUT_WIDTH], "datatype": "FP32"}]}
    )
    spent_s: list[float] = []
    for _ in after_sleeps(gap_ms, requests):
        start = time.process_time()
        for _ in range(COMPACT_PARSES):
            json.loads(header)
        spent_s.append(time.process_time() - start)
    return float(np.mean(spent_s)) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pathbench", description=__doc__)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument(
        "--gaps-ms",
        default="0,2,20",
        help="idle gaps before each request of the cold table, ms (empty: no cold table)",
    )
    parser.add_argument(
        "--no-learn",
        action="store_true",
        help="without the tables that learn (as the sidecar's --no-learn)",
    )
    parser.add_argument(
        "--results-dir", type=Path, default=DEFAULT_DIR, help="where pathbench.{md,json} go"
    )
    args = parser.parse_args(argv)
    learn = not args.no_learn
    try:
        gaps_ms = [float(g) for g in args.gaps_ms.split(",") if g.strip()]
    except ValueError:
        parser.error(f"--gaps-ms takes numbers separated by commas, got {args.gaps_ms!r}")
    if any(g < 0 for g in gaps_ms):
        parser.error(f"--gaps-ms must not be negative, got {args.gaps_ms!r}")
    print("the sidecar's own Python per request, in process (no sockets, no Triton):")
    rows = []
    for protocol in args.protocols.split(","):
        for c in (int(x) for x in args.concurrency.split(",")):
            us = uvloop.run(cost_us(protocol, c, args.requests, learn=learn))
            rows.append({"protocol": protocol, "concurrency": c, "cpu_us": us})
            print(f"  {protocol:>4} concurrency {c:>2}: {us:6.1f} µs CPU per request", flush=True)
    cold = []
    if gaps_ms:
        print("one HTTP request at a time, after the process slept:")
    for gap in gaps_ms:
        us = uvloop.run(cold_cost_us(gap, args.requests, learn=learn))
        compact = compact_cost_us(gap, args.requests)
        cold.append({"gap_ms": gap, "cpu_us": us, "compact_cpu_us": compact})
        print(
            f"  {gap:6g} ms idle before each: {us:6.1f} µs CPU per request "
            f"(a compact loop: {compact:6.1f} µs)",
            flush=True,
        )
    markdown = (
        "In one process, no sockets, a fake Triton that answers at once; policy max; "
        + ("tables that learn on (the default); " if learn else "--no-learn; ")
        + "the energy counter's reader (a thread of its own) not run; "
        f"{args.requests} requests per cell.\n\n"
        + markdown_table(
            ["protocol", "concurrency", "CPU µs per request"],
            [(r["protocol"], r["concurrency"], f"{r['cpu_us']:.1f}") for r in rows],
        )
    )
    if cold:
        markdown += (
            "\n\nOne HTTP request at a time, the whole process asleep for the gap before each "
            f"(the sleep not counted; at most {IDLE_BUDGET_S:g} s of sleep per gap): the same "
            "path started cold; beside it, a compact loop (the request's JSON header parsed "
            f"{COMPACT_PARSES} times) slept and timed the same way.\n\n"
            + markdown_table(
                ["idle gap ms", "CPU µs per request", "compact loop CPU µs"],
                [
                    (f"{r['gap_ms']:g}", f"{r['cpu_us']:.1f}", f"{r['compact_cpu_us']:.1f}")
                    for r in cold
                ],
            )
        )
    md, _ = write_results(
        "pathbench",
        title="The sidecar's own Python per request (python -m benchmarks.pathbench)",
        markdown=markdown,
        data={
            "settings": {
                "requests": args.requests,
                "policy": "max",
                "learn": learn,
                "gaps_ms": gaps_ms,
            },
            "cost": rows,
            "cold": cold,
        },
        directory=args.results_dir,
    )
    print(f"written to {md} (and .json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
