from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

import dvfs.nvml
from dvfs.errors import (
    DeviceError,
    DeviceNotSupportedError,
    DevicePermissionError,
    InvalidClockError,
    NoDeviceError,
)
from dvfs.nvml import EXIT_GUARD, NvmlDevice
from tests.dvfs.fake_nvml import FakeNvml


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml()
    monkeypatch.setattr(dvfs.nvml, "pynvml", fake)
    return fake


def locks(fake: FakeNvml) -> list[tuple[object, ...]]:
    return [c for c in fake.calls if c[0] in ("lock", "reset")]


def test_identity_and_clocks_at_top_memory_clock(nvml: FakeNvml) -> None:
    dev = NvmlDevice(0)
    assert dev.identity.name == "NVIDIA H200"
    assert dev.identity.uuid == "GPU-1234"
    assert dev.supported_clocks_mhz() == [345, 1200, 1965, 1980]
    assert dev.clock_mhz() == 1380
    assert dev.power_w() == 250.0
    dev.close()
    assert nvml.inits == 0


def test_lock_is_exact_noop_when_unchanged_and_reset_on_close(nvml: FakeNvml) -> None:
    dev = NvmlDevice(0)
    dev.set_clock_mhz(1200)
    dev.set_clock_mhz(1200)
    assert locks(nvml) == [("lock", "handle0", 1200, 1200)]
    with pytest.raises(InvalidClockError, match="1201 MHz is not a supported clock"):
        dev.set_clock_mhz(1201)
    dev.close()
    assert locks(nvml)[-1] == ("reset", "handle0")


def test_permission_error_is_translated_with_advice(nvml: FakeNvml) -> None:
    nvml.fail["nvmlDeviceSetGpuLockedClocks"] = pynvml.NVML_ERROR_NO_PERMISSION
    dev = NvmlDevice(0)
    with pytest.raises(DevicePermissionError, match="root or CAP_SYS_ADMIN") as info:
        dev.set_clock_mhz(1980)
    assert isinstance(info.value.__cause__, pynvml.NVMLError)
    nvml.fail["nvmlDeviceSetGpuLockedClocks"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(DeviceNotSupportedError, match="Volta or newer"):
        dev.set_clock_mhz(1980)
    nvml.fail["nvmlDeviceSetGpuLockedClocks"] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(DeviceError):
        dev.set_clock_mhz(1980)
    dev.close()


def test_no_gpu_and_bad_index(nvml: FakeNvml) -> None:
    with pytest.raises(NoDeviceError, match="GPU index 3 does not exist; this node has 1"):
        NvmlDevice(3)
    nvml.fail["nvmlInit"] = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(NoDeviceError, match="nvidia-smi"):
        NvmlDevice(0)


def test_energy_counter_in_joules(nvml: FakeNvml) -> None:
    dev = NvmlDevice(0)
    assert dev.energy_j() == 1000.0
    nvml.energy_mj += 2500
    assert dev.energy_j() == 1002.5


def test_energy_falls_back_to_integrating_power(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(energy_counter=False)
    monkeypatch.setattr(dvfs.nvml, "pynvml", fake)
    now = [10.0]
    dev = NvmlDevice(0, time_source=lambda: now[0])
    assert dev.energy_j() == 0.0
    now[0] = 12.0
    fake.power_mw = 150_000  # trapezoid of 250 W and 150 W over 2 s
    assert dev.energy_j() == pytest.approx(400.0)


def test_exit_guard_resets_locked_gpus(nvml: FakeNvml) -> None:
    dev = NvmlDevice(0)
    dev.set_clock_mhz(345)
    EXIT_GUARD.reset_all()
    assert locks(nvml)[-1] == ("reset", "handle0")
    unguarded = NvmlDevice(0, reset_at_exit=False)
    unguarded.set_clock_mhz(1980)
    unguarded.close()
    assert locks(nvml)[-1] == ("lock", "handle0", 1980, 1980)


_CHILD = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
import dvfs.nvml
from tests.dvfs.fake_nvml import FakeNvml
fake = FakeNvml()
orig = fake.nvmlDeviceResetGpuLockedClocks
def reset(handle):
    orig(handle)
    open({log!r}, "a").write("reset\\n")
fake.nvmlDeviceResetGpuLockedClocks = reset
dvfs.nvml.pynvml = fake
dev = dvfs.nvml.NvmlDevice(0)
dev.set_clock_mhz(345)
open({log!r}, "a").write("locked\\n")
{how}
"""


@pytest.mark.parametrize(
    ("how", "code"),
    [
        ("sys.exit(0)", 0),
        ("raise RuntimeError('crash')", 1),
        ("os.kill(os.getpid(), signal.SIGTERM); time.sleep(10)", 128 + 15),
        ("raise KeyboardInterrupt", None),
    ],
)
def test_locked_gpu_is_reset_on_every_catchable_exit(
    tmp_path: Path, how: str, code: int | None
) -> None:
    log = tmp_path / "log"
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD.format(root=root, log=str(log), how=how)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if code is not None:
        assert proc.returncode == code, proc.stderr
    assert log.read_text().splitlines() == ["locked", "reset"]
