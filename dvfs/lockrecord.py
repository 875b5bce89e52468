"""A lock record per GPU: who may have its clock locked, so a successor can tell after a crash.

While a sidecar holds a GPU it keeps ``<state_dir>/locks/<gpu uuid>.json``: its pid, the pid's
start time (so a recycled pid is not mistaken for it), the device and its temporary directory.
A clean exit gives the clock back and removes the record. A record found at start whose process
is gone means the predecessor died (SIGKILL, OOM, power) possibly with the clock locked: the
newcomer logs it, resets the GPU before serving and deletes the predecessor's temporary state.
A record whose process is alive means another sidecar drives this GPU: refused.
``python -m dvfs reset`` still resets by hand.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from dvfs.device import Device
from dvfs.errors import DeviceError

log = logging.getLogger(__name__)


class GpuInUseError(DeviceError):
    """Another live sidecar holds this GPU's lock record."""


@dataclass(frozen=True)
class LockRecord:
    pid: int
    pid_start: str
    device: str
    started_at: float
    tmp_dir: str | None = None


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (None when no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(record: LockRecord) -> bool:
    return process_start(record.pid) == record.pid_start


class GpuLockRecord:
    """The record for one GPU, named by its UUID under ``state_dir/locks``."""

    def __init__(self, state_dir: Path, device: Device) -> None:
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", device.identity.uuid)
        self.path = state_dir / "locks" / f"{name}.json"
        self.device = device
        self._held = False

    def read(self) -> LockRecord | None:
        try:
            return LockRecord(**json.loads(self.path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def acquire(self, tmp_dir: Path | None = None, *, exclusive: bool = True) -> LockRecord | None:
        """Take the GPU: reset it first if a dead predecessor left its record (returned).

        ``exclusive`` (a real GPU): a live holder is an error. A simulated GPU lives in its
        sidecar's own temporary state, so two live ones do not collide: the newer one records.
        """
        previous = self.read()
        if previous is not None and previous.pid != os.getpid() and _alive(previous):
            if not exclusive:
                previous = None
            else:
                raise GpuInUseError(
                    f"{self.device.identity.name} is driven by another sidecar "
                    f"(pid {previous.pid}, record {self.path})"
                )
        if previous is not None and previous.pid != os.getpid():
            log.warning(
                "a previous sidecar (pid %d, started %s) died holding %s: resetting its clock",
                previous.pid,
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(previous.started_at)),
                self.device.identity.name,
            )
            self.device.reset()
            _remove_tmp(previous.tmp_dir)
        record = LockRecord(
            pid=os.getpid(),
            pid_start=process_start(os.getpid()) or "",
            device=self.device.identity.uuid,
            started_at=time.time(),
            tmp_dir=None if tmp_dir is None else str(tmp_dir),
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps(asdict(record)))
        partial.replace(self.path)
        self._held = True
        return previous if previous is not None and previous.pid != os.getpid() else None

    def release(self) -> None:
        """After the clock has been given back: the record goes."""
        if self._held:
            record = self.read()
            if record is not None and record.pid == os.getpid():
                with contextlib.suppress(OSError):
                    self.path.unlink()
            self._held = False


def _remove_tmp(tmp_dir: str | None) -> None:
    """Delete a dead sidecar's temporary directory (only one of ours, in the temp area)."""
    if tmp_dir is None:
        return
    path = Path(tmp_dir)
    if path.parent == Path(tempfile.gettempdir()) and path.name.startswith("sidecar-"):
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed the dead sidecar's temporary state %s", path)
