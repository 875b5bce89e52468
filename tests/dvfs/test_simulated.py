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
    assert dev.gpu_busy_s() == pytest.approx(0.5)  # what NVML's utilization would integrate


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


def test_batch_laws_reproduce_their_published_tables() -> None:
    """Latency of a batch over batch 1, through Triton (DeepLearningExamples' Triton READMEs),
    and board power over batch 1 (NVIDIA's V100 ResNet-50 table), at the tabulated batches."""
    from dvfs.profiles import CNN, TRANSFORMER

    v100, a100 = get_profile("v100"), get_profile("a100")
    cnn, bert = v100.model(CNN), v100.model(TRANSFORMER)
    top = v100.max_clock_mhz
    published_ms = {1: 2.838, 8: 5.979, 32: 15.664}  # V100-32GB, ResNet-50, Triton
    for b, ms in published_ms.items():
        assert cnn.mean_latency_ms(top, b) / cnn.mean_latency_ms(top, 1) == pytest.approx(
            ms / 2.838
        )
    assert bert.mean_latency_ms(top, 16) / bert.mean_latency_ms(top, 1) == pytest.approx(70.7 / 8)
    assert a100.model(TRANSFORMER).law.latency_factor(8) == pytest.approx(15.4 / 3.6)
    # Board power at the top clock: 120 W at batch 1, 153 W at batch 8 (published).
    assert cnn.busy_power_w(top, 1) == pytest.approx(120.0)
    assert cnn.busy_power_w(top, 8) == pytest.approx(153.0)
    # The transformer is slower than the CNN by the published batch-1 ratio.
    assert bert.mean_latency_ms(top) / cnn.mean_latency_ms(top) == pytest.approx(8.0 / 2.838)
    # Between tabulated batches: linear; past the last: extrapolated (latency), held (power).
    assert cnn.law.latency_factor(3) == pytest.approx(
        (cnn.law.latency_factor(2) + 4.191 / 2.838) / 2
    )
    assert cnn.law.latency_factor(64) > cnn.law.latency_factor(32)
    assert cnn.law.power_factor(1000) == cnn.law.power_factor(128)


@pytest.mark.parametrize("gpu", ["v100", "rtx3090", "titanrtx", "a100", "h100", "h200"])
def test_energy_per_inference_falls_with_the_batch_and_the_cnn_batches_better(gpu: str) -> None:
    p = get_profile(gpu)
    cnn, bert = p.model("resnet50"), p.model("bert-large")
    energies = [cnn.energy_per_inference_j(p.max_clock_mhz, b) for b in (1, 4, 8, cnn.max_batch)]
    assert energies == sorted(energies, reverse=True)
    # The transformer saturates early: its published power and time per batch can make a batch
    # of 8 cost a little more per request than one of 4 (A100), but never more than batch 1.
    assert bert.energy_per_inference_j(p.max_clock_mhz, bert.max_batch) < 0.8 * (
        bert.energy_per_inference_j(p.max_clock_mhz, 1)
    )
    for m in (cnn, bert):
        assert m.busy_power_w(p.max_clock_mhz, m.max_batch) <= p.tdp_w
    gain = {m.name: m.capacity_rps() / m.capacity_rps(1) for m in (cnn, bert)}
    assert gain["resnet50"] > gain["bert-large"] > 1.0


def test_batches_share_the_gpu_and_power_follows_the_running_models() -> None:
    from dvfs.simulated import shared_time_ms

    vt = VirtualTime()
    dev = SimulatedDevice("v100", time_source=vt)
    dev.set_clock_mhz(1530)
    vt.advance_by(0.01)
    p = dev.profile
    cnn, bert = p.model("resnet50"), p.model("bert-large")
    dev.begin_work("resnet50", 8)
    assert dev.sharing("resnet50") == (1530, 8, 1)
    assert dev.power_w() == pytest.approx(cnn.busy_power_w(1530, 8))
    dev.begin_work("resnet50", 4)  # a second instance: the two run as a batch of 12
    assert dev.sharing("resnet50") == (1530, 12, 1)
    assert dev.power_w() == pytest.approx(cnn.busy_power_w(1530, 12))
    dev.begin_work("bert-large", 2)  # another model: time-shared, power the mean of the two
    assert dev.sharing("bert-large") == (1530, 2, 2)
    floor = p.busy_floor_w
    both = (cnn.busy_power_w(1530, 12) - floor + bert.busy_power_w(1530, 2) - floor) / 2
    assert dev.power_w() == pytest.approx(floor + both)
    assert shared_time_ms(cnn, 1530, 4, 12, 2) == pytest.approx(2 * cnn.mean_latency_ms(1530, 12))
    dev.end_work("resnet50", 8)
    dev.end_work("resnet50", 4)
    dev.end_work("bert-large", 2)
    assert dev.stats().completed == 14
    with pytest.raises(RuntimeError, match="without a matching begin_work"):
        dev.end_work("bert-large", 2)
    with pytest.raises(KeyError, match="no model 'gpt' on the simulated v100"):
        dev.begin_work("gpt", 1)


def test_an_engine_sets_the_power_while_it_runs_and_the_counter_integrates_it() -> None:
    dev, vt = make_device("h100")
    p = dev.profile
    dev.set_clock_mhz(p.max_clock_mhz)
    vt.advance_to(1.0)
    start = dev.energy_j()
    assert dev.engine_power(400.0) == p.max_clock_mhz
    vt.advance_to(1.5)
    dev.engine_power(250.0)  # the next iteration draws less
    vt.advance_to(2.0)
    assert dev.engine_power(None) == p.max_clock_mhz
    vt.advance_to(3.0)
    stats = dev.stats()
    assert stats.energy_j - start == pytest.approx(
        400.0 * 0.5 + 250.0 * 0.5 + p.idle_power_w(p.max_clock_mhz) * 1.0
    )
    assert stats.busy_s == pytest.approx(1.0) and stats.active == 0
    dev.engine_power(None)  # idle twice: nothing to end
    assert dev.stats().active == 0
