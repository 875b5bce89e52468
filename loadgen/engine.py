"""Send load: closed loop (a fixed number in flight) or open loop (requests leave on schedule).

Open loop really is open: each request leaves at its scheduled time as its own task, whether or
not earlier ones have returned. Everything runs on one asyncio loop. Inference requests go over
kept-alive HTTP/1.1 connections with replies parsed by httptools in C (the sidecar's own
upstream client, :class:`api.upstream.Upstream`), one pool per session and server: a client
that costs little per request adds little to the latency it measures and takes little of the
CPU it shares with what it measures. The session's aiohttp side serves everything else (metrics,
admin calls, streams).
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np
import numpy.typing as npt
import tritonclient.http as httpclient

from api.upstream import Upstream
from api.upstream_errors import UpstreamUnavailableError
from loadgen.classes import RequestClass

GPU_HEADER = "x-sidecar-gpu"  # the sidecar's answer to "which GPU served this request"

if TYPE_CHECKING:
    from loadgen.grpc_client import GrpcClient


@dataclass(frozen=True, slots=True)
class Sample:
    """One request: when it left and returned (monotonic seconds), its class, its status;
    ``sent_s`` when its body was written, ``headers_s`` when the reply's headers arrived;
    ``gpu`` which GPU served it, when the sidecar says (``x-sidecar-gpu``)."""

    start_s: float
    end_s: float
    klass: int
    status: int
    sent_s: float = math.nan
    headers_s: float = math.nan
    gpu: str | None = None

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Payload:
    """A ready-to-send request body for one class."""

    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True)
class InputTensor:
    name: str
    datatype: str
    data: npt.NDArray[Any]


def build_payloads(
    classes: Sequence[RequestClass],
    *,
    input_name: str = "INPUT0",
    datatype: str = "FP32",
    data: npt.NDArray[Any] | None = None,
    inputs: Sequence[InputTensor] = (),
) -> list[Payload]:
    """Binary-tensor bodies, one per class, with the class's hints in their parameters."""
    tensors_in = list(inputs) or [InputTensor(input_name, datatype, np.asarray(data))]
    out = []
    for c in classes:
        tensors = []
        for spec in tensors_in:
            tensor = httpclient.InferInput(spec.name, list(spec.data.shape), spec.datatype)
            tensor.set_data_from_numpy(spec.data)
            tensors.append(tensor)
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            tensors, priority=c.priority, parameters=c.parameters()
        )
        headers = {"Content-Type": "application/octet-stream"}
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
        out.append(Payload(body, headers))
    return out


@dataclass
class Target:
    """Where requests go and what they carry (over ``grpc`` when given: payloads are then
    encoded ``ModelInferRequest`` messages)."""

    url: str
    model: str
    payloads: list[Payload]
    shares: list[float]
    version: str | None = None
    grpc: GrpcClient | None = None

    @property
    def path(self) -> str:
        if self.version:
            return f"/v2/models/{self.model}/versions/{self.version}/infer"
        return f"/v2/models/{self.model}/infer"


@dataclass
class Recorder:
    samples: list[Sample] = field(default_factory=list)
    errors: dict[int, int] = field(default_factory=dict)

    def add(self, s: Sample) -> None:
        self.samples.append(s)
        if s.status != 200:
            self.errors[s.status] = self.errors.get(s.status, 0) + 1


@dataclass(frozen=True, slots=True)
class _InferPools:
    """The inference connections of one session: a pool per server."""

    by_url: dict[str, Upstream]
    max_connections: int
    timeout_s: float


_POOLS: weakref.WeakKeyDictionary[aiohttp.ClientSession, _InferPools] = weakref.WeakKeyDictionary()
UNLIMITED_CONNECTIONS = 1 << 20  # ``limit`` 0: as many connections as requests in flight


@asynccontextmanager
async def new_session(
    limit: int = 0, timeout_s: float = 120.0
) -> AsyncIterator[aiohttp.ClientSession]:
    """A pooled session (``limit`` 0: no cap on connections per server) whose requests may take
    up to ``timeout_s`` each, body included; its inference connections close with it."""
    pools = _InferPools({}, limit or UNLIMITED_CONNECTIONS, timeout_s)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, keepalive_timeout=60),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        skip_auto_headers=("Accept-Encoding",),
    ) as session:
        _POOLS[session] = pools
        try:
            yield session
        finally:
            for pool in pools.by_url.values():
                await pool.close()


