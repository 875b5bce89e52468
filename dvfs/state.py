"""The simulated GPU's state, in memory or in a small file that several processes share.

The sidecar sets the clock; the emulated Triton model (another process) reads it and adds the
energy it burns, as a real GPU would see both. Every change is a read-modify-write under an
exclusive ``flock`` on the file (and a thread lock, since ``flock`` does not separate threads that
share a descriptor), so two processes never interleave a transaction.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Protocol

_MAGIC = b"SIMGPU03"
_HEADER = struct.Struct("<8s16s")
_FIELDS = struct.Struct("<" + "d" * 19)


@dataclass
class DeviceState:
    """Everything the model of one GPU remembers between calls."""

    locked: float = 0.0
    target_clock_mhz: float = 0.0
    clock_mhz: float = 0.0
    pending_clock_mhz: float = 0.0
    pending_at_s: float = float("inf")
    energy_j: float = 0.0
    busy_energy_j: float = 0.0
    last_t_s: float = 0.0
    active: float = 0.0
    busy_s: float = 0.0
    last_busy_end_s: float = float("-inf")
    clock_changes: float = 0.0
    completed: float = 0.0
    clock_mhz_s: float = 0.0
    # Requests running, per model (in the order of the profile's models; at most MAX_MODELS).
    batch_0: float = 0.0
    batch_1: float = 0.0
    batch_2: float = 0.0
    batch_3: float = 0.0
    # A generative engine that prices its own iterations (dvfs.llm_profiles): its board power
    # while it runs (0: none running).
    engine_power_w: float = 0.0


MAX_MODELS = 4
# The fields in the file's order, read once: dataclasses.astuple deep-copies every value, which
# was two thirds of a transaction's time (each emulated batch makes two).
_NAMES = tuple(f.name for f in fields(DeviceState))


class StateStore(Protocol):
    """Where a :class:`DeviceState` lives; ``transaction`` gives exclusive read-modify-write."""

    profile_name: str

    def transaction(self) -> AbstractContextManager[DeviceState]: ...

    def close(self) -> None: ...


class MemoryStateStore:
    """State in this process only: what the simulator uses (fast, no I/O)."""

    def __init__(self, profile_name: str, initial: DeviceState) -> None:
        self.profile_name = profile_name
        self._state = initial
        self._lock = threading.Lock()

    @contextmanager
    def transaction(self) -> Iterator[DeviceState]:
        with self._lock:
            yield self._state

    def close(self) -> None:
        """Nothing to release."""


class FileStateStore:
    """State in a file that any process may open, guarded by ``flock``."""

    def __init__(
        self, path: Path, profile_name: str | None = None, initial: DeviceState | None = None
    ) -> None:
        """Create the file (``initial`` given) or attach to an existing one (``initial`` None)."""
        self.path = Path(path)
        self._lock = threading.Lock()
        if initial is not None:
            if profile_name is None:
                raise ValueError("a new state file needs a profile name")
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            self.profile_name = profile_name
            with self._locked():
                os.ftruncate(self._fd, 0)
                os.pwrite(self._fd, _HEADER.pack(_MAGIC, profile_name.encode()), 0)
                self._write(initial)
        else:
            try:
                self._fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"no simulated-GPU state file at {self.path}; "
                    "start the device that owns it first"
                ) from None
            raw = os.pread(self._fd, _HEADER.size, 0)
            if len(raw) != _HEADER.size or raw[:8] != _MAGIC:
                os.close(self._fd)
                raise ValueError(f"{self.path} is not a simulated-GPU state file")
            self.profile_name = _HEADER.unpack(raw)[1].rstrip(b"\0").decode()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _read(self) -> DeviceState:
        raw = os.pread(self._fd, _FIELDS.size, _HEADER.size)
        return DeviceState(*_FIELDS.unpack(raw))

    def _write(self, state: DeviceState) -> None:
        os.pwrite(self._fd, _FIELDS.pack(*[getattr(state, n) for n in _NAMES]), _HEADER.size)

    @contextmanager
    def transaction(self) -> Iterator[DeviceState]:
        with self._locked():
            state = self._read()
            yield state
            self._write(state)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
