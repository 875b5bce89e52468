"""A stand-in for ``pynvml`` on machines with no GPU: records calls, raises real NVMLError types."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pynvml


class FakeNvml:
    """Looks like the ``pynvml`` module as :mod:`dvfs.nvml` uses it."""

    NVMLError = pynvml.NVMLError
    NVML_CLOCK_GRAPHICS = pynvml.NVML_CLOCK_GRAPHICS
    NVML_GPU_UTILIZATION_SAMPLES = pynvml.NVML_GPU_UTILIZATION_SAMPLES
    NVML_VALUE_TYPE_DOUBLE = pynvml.NVML_VALUE_TYPE_DOUBLE

    def __init__(self, *, gpus: int = 1, energy_counter: bool = True) -> None:
        for name in dir(pynvml):
            if name.startswith("NVML_ERROR_"):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        self.energy_counter = energy_counter
        self.calls: list[tuple[Any, ...]] = []
        self.fail: dict[str, int] = {}
        self.clock = 1380
        self.power_mw = 250_000
        self.energy_mj = 1_000_000
        self.energy_fn: Callable[[], int] | None = None  # set: the counter as a function of time
        # GPU-utilization samples as NVML keeps them: (timestamp µs, percent); None: unsupported
        self.utilization: list[tuple[int, int]] | None = []
        self.inits = 0

    def _maybe_fail(self, name: str) -> None:
        self.calls.append((name,))
        if name in self.fail:
            raise pynvml.NVMLError(self.fail[name])

    def nvmlInit(self) -> None:
        self._maybe_fail("nvmlInit")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self._maybe_fail("nvmlShutdown")
        self.inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._maybe_fail("nvmlDeviceGetCount")
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self._maybe_fail("nvmlDeviceGetHandleByIndex")
        return f"handle{index}"

    def nvmlDeviceGetName(self, handle: str) -> str:
        self._maybe_fail("nvmlDeviceGetName")
        return "NVIDIA H200"

    def nvmlDeviceGetUUID(self, handle: str) -> bytes:
        self._maybe_fail("nvmlDeviceGetUUID")
        return b"GPU-1234"

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: str) -> list[int]:
        self._maybe_fail("nvmlDeviceGetSupportedMemoryClocks")
        return [405, 2619, 1593]

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: str, mem_mhz: int) -> list[int]:
        self._maybe_fail("nvmlDeviceGetSupportedGraphicsClocks")
        assert mem_mhz == 2619, "graphics clocks must be read at the highest memory clock"
        return [1980, 1965, 1200, 345, 1200]

    def nvmlDeviceGetClockInfo(self, handle: str, kind: int) -> int:
        self._maybe_fail("nvmlDeviceGetClockInfo")
        return self.clock

    def nvmlDeviceSetGpuLockedClocks(self, handle: str, lo: int, hi: int) -> None:
        self._maybe_fail("nvmlDeviceSetGpuLockedClocks")
        self.calls[-1] = ("lock", handle, lo, hi)
        self.clock = lo

    def nvmlDeviceResetGpuLockedClocks(self, handle: str) -> None:
        self._maybe_fail("nvmlDeviceResetGpuLockedClocks")
        self.calls[-1] = ("reset", handle)

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        self._maybe_fail("nvmlDeviceGetPowerUsage")
        return self.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:
        self._maybe_fail("nvmlDeviceGetTotalEnergyConsumption")
        if not self.energy_counter:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.energy_mj if self.energy_fn is None else self.energy_fn()

    def nvmlDeviceGetSamples(
        self, handle: str, kind: int, last_seen_us: int
    ) -> tuple[int, list[SimpleNamespace]]:
        """Utilization samples newer than ``last_seen_us``, as NVML answers: NOT_FOUND when
        there are none, NOT_SUPPORTED on a GPU without them."""
        self._maybe_fail("nvmlDeviceGetSamples")
        assert kind == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        if self.utilization is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        newer = [
            SimpleNamespace(timeStamp=at_us, sampleValue=SimpleNamespace(uiVal=percent))
            for at_us, percent in self.utilization
            if at_us > last_seen_us
        ]
        if not newer:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, newer
