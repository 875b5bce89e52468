"""Make every NVML call that could change a GPU raise, in this process, before anything runs.

An allow-list, not a block-list: only ``nvmlInit*``, ``nvmlShutdown``, ``nvmlErrorString`` and
the getters (``nvml…Get…``) stay callable; every other NVML function (locked clocks, power limit,
persistence, ECC, MIG, fans, application clocks, anything a newer binding adds) is replaced by
one that raises :class:`NvmlWriteForbiddenError` without reaching the driver.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import ModuleType
from typing import Any, NoReturn

from dvfs.readonly import DeviceWriteForbiddenError

READS = re.compile(r"^nvml(Device|System|Unit|GpuInstance|ComputeInstance|Vgpu\w*?|Gpm\w*?)?Get")
ALWAYS = frozenset(
    {"nvmlInit", "nvmlInitWithFlags", "nvmlInit_v2", "nvmlShutdown", "nvmlErrorString"}
)


class NvmlWriteForbiddenError(DeviceWriteForbiddenError):
    """An NVML function that is not a read was called while the guard is on."""


def _forbidden(name: str) -> Callable[..., NoReturn]:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise NvmlWriteForbiddenError(
            f"{name} refused: the GPU check is read-only and never changes a GPU setting"
        )

    refuse.__name__ = name
    return refuse


def is_read(name: str) -> bool:
    """Whether the NVML function ``name`` may be called under the guard."""
    return name in ALWAYS or READS.match(name) is not None


def forbid_nvml_writes(pynvml: ModuleType) -> list[str]:
    """Replace every non-read NVML function of ``pynvml``; returns the names replaced."""
    replaced = []
    for name in dir(pynvml):
        value = getattr(pynvml, name)
        function = name.startswith("nvml") and callable(value) and not isinstance(value, type)
        if function and not is_read(name):
            setattr(pynvml, name, _forbidden(name))
            replaced.append(name)
    return replaced
