"""Energy from a counter that updates at a finite interval, turned into watts and joules safely.

NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``) is not read from the
hardware at each call: the driver refreshes it every few tens of milliseconds, and between
refreshes every read returns the same value. Dividing the difference of two reads by the wall
time between the *reads* is then wrong by up to one interval at each end, and over a short
window can give zero watts or double the true power. So a reading carries the time its value
became current (the first read that saw it change), power is the energy difference over the
difference of those times, and a window shorter than a few update intervals gives no answer
rather than a wrong one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

MIN_INTERVALS = 2  # a window must span this many counter updates to be trusted


@dataclass(frozen=True)
class EnergyReading:
    """The counter's value in joules and the time (``as_of_s``) that value became current; with
    the GPU's busy seconds read at that moment (:meth:`dvfs.device.Device.gpu_busy_s`; None
    where not read or not known)."""

    energy_j: float
    as_of_s: float
    gpu_busy_s: float | None = None


def gpu_busy_between_s(start: EnergyReading, end: EnergyReading) -> float | None:
    """The GPU's busy seconds between two readings; None where either lacks them or they go
    back (a counter restarted)."""
    if start.gpu_busy_s is None or end.gpu_busy_s is None or end.gpu_busy_s < start.gpu_busy_s:
        return None
    return end.gpu_busy_s - start.gpu_busy_s


class EnergyCounter:
    """Wraps a raw counter read; timestamps each new value and learns the update interval.

    A value's ``as_of_s`` is the time of the first read that saw it, so it is late by at most
    the gap between reads: read often (or wait for a change with :meth:`next_change`) where
    precision matters. The very first reading's ``as_of_s`` is its read time (when the value
    really became current is unknown).
    """

    def __init__(
        self,
        read_j: Callable[[], float],
        time_source: Callable[[], float],
        read_busy_s: Callable[[], float | None] | None = None,
    ) -> None:
        """``read_busy_s`` (optional): the GPU's busy seconds, read with each new value."""
        self._read_j = read_j
        self._read_busy_s = read_busy_s
        self._now = time_source
        self._last: EnergyReading | None = None
        self._last_read_s: float | None = None
        self._change: tuple[float, float] | None = None  # (seen at, seen within this many s)
        self._interval_s: float | None = None

    @property
    def update_interval_s(self) -> float | None:
        """The shortest gap seen between two counter changes that were both seen precisely
        (within a tenth of the gap) or at two reads in a row; None until then. Read often to
        learn it."""
        return self._interval_s

    def read(self) -> EnergyReading:
        now, value = self._now(), self._read_j()
        last, previous_read_s = self._last, self._last_read_s
        self._last_read_s = now
        if last is not None and value == last.energy_j:
            return last
        if last is not None and previous_read_s is not None:  # a change, seen now
            uncertainty_s = now - previous_read_s
            if self._change is not None:
                gap_s = now - self._change[0]
                precise = max(uncertainty_s, self._change[1]) <= 0.1 * gap_s
                # Changed at two reads in a row: the refresh is at most that gap (an upper
                # bound, never an underestimate); a counter that changes at every read has
                # an interval as short as the reads.
                back_to_back = self._change[0] == previous_read_s
                if precise or back_to_back:
                    self._interval_s = min(self._interval_s or gap_s, gap_s)
            self._change = (now, uncertainty_s)
        busy_s = None if self._read_busy_s is None else self._read_busy_s()
        self._last = EnergyReading(value, now, busy_s)
        return self._last

    def next_change(
        self,
        *,
        poll_s: float = 0.002,
        timeout_s: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> EnergyReading:
        """Read every ``poll_s`` until the value changes, so that the reading's ``as_of_s`` is
        precise to ``poll_s``; after ``timeout_s`` without a change, the latest reading."""
        first = self.read()
        deadline = self._now() + timeout_s
        while (reading := self.read()) == first and self._now() < deadline:
            sleep(poll_s)
        return reading


def average_power_w(
    start: EnergyReading, end: EnergyReading, *, update_interval_s: float | None
) -> float | None:
    """Mean power between two readings, or None when the window is too short to trust: under
    ``MIN_INTERVALS`` counter updates (or no update at all, or an unknown interval)."""
    span_s = end.as_of_s - start.as_of_s
    if update_interval_s is None or span_s <= 0 or span_s < MIN_INTERVALS * update_interval_s:
        return None
    return (end.energy_j - start.energy_j) / span_s


def energy_per_inference_j(
    start: EnergyReading,
    end: EnergyReading,
    *,
    inferences: int,
    window_s: float,
    update_interval_s: float | None,
) -> float | None:
    """Joules per inference for ``inferences`` served over ``window_s`` of wall time: the
    counter's mean power times the window, shared out; None where the power is not trusted."""
    power_w = average_power_w(start, end, update_interval_s=update_interval_s)
    if power_w is None or inferences <= 0:
        return None
    return power_w * window_s / inferences
