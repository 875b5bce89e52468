from __future__ import annotations

import math
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest

from dvfs.errors import InvalidClockError
from dvfs.profiles import PROFILES, get_profile
from dvfs.simulated import SimulatedDevice
from dvfs.timesource import VirtualTime


def make_device(
    profile: str = "v100", seed: int = 0, **kw: object
) -> tuple[SimulatedDevice, VirtualTime]:
    vt = VirtualTime()
    return SimulatedDevice(profile, time_source=vt, rng=np.random.default_rng(seed), **kw), vt  # type: ignore[arg-type]


def test_profiles_have_ladders_and_seed_spreads() -> None:
    assert {"v100", "rtx3090", "titanrtx", "a100", "h100"} <= set(PROFILES)
    assert get_profile("rtx3090").latency_std_ms == 2.39
    assert get_profile("titanrtx").latency_std_ms == 1.73
    assert get_profile("v100").latency_std_ms == 0.49
    v100 = get_profile("v100")
    assert (v100.min_clock_mhz, v100.max_clock_mhz, len(v100.clocks_mhz)) == (135, 1530, 187)
    assert list(v100.clocks_mhz) == sorted(set(v100.clocks_mhz))
    with pytest.raises(KeyError, match="known: a100"):
        get_profile("gtx480")


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_energy_per_inference_is_u_shaped(name: str) -> None:
    p = PROFILES[name]
    best = p.energy_optimal_clock_mhz()
    assert p.min_clock_mhz < best < p.max_clock_mhz
    assert p.energy_per_inference_j(p.min_clock_mhz) > p.energy_per_inference_j(best)
    assert p.energy_per_inference_j(p.max_clock_mhz) > p.energy_per_inference_j(best)
    # Latency follows the inverse-linear law pinned at both ends of the ladder.
    assert p.mean_latency_ms(p.max_clock_mhz) == pytest.approx(p.latency_at_max_ms)
    assert p.mean_latency_ms(p.min_clock_mhz) == pytest.approx(p.latency_at_min_ms)


def test_latency_spread_matches_profile() -> None:
    dev, _ = make_device("rtx3090", seed=3)
    samples = np.array([dev.sample_latency_ms(2100) for _ in range(20000)])
    assert samples.mean() == pytest.approx(get_profile("rtx3090").mean_latency_ms(2100), rel=0.02)
    assert samples.std() == pytest.approx(2.39, rel=0.05)
    assert np.mean(samples - samples.mean() > 2 * 2.39) > np.mean(
        samples.mean() - samples > 2 * 2.39
    )


def test_set_clock_takes_effect_after_delay_and_is_noop_when_unchanged() -> None:
    dev, vt = make_device()
    dev.set_clock_mhz(772)
    assert dev.clock_mhz() == 135  # not yet
    vt.advance_by(dev.profile.clock_change_delay_s)
    assert dev.clock_mhz() == 772
    dev.set_clock_mhz(772)
    assert dev.stats().clock_changes == 1
    with pytest.raises(InvalidClockError, match="773 MHz is not a supported clock"):
        dev.set_clock_mhz(773)


def test_energy_counter_integrates_idle_and_busy_power_exactly() -> None:
    dev, vt = make_device()
    p = dev.profile
    dev.set_clock_mhz(1530)
    delay = p.clock_change_delay_s
    vt.advance_to(1.0)
    dev.begin_work()
    vt.advance_to(1.5)
    dev.end_work()
    vt.advance_to(2.0)
    expected = (
        p.idle_power_w(135) * delay
        + p.idle_power_w(1530) * (1.0 - delay)
        + p.busy_power_w(1530) * 0.5
        + p.idle_power_w(1530) * 0.5
    )
    stats = dev.stats()
    assert stats.energy_j == pytest.approx(expected)
    assert stats.busy_energy_j == pytest.approx(p.busy_power_w(1530) * 0.5)
    assert stats.busy_s == pytest.approx(0.5)
    assert dev.energy_j() == pytest.approx(expected)  # reading does not change it


def test_unlocked_gpu_boosts_while_busy_and_falls_after_idle_spell() -> None:
    dev, vt = make_device()
    p = dev.profile
    dev.begin_work()
    vt.advance_by(p.clock_change_delay_s)
    assert dev.clock_mhz() == p.max_clock_mhz
    dev.end_work()
    vt.advance_by(p.idle_downclock_s / 2)
    assert dev.clock_mhz() == p.max_clock_mhz
    vt.advance_by(p.idle_downclock_s)
    assert dev.clock_mhz() == p.min_clock_mhz
    dev.set_clock_mhz(772)
    dev.reset()
    assert not dev.is_locked()


def test_end_work_without_begin_is_an_error() -> None:
    dev, _ = make_device()
    with pytest.raises(RuntimeError):
        dev.end_work()


def _child_adds_work(path: str, n: int) -> None:
    dev = SimulatedDevice.attach(Path(path))
    for _ in range(n):
        dev.begin_work()
        dev.end_work()
    dev.close()


def test_state_file_is_shared_and_safe_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "gpu0.state"
    owner = SimulatedDevice("v100", state_path=path)
    owner.set_clock_mhz(1200)
    reader = SimulatedDevice.attach(path)
    assert reader.profile.name == "v100"
    assert reader.is_locked()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_child_adds_work, args=(str(path), 300)) for _ in range(2)]
    for proc in procs:
        proc.start()
    _child_adds_work(str(path), 300)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    stats = owner.stats()
    assert stats.completed == 900
    assert stats.active == 0
    assert stats.energy_j > 0 and math.isfinite(stats.energy_j)
    owner.close()
    reader.close()


def test_attach_rejects_missing_or_foreign_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="start the device that owns it"):
        SimulatedDevice.attach(tmp_path / "nope")
    bad = tmp_path / "bad"
    bad.write_bytes(b"hello world, not a gpu" * 4)
    with pytest.raises(ValueError, match="not a simulated-GPU state file"):
        SimulatedDevice.attach(bad)
