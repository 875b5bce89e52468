"""perf_analyzer's measurement discipline: windows, stability, trials; one step at a time.

A step (one concurrency, or one request rate) keeps the load running while it measures windows:
``time_windows`` of ``measurement_interval_ms``, or ``count_windows`` of
``measurement_request_count`` completed requests. After each window it checks whether the last
three agree: throughput, and latency (the ``--percentile`` if given, else the mean), each within
``stability_percentage`` of their average. Stable, or ``max_trials`` windows spent, the step
reports the last three windows together.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import aiohttp
import numpy as np

from loadgen.engine import Recorder, Sample, Target, class_sequence, send_one
from loadgen.metrics import ClockSampler, energy_j, model_stats, scrape, stats_counts


@dataclass(frozen=True)
class MeasureOptions:
    measurement_interval_ms: float = 5000.0
    measurement_mode: str = "time_windows"
    measurement_request_count: int = 50
    stability_percentage: float = 10.0
    max_trials: int = 10
    percentile: int | None = None
    metrics_url: str | None = None


@dataclass
class Window:
    start_s: float
    end_s: float
    samples: list[Sample]
    server: dict[str, float]
    energy_j: float | None
    clock_mhz: list[float]
    sent: int

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.status == 200]

    @property
    def throughput(self) -> float:
        return len(self.ok) / max(self.end_s - self.start_s, 1e-9)

    def latency_us(self, percentile: int | None) -> float:
        lat = [s.latency_s * 1e6 for s in self.ok]
        if not lat:
            return math.nan
        return float(np.percentile(lat, percentile)) if percentile else float(np.mean(lat))


@dataclass
class StepResult:
    """One reported step: the last (up to) three windows merged."""

    value: float  # the concurrency or the request rate
    windows: list[Window]
    stable: bool
    trials: int
    asked_rps: float | None = None
    extras: dict[str, float] = field(default_factory=dict)

    @property
    def samples(self) -> list[Sample]:
        return [s for w in self.windows for s in w.samples]

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.status == 200]

    @property
    def duration_s(self) -> float:
        return sum(w.end_s - w.start_s for w in self.windows)

    @property
    def throughput(self) -> float:
        return len(self.ok) / max(self.duration_s, 1e-9)

    @property
    def achieved_rps(self) -> float:
        return sum(w.sent for w in self.windows) / max(self.duration_s, 1e-9)

    def server_delta(self, key: str) -> float:
        return sum(w.server.get(key, 0.0) for w in self.windows)

    @property
    def energy_j(self) -> float | None:
        parts = [w.energy_j for w in self.windows]
        return (
            None if any(p is None for p in parts) else float(sum(p for p in parts if p is not None))
        )

    @property
    def clock_mhz(self) -> float | None:
        values = [c for w in self.windows for c in w.clock_mhz]
        return float(np.mean(values)) if values else None


def stable(windows: Sequence[Window], opts: MeasureOptions) -> bool:
    """perf_analyzer's rule: the last 3 windows' throughput and latency within s% of their mean."""
    if len(windows) < 3:
        return False
    last = windows[-3:]
    limit = opts.stability_percentage / 100.0
    for values in ([w.throughput for w in last], [w.latency_us(opts.percentile) for w in last]):
        mean = float(np.mean(values))
        if not math.isfinite(mean) or mean <= 0:
            return False
        if any(abs(v - mean) / mean > limit for v in values):
            return False
    return True


class Load:
    """Keeps one step's load running in the background (closed or open loop)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        target: Target,
        rng: np.random.Generator,
        rec: Recorder,
    ) -> None:
        self.session, self.target, self.rng, self.rec = session, target, rng, rec
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight: set[asyncio.Task[None]] = set()
        self._running = True
        self.sent = 0

    def closed(self, concurrency: int, per_class: Sequence[int] | None = None) -> None:
        """``concurrency`` workers, each request's class drawn by share; or, with
        ``per_class``, that many workers for each class, each sending only its own."""
        classes = iter(class_sequence(self.target, 10_000_000, self.rng))

        async def worker(klass: int | None) -> None:
            while self._running:
                self.sent += 1
                k = next(classes) if klass is None else klass
                await send_one(self.session, self.target, k, self.rec)

        if per_class is None:
            self._tasks = [asyncio.create_task(worker(None)) for _ in range(concurrency)]
        else:
            self._tasks = [
                asyncio.create_task(worker(k)) for k, n in enumerate(per_class) for _ in range(n)
            ]

    def open(self, gaps_s: AsyncIterator[float] | Callable[[], float]) -> None:
        async def pacer() -> None:
            classes = iter(class_sequence(self.target, 10_000_000, self.rng))
            next_at = time.monotonic()
            while self._running:
                gap = gaps_s() if callable(gaps_s) else await anext(gaps_s)
                next_at += gap
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                self.sent += 1
                task = asyncio.create_task(
                    send_one(self.session, self.target, next(classes), self.rec)
                )
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)

        self._tasks = [asyncio.create_task(pacer())]

    async def stop(self) -> None:
        self._running = False
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)


async def measure_step(
    session: aiohttp.ClientSession,
    target: Target,
    load: Load,
    rec: Recorder,
    opts: MeasureOptions,
    value: float,
    on_window: Callable[[int, bool], None] | None = None,
) -> StepResult:
    """Measure windows until stable or out of trials, with the load already running."""
    windows: list[Window] = []
    clock = ClockSampler(session, opts.metrics_url) if opts.metrics_url else None
    if clock:
        clock.start()
    try:
        await asyncio.sleep(0.2)  # let the step's load reach its pace
        for trial in range(1, opts.max_trials + 1):
            windows.append(await _window(session, target, load, rec, opts, clock))
            ok = stable(windows, opts)
            if on_window is not None:
                on_window(trial, ok)
            if ok:
                break
    finally:
        if clock:
            await clock.stop()
    return StepResult(
        value=value, windows=windows[-3:], stable=stable(windows, opts), trials=len(windows)
    )


async def _snapshot(
    session: aiohttp.ClientSession, target: Target, opts: MeasureOptions
) -> tuple[dict[str, float], float | None]:
    if target.grpc is not None:
        server = stats_counts(await target.grpc.stats(target.model))
    else:
        server = await model_stats(session, target.url, target.model)
    joules = None
    if opts.metrics_url:
        try:
            joules = energy_j(await scrape(session, opts.metrics_url))
        except aiohttp.ClientError:
            joules = None
    return server, joules


async def _window(
    session: aiohttp.ClientSession,
    target: Target,
    load: Load,
    rec: Recorder,
    opts: MeasureOptions,
    clock: ClockSampler | None,
) -> Window:
    server0, energy0 = await _snapshot(session, target, opts)
    clocks_before = len(clock.values_hz) if clock else 0
    start, first, sent0 = time.monotonic(), len(rec.samples), load.sent
    if opts.measurement_mode == "count_windows":
        while len(rec.samples) - first < opts.measurement_request_count:
            await asyncio.sleep(0.005)
    else:
        await asyncio.sleep(opts.measurement_interval_ms / 1000.0)
    end = time.monotonic()
    samples = rec.samples[first:]
    server1, energy1 = await _snapshot(session, target, opts)
    return Window(
        start_s=start,
        end_s=end,
        samples=list(samples),
        server={k: server1.get(k, 0.0) - server0.get(k, 0.0) for k in server1},
        energy_j=None if energy0 is None or energy1 is None else energy1 - energy0,
        clock_mhz=[v / 1e6 for v in clock.values_hz[clocks_before:]] if clock else [],
        sent=load.sent - sent0,
    )
