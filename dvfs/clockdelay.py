"""How long a GPU takes to land a locked clock: ``python -m dvfs delay``.

The policies plan every raise as landing ``--slack-change-delay-ms`` after they ask for it (5 ms
by default, an assumption: ``dvfs/profiles.py``). This measures it on the device itself: lock a
clock, then read the clock back every ``poll_s`` until it shows the target; the time from the
call to the first reading that shows it, over several changes between the lowest, a middle and
the top clock of the ladder, both ways.

What it measures is the delay NVML's reading shows, not the delay the GPU's work feels (the
study of the delay cited in ``dvfs/profiles.py`` times the work itself); how far the one lags or
leads the other is not known here. An idle GPU may not report a locked clock at all (it may rest
lower): run it while the GPU serves.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dvfs.device import Device

POLL_S = 0.0005  # how often the clock is read back while a change lands
TIMEOUT_S = 2.0  # a change not seen by then is reported as not landed


@dataclass(frozen=True)
class ClockChange:
    """One change: from which clock, to which, and how long until the reading showed it (None:
    not within the timeout)."""

    from_mhz: int
    to_mhz: int
    delay_ms: float | None


def change_sequence(clocks_mhz: Sequence[int], changes: int) -> list[int]:
    """The targets, in order: the lowest, a middle and the top clock of the ladder, visited so
    that every pair is crossed both ways (up and down, far and near), ``changes`` in all."""
    ladder = sorted(clocks_mhz)
    if len(ladder) < 2:
        raise ValueError("a clock ladder of at least two clocks is needed")
    if changes < 1:
        raise ValueError(f"changes must be >= 1, got {changes}")
    lo, mid, hi = ladder[0], ladder[len(ladder) // 2], ladder[-1]
    cycle = [hi, lo, mid, hi, mid, lo] if mid not in (lo, hi) else [hi, lo]
    return [cycle[i % len(cycle)] for i in range(changes)]


def measure_changes(
    device: Device,
    changes: int = 12,
    *,
    poll_s: float = POLL_S,
    timeout_s: float = TIMEOUT_S,
    now: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> list[ClockChange]:
    """Lock ``device`` at each clock of :func:`change_sequence` in turn, from the lowest, and time
    each change until ``device.clock_mhz()`` reads the target. The clock is given back after."""
    if poll_s <= 0 or timeout_s <= 0:
        raise ValueError("poll_s and timeout_s must be > 0")
    ladder = device.supported_clocks_mhz()
    targets = change_sequence(ladder, changes)
    out = []
    try:
        current = min(ladder)
        device.set_clock_mhz(current)
        _wait_for(device, current, now() + timeout_s, poll_s, now, sleep)
        for target in targets:
            start = now()
            device.set_clock_mhz(target)
            delay_ms = time_landing(
                device,
                target,
                start,
                _never,
                poll_s=poll_s,
                timeout_s=timeout_s,
                now=now,
                sleep=sleep,
            )
            out.append(ClockChange(current, target, delay_ms))
            current = target
    finally:
        device.reset()
    return out


def time_landing(
    device: Device,
    target_mhz: int,
    asked_s: float,
    abandon: Callable[[], bool],
    *,
    poll_s: float = POLL_S,
    timeout_s: float = TIMEOUT_S,
    now: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float | None:
    """How long after ``asked_s`` (on the clock ``now`` reads) the reading first showed
    ``target_mhz``, in ms: the sidecar times its own raises with it, on a worker thread. None
    when not within ``timeout_s`` of ``asked_s``, or once ``abandon()`` (a newer change was
    applied: what the reading shows no longer answers for this one)."""
    seen = _wait_for(device, target_mhz, asked_s + timeout_s, poll_s, now, sleep, abandon)
    return None if seen is None else (seen - asked_s) * 1000.0


def _never() -> bool:
    return False


def _wait_for(
    device: Device,
    target_mhz: int,
    deadline: float,
    poll_s: float,
    now: Callable[[], float],
    sleep: Callable[[float], None],
    abandon: Callable[[], bool] = _never,
) -> float | None:
    """When the reading first showed ``target_mhz`` (None: not by ``deadline``, or
    ``abandon()``)."""
    while not abandon():
        if device.clock_mhz() == target_mhz:
            return now()
        if now() >= deadline:
            return None
        sleep(poll_s)
    return None


def summary_ms(changes: Sequence[ClockChange]) -> dict[str, float | int]:
    """Count, how many did not land, and the landed ones' min, median, p90 and max (ms; nan
    when none landed)."""
    landed = [c.delay_ms for c in changes if c.delay_ms is not None]
    # nearest rank: each figure is one of the delays measured
    q = (
        np.quantile(landed, (0.0, 0.5, 0.9, 1.0), method="inverted_cdf")
        if landed
        else [math.nan] * 4
    )
    return {
        "changes": len(changes),
        "not_landed": len(changes) - len(landed),
        **{
            k: float(v) for k, v in zip(("min_ms", "median_ms", "p90_ms", "max_ms"), q, strict=True)
        },
    }
