"""Open a device from a spec string: ``sim:<profile>`` or ``nvml:<index>``; and the list of
GPUs one sidecar drives (``nvml:0,1,2,3``, ``sim:v100x2``, ``sim:v100,sim:a100``)."""

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


def parse_device_list(spec: str) -> list[str]:
    """The GPUs ``spec`` names, one spec each (see :func:`parse_device_spec`), in order.

    Comma-separated; an item without ``kind:`` takes the previous item's kind (``nvml:0,1,2``,
    ``sim:v100,a100``), and ``<profile>x<n>`` is ``n`` simulated GPUs of that profile
    (``sim:v100x2``). The same NVML GPU twice is refused. ValueError names the bad item."""
    out: list[str] = []
    kind = ""
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            raise ValueError(f"bad device list {spec!r}: an empty item")
        if ":" in item:
            kind, _, arg = item.partition(":")
        elif kind:
            arg = item
        else:
            raise ValueError(f"bad device {item!r}: expected 'sim:<profile>' or 'nvml:<index>'")
        count = 1
        name, x, times = arg.lower().rpartition("x")
        if kind == "sim" and x and times.isdigit() and name in PROFILES:
            count, arg = int(times), name
            if count < 1:
                raise ValueError(f"bad device {item!r}: at least one GPU")
        one = ":".join(parse_device_spec(f"{kind}:{arg}"))
        out.extend([one] * count)
    nvml = [s for s in out if s.startswith("nvml:")]
    if len(set(nvml)) != len(nvml):
        raise ValueError(f"bad device list {spec!r}: an NVML GPU named twice")
    return out


def open_device(
    spec: str, *, seed: int = 0, state_path: Path | None = None, index: int = 0
) -> Device:
    """Open the device ``spec`` names (see :func:`parse_device_spec`); a simulated one is the
    node's ``index``-th GPU."""
    kind, arg = parse_device_spec(spec)
    if kind == "sim":
        from dvfs.simulated import SimulatedDevice

        return SimulatedDevice(
            arg, index=index, rng=np.random.default_rng(seed), state_path=state_path
        )
    from dvfs.nvml import NvmlDevice

    return NvmlDevice(int(arg))


def default_device_spec() -> str:
    """NVML GPU 0 when one is present, else the simulated V100."""
    from dvfs.nvml import nvml_device_count

    try:
        return "nvml:0" if nvml_device_count() > 0 else "sim:v100"
    except NoDeviceError:
        return "sim:v100"
