"""The event loop's lag, sampled by a timer (injected clock, a real loop)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Histogram

from api.looplag import LAG_BUCKETS_S, LoopLagProbe


def _histogram() -> tuple[Histogram, CollectorRegistry]:
    registry = CollectorRegistry()
    return Histogram("lag_seconds", "lag", buckets=LAG_BUCKETS_S, registry=registry), registry


def test_a_timer_run_late_is_observed_as_the_loops_lag() -> None:
    """The clock says the first tick came 0.2 s after it was due (a callback held the loop),
    every later one on time: the histogram has the one late tick and the others at zero,
    however late the real loop runs them."""
    histogram, registry = _histogram()
    # read at the start (due 0.001), then twice a tick: its time, and the next one's due from it
    readings = iter([0.0, 0.201, 0.201, *(0.201 + 0.001 * (i // 2 + 1) for i in range(10_000))])
    probe = LoopLagProbe(histogram, interval_s=0.001, clock=lambda: next(readings))

    async def run() -> None:
        probe.start()
        for _ in range(2000):
            if (registry.get_sample_value("lag_seconds_count") or 0) >= 5:
                break
            await asyncio.sleep(0.001)
        probe.stop()

    asyncio.run(run())
    count = registry.get_sample_value("lag_seconds_count")
    assert count is not None and count >= 5
    assert registry.get_sample_value("lag_seconds_sum") == pytest.approx(0.2)
    assert registry.get_sample_value("lag_seconds_bucket", {"le": "0.001"}) == count - 1
    assert probe.worst_s == pytest.approx(0.2)


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        LoopLagProbe(_histogram()[0], interval_s=0.0)
