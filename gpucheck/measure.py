"""One measurement: closed-loop load on a server while the GPU's energy counter and clock are
read (never written), giving latency, throughput and energy per inference for that window.

Energy per inference is counted between two *changes* of the energy counter (it refreshes at a
finite interval, see :mod:`dvfs.energy`), and the inferences are those completed between the
same two instants, so neither side of the division is stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dvfs.device import Device
from dvfs.energy import EnergyCounter, energy_per_inference_j, gpu_busy_between_s
from loadgen.classes import RequestClass
from loadgen.engine import Recorder, Target, build_payloads, closed_loop, new_session

ONE_CLASS = (RequestClass("gpu-check"),)  # every request alike, at the default level


@dataclass(frozen=True)
class Measurement:
    """What one window measured."""

    label: str
    batch: int
    concurrency: int
    requests: int
    errors: int
    inferences_per_s: float
    p50_ms: float
    p99_ms: float
    energy_per_inference_j: float | None
    power_w: float | None
    clock_mhz_min: int
    clock_mhz_mean: float
    clock_mhz_max: int
    gpu_busy_share: float | None = None  # of the window, from the GPU's utilization samples
    latencies_ms: tuple[float, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Everything but the raw latencies."""
        out = asdict(self)
        del out["latencies_ms"]
        return out


def energy_counter(
    device: Device, time_source: Callable[[], float] = time.monotonic
) -> EnergyCounter:
    """A timestamped view of ``device``'s energy counter on the loadgen's clock (monotonic),
    with its busy time read at each new value."""
    return EnergyCounter(device.energy_j, time_source, device.gpu_busy_s)


def calibrate(counter: EnergyCounter, *, attempts: int = 4) -> float | None:
    """Watch the counter change a few times, so that its refresh interval is known."""
    for _ in range(attempts):
        counter.next_change()
        if counter.update_interval_s is not None:
            break
    return counter.update_interval_s


def measure(
    *,
    label: str,
    url: str,
    model: str,
    data: np.ndarray[Any, Any],
    concurrency: int,
    device: Device,
    counter: EnergyCounter,
    warmup_s: float = 1.0,
    window_s: float = 3.0,
    input_name: str = "INPUT0",
    classes: Sequence[RequestClass] = ONE_CLASS,
) -> Measurement:
    """Closed loop of ``concurrency`` requests of ``data`` (batch = its first dimension), each
    request of one of ``classes`` (their hints), drawn by their shares."""
    payloads = build_payloads(classes, input_name=input_name, data=data)
    target = Target(url, model, payloads, [c.share for c in classes])
    return asyncio.run(
        _measure(
            label, target, int(data.shape[0]), concurrency, device, counter, warmup_s, window_s
        )
    )


async def _measure(
    label: str,
    target: Target,
    batch: int,
    concurrency: int,
    device: Device,
    counter: EnergyCounter,
    warmup_s: float,
    window_s: float,
) -> Measurement:
    rec = Recorder()
    rng = np.random.default_rng(0)
    async with new_session() as session:
        load = asyncio.create_task(
            closed_loop(session, target, concurrency, math.inf, rec, rng), name="load"
        )
        try:
            await asyncio.sleep(warmup_s)
            start = await asyncio.to_thread(counter.next_change)
            clocks: list[int] = []
            while time.monotonic() < start.as_of_s + window_s:
                clocks.append(await asyncio.to_thread(device.clock_mhz))
                await asyncio.sleep(0.05)
            end = await asyncio.to_thread(counter.next_change)
        finally:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
    inside = [s for s in rec.samples if start.as_of_s <= s.end_s <= end.as_of_s]
    ok = [s for s in inside if s.status == 200]
    span_s = end.as_of_s - start.as_of_s
    latencies_ms = np.array([s.latency_s * 1000.0 for s in ok]) if ok else np.array([math.nan])
    inferences = len(ok) * batch
    per_inference = energy_per_inference_j(
        start,
        end,
        inferences=inferences,
        window_s=span_s,
        update_interval_s=counter.update_interval_s,
    )
    busy_s = gpu_busy_between_s(start, end)
    return Measurement(
        label=label,
        batch=batch,
        concurrency=concurrency,
        requests=len(ok),
        errors=len(inside) - len(ok),
        inferences_per_s=inferences / span_s if span_s > 0 else math.nan,
        p50_ms=float(np.percentile(latencies_ms, 50)),
        p99_ms=float(np.percentile(latencies_ms, 99)),
        energy_per_inference_j=per_inference,
        power_w=None if per_inference is None else per_inference * inferences / span_s,
        clock_mhz_min=min(clocks),
        clock_mhz_mean=float(np.mean(clocks)),
        clock_mhz_max=max(clocks),
        gpu_busy_share=(None if busy_s is None or span_s <= 0 else busy_s / span_s),
        latencies_ms=tuple(float(v) for v in latencies_ms if not math.isnan(v)),
    )
