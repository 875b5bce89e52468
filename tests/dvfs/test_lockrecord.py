"""Crash recovery of clocks: a SIGKILLed holder's lock record is found and its GPU reset."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dvfs.lockrecord import GpuInUseError, GpuLockRecord
from dvfs.simulated import SimulatedDevice

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from dvfs.lockrecord import GpuLockRecord
    from dvfs.simulated import SimulatedDevice

    state_dir, state_file, tmp_dir = map(Path, sys.argv[1:4])
    device = SimulatedDevice("v100", state_path=state_file)
    GpuLockRecord(state_dir, device).acquire(tmp_dir)
    device.set_clock_mhz(device.supported_clocks_mhz()[0])
    print("locked", flush=True)
    time.sleep(600)
    """
)


def holder(tmp_path: Path, tmp_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "state"), str(tmp_path / "gpu0.state"),
         str(tmp_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_a_sigkilled_holder_is_detected_and_its_gpu_reset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tmp_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"sidecar-test-{os.getpid()}"
    tmp_dir.mkdir(exist_ok=True)
    proc = holder(tmp_path, tmp_dir)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    device = SimulatedDevice.attach(tmp_path / "gpu0.state")
    assert device.is_locked()  # what a killed sidecar leaves on a real GPU
    lock = GpuLockRecord(tmp_path / "state", device)
    previous = lock.acquire()
    assert previous is not None and previous.pid == proc.pid
    assert not device.is_locked()
    assert "died holding" in caplog.text
    assert not tmp_dir.exists()  # its temporary state is cleaned up
    record = lock.read()
    assert record is not None and record.pid == os.getpid()
    lock.release()
    assert not lock.path.exists()


def test_a_live_holder_of_a_real_gpu_is_refused(tmp_path: Path) -> None:
    proc = holder(tmp_path, tmp_path / "unused")
    try:
        device = SimulatedDevice.attach(tmp_path / "gpu0.state")
        with pytest.raises(GpuInUseError, match=f"pid {proc.pid}"):
            GpuLockRecord(tmp_path / "state", device).acquire(exclusive=True)
        assert device.is_locked()  # nobody touched it
        assert GpuLockRecord(tmp_path / "state", device).acquire(exclusive=False) is None
    finally:
        proc.kill()
        proc.wait()


def test_a_recycled_pid_is_not_taken_for_the_holder(tmp_path: Path) -> None:
    device = SimulatedDevice("v100")
    lock = GpuLockRecord(tmp_path, device)
    lock.acquire()
    text = lock.path.read_text().replace(f'"pid": {os.getpid()}', '"pid": 1')  # init, alive
    lock.path.write_text(text)
    device.set_clock_mhz(device.supported_clocks_mhz()[0])
    time.sleep(0.01)
    assert GpuLockRecord(tmp_path, device).acquire() is not None  # pid 1 started elsewhen
    assert not device.is_locked()
