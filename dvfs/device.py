"""The one interface the scheduler uses to read and steer a GPU's clock and energy."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceIdentity:
    """Who a device is: its index on the node, its marketing name, its stable UUID."""

    index: int
    name: str
    uuid: str


class Device(ABC):
    """A GPU whose graphics clock we control.

    Implementations: :class:`dvfs.nvml.NvmlDevice` (a real GPU through NVML) and
    :class:`dvfs.simulated.SimulatedDevice` (a physical model of one).
    """

    @property
    @abstractmethod
    def identity(self) -> DeviceIdentity:
        """Index, name and UUID."""

    @abstractmethod
    def supported_clocks_mhz(self) -> list[int]:
        """Graphics clocks the device can be locked to, ascending."""

    @abstractmethod
    def clock_mhz(self) -> int:
        """The graphics clock the device runs at now."""

    @abstractmethod
    def set_clock_mhz(self, clock_mhz: int) -> None:
        """Lock the graphics clock to exactly ``clock_mhz``; a no-op when already locked there.

        Raises :class:`dvfs.errors.InvalidClockError` for a clock outside the ladder.
        """

    @abstractmethod
    def reset(self) -> None:
        """Give the clock back to the GPU's own management."""

    @abstractmethod
    def power_w(self) -> float:
        """Power drawn now, in watts."""

    @abstractmethod
    def energy_j(self) -> float:
        """Energy used since an arbitrary origin, in joules; never decreases."""

    def gpu_busy_s(self) -> float | None:
        """Seconds in which the GPU ran a kernel, since an arbitrary origin (never decreases),
        or None where the device does not report it (the default).

        Against the time requests spend at Triton it separates the GPU's part of an execution
        from the host's (pre- and post-processing, the hand-off to the backend), which energy
        learning needs (see :mod:`time2clock.online_energy`)."""
        return None

    def close(self) -> None:  # noqa: B027 (optional for implementations)
        """Release what the device holds (the default holds nothing)."""

    def max_clock_mhz(self) -> int:
        """The top of the ladder."""
        return self.supported_clocks_mhz()[-1]

    def min_clock_mhz(self) -> int:
        """The bottom of the ladder."""
        return self.supported_clocks_mhz()[0]

    def check_clock_mhz(self, clock_mhz: int) -> None:
        """Raise :class:`InvalidClockError` unless ``clock_mhz`` is on the ladder."""
        from dvfs.errors import InvalidClockError

        clocks = self.supported_clocks_mhz()
        if clock_mhz not in clocks:
            raise InvalidClockError(
                f"{clock_mhz} MHz is not a supported clock of {self.identity.name}; "
                f"supported: {clocks[0]}..{clocks[-1]} MHz in {len(clocks)} steps "
                f"(see `python -m dvfs list`)"
            )