async def _pool(session: aiohttp.ClientSession, url: str) -> Upstream:
    pools = _POOLS.get(session)
    if pools is None:
        raise ValueError("load is sent through a session of loadgen.engine.new_session")
    pool = pools.by_url.get(url)
    if pool is None:
        pool = Upstream(
            url,
            max_connections=pools.max_connections,
            timeout_s=pools.timeout_s,
            keep_headers=(GPU_HEADER,),
        )
        pools.by_url[url] = pool  # before any wait: one pool per server, however many ask
        await pool.open()
    return pool


async def send_one(
    session: aiohttp.ClientSession, target: Target, klass: int, rec: Recorder
) -> None:
    """One request of class ``klass`` to ``target``, its sample added to ``rec`` (status 0:
    no answer, the connection refused or lost, or ``timeout_s`` passed)."""
    payload = target.payloads[klass]
    start = time.monotonic()
    if target.grpc is not None:
        status, end, gpu = await target.grpc.infer(payload.body)
        rec.add(Sample(start, end, klass, status, gpu=gpu))
        return
    pool = await _pool(session, target.url)
    try:
        reply = await pool.request("POST", target.path, payload.body, payload.headers)
    except UpstreamUnavailableError:
        rec.add(Sample(start, time.monotonic(), klass, 0))
        return
    end = time.monotonic()
    gpu = reply.headers.get(GPU_HEADER)
    rec.add(Sample(start, end, klass, reply.status, reply.sent_s, reply.headers_s, gpu))


def class_sequence(target: Target, n: int, rng: np.random.Generator) -> list[int]:
    if len(target.shares) == 1:
        return [0] * n
    return [int(k) for k in rng.choice(len(target.shares), size=n, p=target.shares)]


async def closed_loop(
    session: aiohttp.ClientSession,
    target: Target,
    concurrency: int,
    stop_at_s: float,
    rec: Recorder,
    rng: np.random.Generator,
) -> None:
    """``concurrency`` workers, each sending its next request when the last one returns."""
    classes = iter(class_sequence(target, 10_000_000, rng)) if len(target.shares) > 1 else None

    async def worker() -> None:
        while time.monotonic() < stop_at_s:
            await send_one(session, target, next(classes) if classes else 0, rec)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def arrival_times(
    rate_rps: float, n: int, distribution: str, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """``n`` send times (s from the start): ``constant`` spacing or ``poisson`` (exponential
    gaps, the first one included)."""
    if rate_rps <= 0:
        raise ValueError(f"request rate must be > 0, got {rate_rps}")
    if distribution == "constant":
        return np.arange(n) / rate_rps
    if distribution == "poisson":
        return np.cumsum(rng.exponential(1.0 / rate_rps, n))
    raise ValueError(f"request distribution must be constant or poisson, got {distribution!r}")


def schedule(
    rate_rps: float, duration_s: float, distribution: str, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """The send times of :func:`arrival_times` that fall within ``duration_s``."""
    if rate_rps <= 0:
        raise ValueError(f"request rate must be > 0, got {rate_rps}")
    n = max(1, int(rate_rps * duration_s * 1.5) + 10)
    times = arrival_times(rate_rps, n, distribution, rng)
    return times[times < duration_s]


async def open_loop(
    session: aiohttp.ClientSession,
    target: Target,
    send_times_s: Sequence[float] | npt.NDArray[np.float64],
    rec: Recorder,
    rng: np.random.Generator,
    on_tick: Callable[[int], None] | None = None,
) -> float:
    """Send at the scheduled times; wait for every reply. Returns the span the sends took.

    What the process made before the run is frozen out of the garbage collector's reach first:
    a full collection walking it stops this loop, and each reply waiting then reads late.
    """
    classes = class_sequence(target, len(send_times_s), rng)
    gc.collect()
    gc.freeze()
    start = time.monotonic()
    tasks: list[asyncio.Task[None]] = []
    for i, at in enumerate(send_times_s):
        delay = start + float(at) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send_one(session, target, classes[i], rec)))
        if on_tick is not None:
            on_tick(i + 1)
    span = time.monotonic() - start
    if tasks:
        await asyncio.gather(*tasks)
    return span
