"""A device that can be read but never written: what shadow mode and the real-GPU check use.

Wrapping the real device makes "never change the GPU" structural rather than a promise kept by
every caller: :meth:`ReadOnlyDevice.set_clock_mhz` and :meth:`ReadOnlyDevice.reset` raise
:class:`DeviceWriteForbiddenError` and never reach the wrapped device.
"""

from __future__ import annotations

from dvfs.device import Device, DeviceIdentity
from dvfs.errors import DeviceError


class DeviceWriteForbiddenError(DeviceError):
    """Something tried to change a device opened read-only (shadow mode, the GPU check)."""


class ReadOnlyDevice(Device):
    """Reads pass through to ``inner``; every write raises."""

    def __init__(self, inner: Device) -> None:
        self.inner = inner

    @property
    def identity(self) -> DeviceIdentity:
        return self.inner.identity

    def supported_clocks_mhz(self) -> list[int]:
        return self.inner.supported_clocks_mhz()

    def clock_mhz(self) -> int:
        return self.inner.clock_mhz()

    def power_w(self) -> float:
        return self.inner.power_w()

    def energy_j(self) -> float:
        return self.inner.energy_j()

    def gpu_busy_s(self) -> float | None:
        return self.inner.gpu_busy_s()

    def set_clock_mhz(self, clock_mhz: int) -> None:
        raise DeviceWriteForbiddenError(
            f"refused to lock {self.identity.name} at {clock_mhz} MHz: the device is read-only "
            "(shadow mode never changes a clock)"
        )

    def reset(self) -> None:
        raise DeviceWriteForbiddenError(
            f"refused to reset {self.identity.name}'s clocks: the device is read-only "
            "(shadow mode never changes a clock)"
        )

    def close(self) -> None:
        self.inner.close()
