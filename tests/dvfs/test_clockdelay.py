"""``python -m dvfs delay``: the clock-change delay read back from the device, in virtual time
against the simulated GPU (whose delay is known) and through the command line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dvfs.__main__ import main
from dvfs.clockdelay import change_sequence, measure_changes, summary_ms, time_landing
from dvfs.profiles import get_profile
from dvfs.simulated import SimulatedDevice
from dvfs.timesource import VirtualTime


def test_the_sequence_crosses_low_middle_and_top_both_ways() -> None:
    assert change_sequence([300, 900, 600, 1500, 1200], 6) == [1500, 300, 900, 1500, 900, 300]
    assert change_sequence([300, 600], 3) == [600, 300, 600]
    with pytest.raises(ValueError, match="at least two"):
        change_sequence([300], 2)
    with pytest.raises(ValueError, match="changes must be >= 1"):
        change_sequence([300, 600], 0)


@pytest.mark.parametrize("delay_s", [0.005, 0.02])
def test_the_delay_read_back_is_the_devices_own(delay_s: float) -> None:
    """Every change lands ``clock_change_delay_s`` after it is asked for on the simulated GPU:
    the reading shows it then, to within one poll; the clock is given back after."""
    vt = VirtualTime()
    profile = replace(get_profile("v100"), clock_change_delay_s=delay_s)
    device = SimulatedDevice(profile, time_source=vt)
    changes = measure_changes(device, 12, poll_s=0.0005, now=vt, sleep=vt.advance_by)
    assert len(changes) == 12 and {c.to_mhz for c in changes} == {135, 832, 1530}
    for c in changes:
        assert c.delay_ms is not None and c.from_mhz != c.to_mhz
        assert delay_s * 1000 <= c.delay_ms <= delay_s * 1000 + 0.5 + 1e-9
    stats = summary_ms(changes)
    assert stats["changes"] == 12 and stats["not_landed"] == 0
    assert stats["min_ms"] <= stats["median_ms"] <= stats["p90_ms"] <= stats["max_ms"]
    assert not device.is_locked()


def test_a_change_that_never_shows_is_reported_not_landed() -> None:
    """A device whose reading never moves (an idle GPU resting below its locked clock): each
    change is reported as not landed after the timeout, not waited on for ever."""
    vt = VirtualTime()

    class Stuck(SimulatedDevice):
        def clock_mhz(self) -> int:
            return 135

    device = Stuck("v100", time_source=vt)
    changes = measure_changes(device, 2, timeout_s=0.1, now=vt, sleep=vt.advance_by)
    assert [c.delay_ms for c in changes] == [None, 0.0]  # up: never seen; back down: at once
    stats = summary_ms(changes)
    assert stats["not_landed"] == 1 and stats["median_ms"] == 0.0


def test_cli_measures_a_simulated_gpu_and_says_what_to_set(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["delay", "--sim", "v100", "--changes", "6"]) == 0
    out = capsys.readouterr().out
    assert "V100" in out and "median" in out and "--slack-change-delay-ms" in out
    assert main(["delay", "--sim", "nosuch"]) == 2
    assert "'sim:nosuch': unknown profile" in capsys.readouterr().err


def test_a_raise_timed_by_the_sidecar_counts_from_the_ask_and_stops_when_abandoned() -> None:
    """``time_landing`` (the sidecar's own raises): the delay counts from when the change was
    asked for, before the call; a newer change abandons it; a reading that never shows it
    gives up at the timeout."""
    vt = VirtualTime()
    profile = replace(get_profile("v100"), clock_change_delay_s=0.02)
    device = SimulatedDevice(profile, time_source=vt)
    device.set_clock_mhz(135)
    vt.advance_by(0.1)
    asked_s = vt()
    vt.advance_by(0.003)  # the applier's turn, the thread's hop: before the call
    device.set_clock_mhz(1530)
    delay = time_landing(device, 1530, asked_s, lambda: False, now=vt, sleep=vt.advance_by)
    assert delay is not None and 23.0 <= delay <= 23.5 + 1e-9
    polls = []

    def abandon() -> bool:
        polls.append(vt())
        return len(polls) > 3

    device.set_clock_mhz(135)
    asked_s = vt()
    assert time_landing(device, 135, asked_s, abandon, now=vt, sleep=vt.advance_by) is None
    assert len(polls) == 4 and vt() - asked_s < 0.002
    asked_s = vt()
    late = time_landing(
        device, 832, asked_s, lambda: False, timeout_s=0.1, now=vt, sleep=vt.advance_by
    )
    assert late is None and 0.1 <= vt() - asked_s <= 0.101  # never asked for: never shows
