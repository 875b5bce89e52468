"""Sweep a device's clocks while measuring a model at a fixed concurrency (seed 003's method)."""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from dvfs.device import Device
from dvfs.simulated import SimulatedDevice
from dvfs.timesource import VirtualTime

ProgressFn = Callable[[int, int], None]


class Measurer(Protocol):
    """Runs ``requests`` inferences with ``concurrency`` in flight; returns each latency in ms."""

    def measure(self, requests: int, concurrency: int) -> list[float]: ...


class SimulatedMeasurer:
    """Measures a :class:`SimulatedDevice` running in virtual time: instant, and exactly seeded."""

    def __init__(self, device: SimulatedDevice, vtime: VirtualTime) -> None:
        self.device = device
        self.vtime = vtime

    @classmethod
    def for_profile(cls, profile: str, seed: int = 0) -> SimulatedMeasurer:
        vtime = VirtualTime()
        device = SimulatedDevice(profile, time_source=vtime, rng=np.random.default_rng(seed))
        return cls(device, vtime)

    def settle(self) -> None:
        """Let a requested clock change take effect."""
        self.vtime.advance_by(self.device.profile.clock_change_delay_s * 2)

    def measure(self, requests: int, concurrency: int) -> list[float]:
        latencies: list[float] = []
        running: list[tuple[float, float]] = []  # (end_s, start_s), earliest end first
        started = 0
        while started < min(concurrency, requests):
            heapq.heappush(running, self._start())
            started += 1
        while running:
            end_s, start_s = heapq.heappop(running)
            self.vtime.advance_to(end_s)
            self.device.end_work()
            latencies.append((end_s - start_s) * 1000.0)
            if started < requests:
                heapq.heappush(running, self._start())
                started += 1
        return latencies

    def _start(self) -> tuple[float, float]:
        now = self.vtime()
        clock = self.device.begin_work()
        return now + self.device.sample_latency_ms(clock) / 1000.0, now


class TritonMeasurer:
    """Measures a model on a Triton server (KServe v2 HTTP) with ``concurrency`` closed loops."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        input_name: str = "INPUT0",
        shape: Sequence[int] = (1, 16),
        datatype: str = "FP32",
    ) -> None:
        self.url = url
        self.model = model
        self.input_name = input_name
        self.shape = list(shape)
        self.datatype = datatype

    def settle(self) -> None:
        time.sleep(0.05)

    def measure(self, requests: int, concurrency: int) -> list[float]:
        import tritonclient.http as httpclient
        from tritonclient.utils import triton_to_np_dtype

        data = np.zeros(self.shape, dtype=triton_to_np_dtype(self.datatype))
        latencies: list[float] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        remaining = [requests]

        def loop() -> None:
            client = httpclient.InferenceServerClient(self.url)
            tensor = httpclient.InferInput(self.input_name, self.shape, self.datatype)
            tensor.set_data_from_numpy(data)
            try:
                while True:
                    with lock:
                        if remaining[0] <= 0 or errors:
                            return
                        remaining[0] -= 1
                    t0 = time.perf_counter()
                    client.infer(self.model, [tensor])
                    elapsed_ms = (time.perf_counter() - t0) * 1000.0
                    with lock:
                        latencies.append(elapsed_ms)
            except Exception as err:  # reported to the caller below, never swallowed
                with lock:
                    errors.append(err)
            finally:
                client.close()

        threads = [threading.Thread(target=loop) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(
                f"measuring {self.model} at {self.url} failed: {errors[0]}"
            ) from errors[0]
        return latencies


def select_clocks(ladder: Sequence[int], count: int | None) -> list[int]:
    """``count`` clocks spread evenly over the ladder, both ends included (all when None)."""
    clocks = sorted(ladder)
    if count is None or count >= len(clocks):
        return clocks
    if count < 2:
        raise ValueError(f"--clocks must be at least 2, got {count}")
    idx = np.unique(np.round(np.linspace(0, len(clocks) - 1, count)).astype(int))
    return [clocks[i] for i in idx]


@dataclass
class SweepResult:
    """Latencies (ms) per clock, and energy per inference (J) per clock as the device counted it."""

    samples: dict[int, list[float]] = field(default_factory=dict)
    energy_per_inference_j: dict[int, float] = field(default_factory=dict)


def sweep(
    device: Device,
    measurer: Measurer,
    clocks_mhz: Sequence[int],
    *,
    requests_per_clock: int = 10,
    concurrency: int = 2,
    progress: ProgressFn | None = None,
) -> SweepResult:
    """Lock each clock in turn, measure, and give the clock back at the end whatever happens."""
    if requests_per_clock < 1 or concurrency < 1:
        raise ValueError("requests per clock and concurrency must both be >= 1")
    result = SweepResult()
    try:
        for i, clock in enumerate(clocks_mhz):
            device.set_clock_mhz(clock)
            settle = getattr(measurer, "settle", None)
            if settle is not None:
                settle()
            before_j = device.energy_j()
            latencies = measurer.measure(requests_per_clock, concurrency)
            result.samples[clock] = latencies
            result.energy_per_inference_j[clock] = (device.energy_j() - before_j) / len(latencies)
            if progress is not None:
                progress(i + 1, len(clocks_mhz))
    finally:
        device.reset()
    return result
