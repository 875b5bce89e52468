"""Open a device from a spec string: ``sim:<profile>`` or ``nvml:<index>``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dvfs.device import Device
from dvfs.errors import NoDeviceError
from dvfs.profiles import PROFILES


def parse_device_spec(spec: str) -> tuple[str, str]:
    """Split and validate ``sim:<profile>`` / ``nvml:<index>``; ValueError names what is allowed."""
    kind, sep, arg = spec.partition(":")
    if not sep or kind not in ("sim", "nvml"):
        raise ValueError(f"bad device {spec!r}: expected 'sim:<profile>' or 'nvml:<index>'")
    if kind == "sim" and arg.lower() not in PROFILES:
        raise ValueError(
            f"bad device {spec!r}: unknown profile; known: {', '.join(sorted(PROFILES))}"
        )
    if kind == "nvml" and not (arg.isdigit()):
        raise ValueError(f"bad device {spec!r}: the NVML index must be a non-negative integer")
    return kind, arg.lower()


def open_device(spec: str, *, seed: int = 0, state_path: Path | None = None) -> Device:
    """Open the device ``spec`` names (see :func:`parse_device_spec`)."""
    kind, arg = parse_device_spec(spec)
    if kind == "sim":
        from dvfs.simulated import SimulatedDevice

        return SimulatedDevice(arg, rng=np.random.default_rng(seed), state_path=state_path)
    from dvfs.nvml import NvmlDevice

    return NvmlDevice(int(arg))


def default_device_spec() -> str:
    """NVML GPU 0 when one is present, else the simulated V100."""
    from dvfs.nvml import nvml_device_count

    try:
        return "nvml:0" if nvml_device_count() > 0 else "sim:v100"
    except NoDeviceError:
        return "sim:v100"
