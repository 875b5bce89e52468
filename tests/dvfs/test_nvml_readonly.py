"""NvmlDevice's read-only paths end to end against a fake NVML patched where dvfs.nvml looks it
up: listing, ladder, clock, power, the energy counter and its update interval, every error."""

from __future__ import annotations

import math
from collections.abc import Callable

import pynvml
import pytest

import dvfs.nvml
from dvfs.__main__ import main
from dvfs.energy import EnergyCounter, EnergyReading, average_power_w, energy_per_inference_j
from dvfs.errors import (
    DeviceError,
    DeviceLostError,
    DeviceNotSupportedError,
    DevicePermissionError,
    InvalidClockError,
    NoDeviceError,
)
from dvfs.nvml import NvmlDevice
from dvfs.readonly import DeviceWriteForbiddenError, ReadOnlyDevice
from tests.dvfs.fake_nvml import FakeNvml

CODES = sorted(
    (name, getattr(pynvml, name)) for name in dir(pynvml) if name.startswith("NVML_ERROR_")
)
EXPECTED = {
    "NVML_ERROR_NO_PERMISSION": DevicePermissionError,
    "NVML_ERROR_LIBRARY_NOT_FOUND": NoDeviceError,
    "NVML_ERROR_DRIVER_NOT_LOADED": NoDeviceError,
    "NVML_ERROR_NOT_FOUND": NoDeviceError,
    "NVML_ERROR_UNINITIALIZED": NoDeviceError,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": NoDeviceError,
    "NVML_ERROR_NOT_SUPPORTED": DeviceNotSupportedError,
    "NVML_ERROR_FUNCTION_NOT_FOUND": DeviceNotSupportedError,
    "NVML_ERROR_GPU_IS_LOST": DeviceLostError,
    "NVML_ERROR_RESET_REQUIRED": DeviceLostError,
    "NVML_ERROR_GPU_NOT_FOUND": DeviceLostError,
    "NVML_ERROR_INVALID_ARGUMENT": InvalidClockError,
    "NVML_ERROR_FREQ_NOT_SUPPORTED": InvalidClockError,
}
READS = {
    "supported clocks": ("nvmlDeviceGetSupportedGraphicsClocks", NvmlDevice.supported_clocks_mhz),
    "clock": ("nvmlDeviceGetClockInfo", NvmlDevice.clock_mhz),
    "power": ("nvmlDeviceGetPowerUsage", NvmlDevice.power_w),
}


