"""Sweep a device's clocks × batch sizes while measuring a model (seed 003's method per curve).

Each (clock, batch) step runs ``requests_per_clock`` executions of ``batch`` requests each, with
``concurrency`` executions in flight; one latency is recorded per execution.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from dvfs.device import Device
from dvfs.simulated import SimulatedDevice
from dvfs.timesource import VirtualTime

ProgressFn = Callable[[int, int], None]


class MeasureError(RuntimeError):
    """Measuring a model failed (the server refused, went away, or lacks the model)."""


class Measurer(Protocol):
    """Runs ``requests`` executions of ``batch`` requests each, ``concurrency`` in flight.

    Returns each execution's latency in ms.
    """

    def measure(self, requests: int, concurrency: int, batch: int = 1) -> list[float]: ...


class SimulatedMeasurer:
    """Measures a :class:`SimulatedDevice` running in virtual time: instant, and exactly seeded.

    ``model`` names one of the device profile's models (``None``: its default model).
    """

    def __init__(
        self, device: SimulatedDevice, vtime: VirtualTime, model: str | None = None
    ) -> None:
        self.device = device
        self.vtime = vtime
        self.model = model

    @classmethod
    def for_profile(
        cls, profile: str, seed: int = 0, model: str | None = None
    ) -> SimulatedMeasurer:
        vtime = VirtualTime()
        device = SimulatedDevice(profile, time_source=vtime, rng=np.random.default_rng(seed))
        return cls(device, vtime, model)

    def settle(self) -> None:
        """Let a requested clock change take effect."""
        self.vtime.advance_by(self.device.profile.clock_change_delay_s * 2)

    def measure(self, requests: int, concurrency: int, batch: int = 1) -> list[float]:
        """Executions in flight share the GPU equally, as on the device (processor sharing):
        with ``k`` running, each advances at ``1/k`` of its speed alone."""
        latencies: list[float] = []
        running: list[list[float]] = []  # [work left alone (ms), start_s]
        started = 0
        while started < min(concurrency, requests):
            running.append(self._start(batch))
            started += 1
        while running:
            k = len(running)
            first = min(range(k), key=lambda i: running[i][0])
            step_ms = max(running[first][0], 0.0)
            self.vtime.advance_by(step_ms * k / 1000.0)
            for execution in running:
                execution[0] -= step_ms
            _, start_s = running.pop(first)
            self.device.end_work(self.model, batch)
            latencies.append((self.vtime() - start_s) * 1000.0)
            if started < requests:
                running.append(self._start(batch))
                started += 1
        return latencies

    def _start(self, batch: int) -> list[float]:
        clock = self.device.begin_work(self.model, batch)
        alone_ms = self.device.sample_latency_ms(clock, model=self.model, batch=batch)
        return [alone_ms, self.vtime()]


class TritonMeasurer:
    """Measures a model on a Triton server (KServe v2 HTTP) with ``concurrency`` closed loops.

    ``shape`` is one request's input shape including the batch dimension; an execution of
    ``batch`` sends one request of shape ``[batch, *shape[1:]]``.
    """

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

    def measure(self, requests: int, concurrency: int, batch: int = 1) -> list[float]:
        import tritonclient.http as httpclient
        from tritonclient.utils import triton_to_np_dtype

        shape = [batch, *self.shape[1:]]
        data = np.zeros(shape, dtype=triton_to_np_dtype(self.datatype))
        latencies: list[float] = []
        errors: list[BaseException] = []
        lock = threading.Lock()
        remaining = [requests]

        def loop() -> None:
            client = httpclient.InferenceServerClient(self.url)
            tensor = httpclient.InferInput(self.input_name, shape, self.datatype)
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
            raise MeasureError(
                f"measuring {self.model} at {self.url} failed: {errors[0]}"
            ) from errors[0]
        return latencies

    def max_batch(self) -> int:
        """The model's ``max_batch_size`` from its Triton config (0: it does not batch)."""
        config = _ask_triton(self.url, lambda c: c.get_model_config(self.model))
        return int(config.get("max_batch_size", 0))


def triton_models(url: str) -> list[str]:
    """The models Triton at ``url`` has ready, from its repository index."""
    index = _ask_triton(url, lambda c: c.get_model_repository_index())
    names = sorted({m["name"] for m in index if m.get("state") == "READY"})
    if not names:
        # PyTriton's server, for one, answers with an empty index.
        raise MeasureError(
            f"Triton at {url} lists no ready models in its repository index; "
            "name each model with --model"
        )
    return names


def _ask_triton(url: str, ask: Callable[[Any], Any]) -> Any:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url)
    try:
        return ask(client)
    except Exception as err:  # tritonclient raises several types; all mean "Triton said no"
        raise MeasureError(f"asking Triton at {url} failed: {err}") from err
    finally:
        client.close()


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
    """Per batch size and clock: execution latencies (ms), and energy per request (J) as the
    device counted it (energy over the step / (executions × batch))."""

    samples: dict[int, dict[int, list[float]]] = field(default_factory=dict)
    energy_per_inference_j: dict[int, dict[int, float]] = field(default_factory=dict)


def sweep(
    device: Device,
    measurer: Measurer,
    clocks_mhz: Sequence[int],
    *,
    batches: Sequence[int] = (1,),
    requests_per_clock: int = 10,
    concurrency: int = 1,
    progress: ProgressFn | None = None,
) -> SweepResult:
    """Lock each clock in turn, measure every batch size there, and give the clock back at the
    end whatever happens. ``progress(done, total)`` counts (clock, batch) steps."""
    if requests_per_clock < 1 or concurrency < 1:
        raise ValueError("requests per clock and concurrency must both be >= 1")
    if not batches or min(batches) < 1:
        raise ValueError(f"batch sizes must be >= 1, got {list(batches)}")
    result = SweepResult()
    total = len(clocks_mhz) * len(batches)
    done = 0
    try:
        for clock in clocks_mhz:
            device.set_clock_mhz(clock)
            settle = getattr(measurer, "settle", None)
            if settle is not None:
                settle()
            for batch in batches:
                before_j = device.energy_j()
                latencies = measurer.measure(requests_per_clock, concurrency, batch)
                used_j = device.energy_j() - before_j
                result.samples.setdefault(batch, {})[clock] = latencies
                result.energy_per_inference_j.setdefault(batch, {})[clock] = used_j / (
                    len(latencies) * batch
                )
                done += 1
                if progress is not None:
                    progress(done, total)
    finally:
        device.reset()
    return result
