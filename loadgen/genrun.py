"""A generative run: streamed requests sent at a fixed concurrency (closed loop) or a request
rate (open loop, Poisson or evenly spaced), bounded by a request count or a duration, with the
GPU's energy read from the server's ``/metrics`` before and after.

Open loop really is open: each request leaves at its scheduled time as its own task, whatever
the earlier ones are doing. Everything runs on one asyncio loop over one pooled session.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np

from loadgen.engine import arrival_times, new_session, schedule
from loadgen.generative import StreamRecord, TokenSloSpec, summarize
from loadgen.metrics import energy_j, scrape
from loadgen.stream import GenTarget, TimedStream, stream_once
from loadgen.synthetic import GenRequest, RequestSource

ARRIVALS = ("poisson", "constant")


@dataclass(frozen=True)
class GenLoad:
    """How the requests are sent: ``concurrency`` in flight (closed loop) or ``request_rate``
    per second (open loop, ``arrival`` gaps), until ``request_count`` requests have been sent
    or ``duration_s`` has passed (then those in flight finish); ``warmup_count`` requests
    first, at the same concurrency, not measured."""

    concurrency: int | None = None
    request_rate: float | None = None
    arrival: str = "poisson"
    request_count: int | None = 10
    duration_s: float | None = None
    warmup_count: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.request_rate is not None:
            raise ValueError("give a concurrency or a request rate, not both")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ValueError(f"request rate must be > 0, got {self.request_rate}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival pattern must be one of {', '.join(ARRIVALS)}")
        if self.request_count is None and self.duration_s is None:
            raise ValueError("a run needs a request count or a duration")
        if self.request_count is not None and self.request_count < 1:
            raise ValueError(f"request count must be >= 1, got {self.request_count}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise ValueError(f"benchmark duration must be > 0 s, got {self.duration_s}")
        if self.warmup_count < 0:
            raise ValueError(f"warmup request count must be >= 0, got {self.warmup_count}")

    @property
    def open_loop(self) -> bool:
        return self.request_rate is not None

    @property
    def label(self) -> str:
        if self.request_rate is not None:
            return f"request_rate{self.request_rate:g}"
        return f"concurrency{self.concurrency or 1}"


@dataclass
class GenRun:
    """What a run measured: every stream as the client saw it, and the GPU's joules."""

    streams: list[TimedStream]
    energy_j: float | None = None

    @property
    def records(self) -> list[StreamRecord]:
        return [s.record() for s in self.streams if s.ok]

    @property
    def errors(self) -> list[str]:
        return [s.error or f"HTTP {s.status}" for s in self.streams if not s.ok]

    def report(self, slo: TokenSloSpec | None = None) -> dict[str, Any]:
        """aiperf's metrics of the successful streams, our additions, and the error count."""
        out = summarize(self.records, energy_j=self.energy_j, slo=slo)
        out["error_request_count"] = {"unit": "requests", "avg": float(len(self.errors))}
        return out


Tick = Callable[[int], None]


async def closed_loop(
    session: aiohttp.ClientSession,
    target: GenTarget,
    next_request: Callable[[], GenRequest],
    *,
    concurrency: int,
    request_count: int | None,
    duration_s: float | None,
    on_done: Tick | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[TimedStream]:
    """``concurrency`` workers, each sending its next request when its last one ends."""
    deadline = clock() + duration_s if duration_s is not None else math.inf
    out: list[TimedStream] = []
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while (request_count is None or sent < request_count) and clock() < deadline:
            sent += 1
            out.append(await stream_once(session, target, next_request(), clock=clock))
            if on_done is not None:
                on_done(len(out))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


async def open_loop(
    session: aiohttp.ClientSession,
    target: GenTarget,
    requests: Sequence[GenRequest],
    send_times_s: Sequence[float],
    *,
    on_done: Tick | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[TimedStream]:
    """``requests[i]`` at ``send_times_s[i]`` (s from now), each as its own task; waits for
    them all, and returns their streams in the order they were sent (``[i]`` is request i's,
    whenever it ended)."""
    out: list[TimedStream | None] = [None] * len(send_times_s)
    done = 0

    async def one(request_index: int) -> None:
        nonlocal done
        out[request_index] = await stream_once(
            session, target, requests[request_index], clock=clock
        )
        done += 1
        if on_done is not None:
            on_done(done)

    start = clock()
    tasks: list[asyncio.Task[None]] = []
    for i, at in enumerate(send_times_s):
        delay = start + float(at) - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return [s for s in out if s is not None]  # every task has ended: none is left None


def send_times(load: GenLoad) -> list[float]:
    """The open loop's send times (s from the start), seeded by the load's seed."""
    assert load.request_rate is not None
    rng = np.random.default_rng(load.seed)
    if load.request_count is not None:
        times = arrival_times(load.request_rate, load.request_count, load.arrival, rng)
        if load.duration_s is not None:
            times = times[times < load.duration_s]
    else:
        assert load.duration_s is not None
        times = schedule(load.request_rate, load.duration_s, load.arrival, rng)
    return [float(t) for t in times]


async def send_load(
    session: aiohttp.ClientSession,
    target: GenTarget,
    source: RequestSource,
    load: GenLoad,
    on_done: Tick | None = None,
) -> list[TimedStream]:
    """The measured requests of ``load`` (no warmup)."""
    if load.open_loop:
        times = send_times(load)
        return await open_loop(session, target, source.take(len(times)), times, on_done=on_done)
    return await closed_loop(
        session,
        target,
        source.next,
        concurrency=load.concurrency or 1,
        request_count=load.request_count,
        duration_s=load.duration_s,
        on_done=on_done,
    )


async def read_energy_j(session: aiohttp.ClientSession, metrics_url: str | None) -> float | None:
    if metrics_url is None:
        return None
    return energy_j(await scrape(session, metrics_url))


async def run_generative(
    target: GenTarget,
    source: RequestSource,
    load: GenLoad,
    *,
    metrics_url: str | None = None,
    timeout_s: float = 600.0,
    on_done: Tick | None = None,
) -> GenRun:
    """Warm up, read the energy counter, send the load, read it again."""
    async with new_session(timeout_s=timeout_s) as session:
        if load.warmup_count:
            warm = min(load.warmup_count, load.concurrency or 1)
            await closed_loop(
                session,
                target,
                source.next,
                concurrency=warm,
                request_count=load.warmup_count,
                duration_s=None,
            )
        before = await read_energy_j(session, metrics_url)
        streams = await send_load(session, target, source, load, on_done)
        after = await read_energy_j(session, metrics_url)
    joules = after - before if after is not None and before is not None else None
    return GenRun(streams, joules)