class Clock:
    """Injected time for the device and the fake's counter."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml()
    monkeypatch.setattr(dvfs.nvml, "pynvml", fake)
    return fake


def counter_updating_every(clock: Clock, period_s: float, power_w: float) -> Callable[[], int]:
    """A total-energy counter (mJ) that the driver refreshes every ``period_s``."""

    def energy_mj() -> int:
        refreshed_s = math.floor(clock.now_s / period_s) * period_s
        return int(refreshed_s * power_w * 1000)

    return energy_mj


@pytest.mark.parametrize(("name", "code"), CODES)
@pytest.mark.parametrize("read", sorted(READS))
def test_every_nvml_error_on_every_read_is_ours(
    nvml: FakeNvml, name: str, code: int, read: str
) -> None:
    dev = NvmlDevice(0)
    function, method = READS[read]
    nvml.fail[function] = code
    with pytest.raises(EXPECTED.get(name, DeviceError)) as info:
        method(dev)
    assert isinstance(info.value.__cause__, pynvml.NVMLError)
    assert function in str(info.value)
    dev.close()


@pytest.mark.parametrize(("name", "code"), CODES)
def test_every_nvml_error_while_opening_is_ours_and_releases_nvml(
    nvml: FakeNvml, name: str, code: int
) -> None:
    for function in ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetName", "nvmlDeviceGetUUID"):
        nvml.fail = {function: code}
        with pytest.raises(EXPECTED.get(name, DeviceError)):
            NvmlDevice(0)
        assert nvml.inits == 0, f"NVML left initialised after {function} failed"


def test_energy_counter_errors_are_ours_but_not_supported_falls_back(nvml: FakeNvml) -> None:
    dev = NvmlDevice(0)
    nvml.fail["nvmlDeviceGetTotalEnergyConsumption"] = pynvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(DeviceLostError, match="nvmlDeviceGetTotalEnergyConsumption"):
        dev.energy_j()
    nvml.fail["nvmlDeviceGetTotalEnergyConsumption"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    assert dev.energy_j() == 0.0  # an old driver: integrating power from here on


def test_listing_reads_only(nvml: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    nvml.gpus = 2
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert out.count("GPU-1234") == 2  # both GPUs listed
    assert "345..1980 (4)" in out and "1380" in out and "250.0" in out
    assert not [c for c in nvml.calls if c[0] in ("lock", "reset")]
    assert nvml.inits == 0


def test_read_only_nvml_device_reads_everything_and_never_writes(nvml: FakeNvml) -> None:
    dev = ReadOnlyDevice(NvmlDevice(0))
    assert dev.identity.name == "NVIDIA H200"
    assert dev.supported_clocks_mhz() == [345, 1200, 1965, 1980]
    assert dev.clock_mhz() == 1380 and dev.power_w() == 250.0 and dev.energy_j() == 1000.0
    with pytest.raises(DeviceWriteForbiddenError):
        dev.set_clock_mhz(1200)
    with pytest.raises(DeviceWriteForbiddenError):
        dev.reset()
    dev.close()
    assert not [c for c in nvml.calls if c[0] in ("lock", "reset")]
    assert nvml.inits == 0


def test_power_from_a_counter_that_refreshes_every_100_ms(nvml: FakeNvml) -> None:
    clock = Clock()
    nvml.energy_fn = counter_updating_every(clock, 0.1, power_w=300.0)
    dev = NvmlDevice(0, time_source=clock)
    counter = dev.energy
    start = counter.next_change(poll_s=0.001, sleep=clock.sleep)
    assert counter.update_interval_s is None  # one change seen: no interval yet
    second = counter.next_change(poll_s=0.001, sleep=clock.sleep)
    assert counter.update_interval_s == pytest.approx(0.1, abs=0.002)
    # A raw read 30 ms later, inside one refresh interval: no energy, "0 W" if divided by the
    # reads' times. The readings say it is not known yet.
    clock.sleep(0.03)
    same = dev.energy_reading()
    assert same == second
    assert average_power_w(second, same, update_interval_s=counter.update_interval_s) is None
    clock.sleep(0.095)  # one refresh later: 30 J over 0.125 s of reads, "240 W"
    later = dev.energy_reading()
    assert later.energy_j - second.energy_j == pytest.approx(30.0)
    assert average_power_w(second, later, update_interval_s=counter.update_interval_s) is None
    # Over 2 s of refreshes, from change to change: the true power.
    clock.sleep(2.0)
    end = counter.next_change(poll_s=0.001, sleep=clock.sleep)
    power = average_power_w(start, end, update_interval_s=counter.update_interval_s)
    assert power == pytest.approx(300.0, rel=0.01)
    per_inference = energy_per_inference_j(
        start, end, inferences=100, window_s=2.0, update_interval_s=counter.update_interval_s
    )
    assert per_inference == pytest.approx(6.0, rel=0.01)  # 300 W x 2 s / 100


def test_a_counter_that_changes_at_every_read_has_the_reads_interval() -> None:
    clock = Clock()
    counter = EnergyCounter(clock, clock)  # joules = seconds: a new value at every read
    for _ in range(3):
        clock.sleep(0.01)
        counter.read()
    assert counter.update_interval_s == pytest.approx(0.01)


def test_counter_learns_the_shortest_refresh_gap() -> None:
    clock = Clock()
    # Read every 10 ms, the counter changes every 0.5 s; then a read 0.3 s late sees another
    # change: that 0.3 s gap was not seen precisely and does not count.
    values = [0.0] * 50 + [1.0] * 50 + [2.0] * 10 + [3.0]
    steps = [0.01] * 110 + [0.3]
    counter = EnergyCounter(lambda: values.pop(0), clock)
    for step in steps:
        clock.sleep(step)
        reading = counter.read()
    assert reading == EnergyReading(3.0, clock.now_s)
    assert counter.update_interval_s == pytest.approx(0.5)
    assert (
        energy_per_inference_j(reading, reading, inferences=1, window_s=1, update_interval_s=1)
        is None
    )


def test_gpu_busy_seconds_integrate_the_utilization_samples(nvml: FakeNvml) -> None:
    """Each sample is the share of its period (from the sample before) with a kernel running;
    the first sample seen is the origin; no new sample, the same value."""
    dev = NvmlDevice(0)
    assert dev.gpu_busy_s() is None  # no sample yet: not known, and asked again later
    nvml.utilization = [(1_000_000, 40)]
    assert dev.gpu_busy_s() == 0.0
    nvml.utilization += [(1_166_667, 60), (1_333_333, 30)]
    assert dev.gpu_busy_s() == pytest.approx(0.6 * 0.166667 + 0.3 * 0.166666)
    busy = dev.gpu_busy_s()
    assert busy is not None and dev.gpu_busy_s() == busy
    nvml.utilization.append((2_333_333, 100))
    assert dev.gpu_busy_s() == pytest.approx(busy + 1.0)
    assert ReadOnlyDevice(dev).gpu_busy_s() == dev.gpu_busy_s()
    dev.close()


def test_a_gpu_without_utilization_samples_reports_no_busy_time(nvml: FakeNvml) -> None:
    nvml.utilization = None
    dev = NvmlDevice(0)
    assert dev.gpu_busy_s() is None
    assert dev.gpu_busy_s() is None
    assert [c for c in nvml.calls if c == ("nvmlDeviceGetSamples",)] == [
        ("nvmlDeviceGetSamples",)
    ]  # asked once, not at every read
    dev.close()


def test_a_lost_gpu_while_reading_utilization_is_an_error(nvml: FakeNvml) -> None:
    nvml.fail["nvmlDeviceGetSamples"] = pynvml.NVML_ERROR_GPU_IS_LOST
    dev = NvmlDevice(0)
    with pytest.raises(DeviceLostError, match="nvmlDeviceGetSamples"):
        dev.gpu_busy_s()
    dev.close()


def test_the_counter_reads_the_gpus_busy_time_with_each_new_value() -> None:
    clock = Clock()
    busy = iter([1.0, 1.5])
    values = [0.0, 0.0, 2.0]
    counter = EnergyCounter(lambda: values.pop(0), clock, lambda: next(busy))
    first = counter.read()
    assert first == EnergyReading(0.0, clock.now_s, 1.0)
    clock.sleep(0.1)
    assert counter.read() == first  # the same value: the busy time not read again
    clock.sleep(0.1)
    assert counter.read() == EnergyReading(2.0, clock.now_s, 1.5)
