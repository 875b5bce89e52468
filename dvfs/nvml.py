"""A real NVIDIA GPU through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Every NVML error is translated here, at the boundary, into :mod:`dvfs.errors`; nothing of
``pynvml`` leaks to callers. A GPU this process locked is reset when the process exits normally,
on an uncaught exception, on Ctrl-C, and on SIGTERM/SIGHUP; after a crash that cannot be caught
(SIGKILL, power loss) ``python -m dvfs reset`` gives the clocks back.
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

import pynvml

from dvfs.device import Device, DeviceIdentity
from dvfs.energy import EnergyCounter, EnergyReading
from dvfs.errors import (
    DeviceError,
    DeviceLostError,
    DeviceNotSupportedError,
    DevicePermissionError,
    InvalidClockError,
    NoDeviceError,
)

log = logging.getLogger(__name__)

_HINTS = {
    "permission": "locking GPU clocks needs root or CAP_SYS_ADMIN (run the sidecar as root, "
    "or in a container with --cap-add SYS_ADMIN)",
    "no_gpu": "no NVIDIA GPU/driver is visible to this process (check `nvidia-smi`, the driver, "
    "and CUDA_VISIBLE_DEVICES / the container's GPU access)",
    "not_supported": "this GPU or driver does not support it (locked clocks need Volta or newer "
    "and a recent driver)",
    "lost": "the GPU has fallen off the bus or needs a reset (see `nvidia-smi -q` and dmesg)",
}


def _raise_translated(err: Exception, action: str) -> NoReturn:
    """Map an NVML error onto our exception family, chained ``from`` it."""
    code = getattr(err, "value", None)
    what = f"{action} failed: {err}"
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        raise DevicePermissionError(f"{what}; {_HINTS['permission']}") from err
    if code in (
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    ):
        raise NoDeviceError(f"{what}; {_HINTS['no_gpu']}") from err
    if code in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
        raise DeviceNotSupportedError(f"{what}; {_HINTS['not_supported']}") from err
    if code in (
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_GPU_NOT_FOUND,
    ):
        raise DeviceLostError(f"{what}; {_HINTS['lost']}") from err
    if code in (pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_FREQ_NOT_SUPPORTED):
        raise InvalidClockError(f"{what}; the value is outside what the GPU accepts") from err
    raise DeviceError(what) from err


def _call(action: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except pynvml.NVMLError as err:
        _raise_translated(err, action)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _ExitGuard:
    """Resets every GPU this process locked, on every exit path Python can catch."""

    def __init__(self) -> None:
        self._locked: dict[int, NvmlDevice] = {}
        self._lock = threading.Lock()
        self._installed = False

    def add(self, device: NvmlDevice) -> None:
        with self._lock:
            self._locked[device.identity.index] = device
            if not self._installed:
                self._install()

    def discard(self, device: NvmlDevice) -> None:
        with self._lock:
            self._locked.pop(device.identity.index, None)

    def reset_all(self) -> None:
        with self._lock:
            devices = list(self._locked.values())
        for device in devices:
            try:
                device.reset()
            except DeviceError:
                log.exception("could not reset GPU %d at exit", device.identity.index)

    def _install(self) -> None:
        self._installed = True
        atexit.register(self.reset_all)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _exit_on_signal)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


EXIT_GUARD = _ExitGuard()


class NvmlDevice(Device):
    """One NVIDIA GPU, its graphics clock locked through NVML."""

    def __init__(
        self,
        index: int = 0,
        *,
        reset_at_exit: bool = True,
        time_source: Callable[[], float] = time.monotonic,
    ) -> None:
        """Open GPU ``index``. With ``reset_at_exit`` False a lock outlives the process
        (what ``python -m dvfs set`` wants); otherwise every exit path resets it."""
        _call("nvmlInit", pynvml.nvmlInit)
        self._open = True
        self._locked_mhz: int | None = None
        self._reset_at_exit = reset_at_exit
        try:
            count = _call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
            if not 0 <= index < count:
                raise NoDeviceError(
                    f"GPU index {index} does not exist; this node has {count} GPU(s)"
                )
            self._handle = _call(
                "nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index
            )
            self._identity = DeviceIdentity(
                index=index,
                name=_text(_call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, self._handle)),
                uuid=_text(_call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, self._handle)),
            )
        except DeviceError:
            self.close()  # NVML was initialised: release it, whatever failed after
            raise
        self._clocks: list[int] | None = None
        self._now = time_source
        self._has_energy_counter: bool | None = None
        self._integrated_j = 0.0
        self._last_sample: tuple[float, float] | None = None
        self._has_utilization: bool | None = None
        self._busy_s = 0.0
        self._busy_seen_us: int | None = None  # the newest utilization sample counted
        self._energy = EnergyCounter(self._energy_counter_j, time_source)

    @property
    def identity(self) -> DeviceIdentity:
        return self._identity

    def supported_clocks_mhz(self) -> list[int]:
        if self._clocks is None:
            mem = _call(
                "nvmlDeviceGetSupportedMemoryClocks",
                pynvml.nvmlDeviceGetSupportedMemoryClocks,
                self._handle,
            )
            top_mem = max(mem)
            graphics = _call(
                "nvmlDeviceGetSupportedGraphicsClocks",
                pynvml.nvmlDeviceGetSupportedGraphicsClocks,
                self._handle,
                top_mem,
            )
            self._clocks = sorted({int(c) for c in graphics})
        return list(self._clocks)

    def clock_mhz(self) -> int:
        return int(
            _call(
                "nvmlDeviceGetClockInfo",
                pynvml.nvmlDeviceGetClockInfo,
                self._handle,
                pynvml.NVML_CLOCK_GRAPHICS,
            )
        )

    def set_clock_mhz(self, clock_mhz: int) -> None:
        if clock_mhz == self._locked_mhz:
            return
        self.check_clock_mhz(clock_mhz)
        _call(
            f"locking GPU {self._identity.index} at {clock_mhz} MHz",
            pynvml.nvmlDeviceSetGpuLockedClocks,
            self._handle,
            clock_mhz,
            clock_mhz,
        )
        self._locked_mhz = clock_mhz
        if self._reset_at_exit:
            EXIT_GUARD.add(self)

    def reset(self) -> None:
        _call(
            f"resetting GPU {self._identity.index}'s locked clocks",
            pynvml.nvmlDeviceResetGpuLockedClocks,
            self._handle,
        )
        self._locked_mhz = None
        EXIT_GUARD.discard(self)

    def power_w(self) -> float:
        return (
            float(_call("nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage, self._handle))
            / 1000.0
        )

    def energy_j(self) -> float:
        """The GPU's total-energy counter (Volta+); elsewhere, power integrated between reads.

        The counter refreshes at a finite interval: to turn it into watts or joules per
        inference use :meth:`energy_reading` and :mod:`dvfs.energy`, not two raw reads."""
        return self._energy.read().energy_j

    def energy_reading(self) -> EnergyReading:
        """The energy counter with the time its value became current."""
        return self._energy.read()

    @property
    def energy(self) -> EnergyCounter:
        """The timestamped counter (its update interval, waiting for its next change)."""
        return self._energy

    def _energy_counter_j(self) -> float:
        if self._has_energy_counter is not False:
            try:
                mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
                self._has_energy_counter = True
                return float(mj) / 1000.0
            except pynvml.NVMLError as err:
                if getattr(err, "value", None) not in (
                    pynvml.NVML_ERROR_NOT_SUPPORTED,
                    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                ):
                    _raise_translated(err, "nvmlDeviceGetTotalEnergyConsumption")
                log.info(
                    "GPU %d has no energy counter; integrating power instead", self._identity.index
                )
                self._has_energy_counter = False
        now, watts = self._now(), self.power_w()
        if self._last_sample is not None:
            t0, w0 = self._last_sample
            self._integrated_j += 0.5 * (w0 + watts) * max(now - t0, 0.0)
        self._last_sample = (now, watts)
        return self._integrated_j

    def gpu_busy_s(self) -> float | None:
        """NVML's GPU-utilization samples integrated: each sample is the share of its period
        (from the sample before it; 1/6 s to 1 s, by product) in which a kernel ran. The value
        lags the present by up to one period. None where the GPU has no such samples."""
        if self._has_utilization is False:
            return None
        try:
            kind, samples = pynvml.nvmlDeviceGetSamples(
                self._handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, self._busy_seen_us or 0
            )
        except pynvml.NVMLError as err:
            code = getattr(err, "value", None)
            if code == pynvml.NVML_ERROR_NOT_FOUND:  # no sample since the last read (or yet)
                return self._busy_s if self._has_utilization else None
            if code not in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                _raise_translated(err, "nvmlDeviceGetSamples")
            log.info("GPU %d has no utilization samples", self._identity.index)
            self._has_utilization = False
            return None
        self._has_utilization = True
        field = "dVal" if kind == pynvml.NVML_VALUE_TYPE_DOUBLE else "uiVal"
        for sample in sorted(samples, key=lambda s: int(s.timeStamp)):
            at_us = int(sample.timeStamp)
            seen = self._busy_seen_us
            if seen is not None and at_us > seen:
                percent = min(max(float(getattr(sample.sampleValue, field)), 0.0), 100.0)
                self._busy_s += percent / 100.0 * (at_us - seen) / 1e6
            if seen is None or at_us > seen:
                self._busy_seen_us = at_us  # the first sample seen is the origin
        return self._busy_s

    def close(self) -> None:
        """Reset the clock if we locked it, and release NVML."""
        if not self._open:
            return
        if self._locked_mhz is not None and self._reset_at_exit:
            self.reset()
        self._open = False
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            log.warning("nvmlShutdown failed: %s", err)


def nvml_device_count() -> int:
    """How many GPUs NVML sees; raises :class:`NoDeviceError` when there is no NVML at all."""
    _call("nvmlInit", pynvml.nvmlInit)
    try:
        return int(_call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount))
    finally:
        pynvml.nvmlShutdown()
