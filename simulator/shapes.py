"""Daily shapes of production inference traffic: arrival rate per hour, relative to the day's peak.

Only the shape of the rate curve is kept (24 numbers a day), never a trace's requests. Each
shape names where it comes from; :class:`DayShape` interpolates it and
:func:`simulator.workload.day_arrivals` compresses a day into seconds of simulated time.

* ``azure-code`` and ``azure-conv``: the Azure LLM inference trace 2024 (Stojkovic et al.,
  "DynamoLLM: Designing LLM Inference Clusters for Performance and Energy Efficiency", HPCA
  2025; data and notebook in github.com/Azure/AzurePublicDataset,
  ``AzureLLMInferenceDataset2024.md``). The notebook ``analysis/AzureLLMInferenceDataset2024.ipynb``
  plots the invocations per minute of the week's coding and conversation services; the numbers
  below are the hourly means of those published plots, digitised from the figure's pixels
  (read to about 2% of the peak), for Tuesday 14 May 2024 (UTC), each normalised to that day's
  highest hour. Coding swings 11× between its night and its afternoon; conversation 2×.
* ``diurnal``: a synthetic day, ``trough + (1 − trough)·(1 − cos 2πφ)/2`` over the day's phase
  ``φ``: the trough at midnight, the peak at noon (the shape of the issue's compressed day).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

AZURE_LLM_2024 = (
    "Azure LLM inference trace 2024 (DynamoLLM, HPCA 2025), "
    "AzurePublicDataset analysis/AzureLLMInferenceDataset2024.ipynb, invocations per minute, "
    "hourly means digitised, 2024-05-14 UTC"
)


@dataclass(frozen=True)
class DayShape:
    """A day's arrival rate relative to its peak: one value per equal slice of the day (hour 0
    first), read as the rate at the middle of its slice and interpolated linearly (the day
    wraps around)."""

    name: str
    relative: tuple[float, ...]
    source: str

    def __post_init__(self) -> None:
        if len(self.relative) < 2:
            raise ValueError(f"shape {self.name!r}: at least two points a day")
        if min(self.relative) < 0 or max(self.relative) <= 0:
            raise ValueError(f"shape {self.name!r}: rates must be >= 0, and one > 0")

    @property
    def trough(self) -> float:
        """The lowest rate over the peak."""
        return min(self.relative) / max(self.relative)

    def at(self, phase: FloatArray) -> FloatArray:
        """The rate over the day's peak at each ``phase`` (fraction of a day; wraps)."""
        values = np.asarray(self.relative, dtype=float) / max(self.relative)
        n = len(values)
        x = (np.asarray(phase, dtype=float) % 1.0) * n - 0.5
        xs = np.arange(-1, n + 1, dtype=float)
        ys = np.concatenate(([values[-1]], values, [values[0]]))
        out: FloatArray = np.interp(x, xs, ys)
        return out

    @classmethod
    def from_file(cls, path: Path) -> DayShape:
        """A shape from a text file: one relative rate per line (equal slices of a day, ``#``
        comments allowed); its source is the file."""
        values = read_numbers(path, "a relative rate", "rates")
        return cls(Path(path).stem, tuple(values), str(path))


def cosine_day(trough: float) -> DayShape:
    """The synthetic day: from ``trough`` of the peak at midnight to the peak at noon."""
    if not 0.0 <= trough <= 1.0:
        raise ValueError(f"trough must be in [0, 1], got {trough}")
    phases = (np.arange(96) + 0.5) / 96
    values = trough + (1.0 - trough) * (1.0 - np.cos(2.0 * np.pi * phases)) / 2.0
    return DayShape("diurnal", tuple(float(v) for v in values), "synthetic cosine day")


# fmt: off
_AZURE_CODE = (0.34, 0.36, 0.32, 0.22, 0.18, 0.14, 0.12, 0.10, 0.09, 0.11, 0.11, 0.16,
               0.31, 0.58, 0.81, 0.81, 0.72, 0.89, 1.00, 1.00, 0.91, 0.65, 0.48, 0.37)
_AZURE_CONV = (0.65, 0.68, 0.70, 0.57, 0.57, 0.61, 0.71, 0.79, 0.77, 0.76, 0.71, 0.78,
               0.88, 0.94, 1.00, 0.94, 0.87, 0.81, 0.86, 0.79, 0.71, 0.63, 0.54, 0.52)
# fmt: on

SHAPES: dict[str, DayShape] = {
    s.name: s
    for s in (
        DayShape("azure-code", _AZURE_CODE, AZURE_LLM_2024 + ", coding"),
        DayShape("azure-conv", _AZURE_CONV, AZURE_LLM_2024 + ", conversation"),
    )
}


def read_numbers(path: Path, one: str, many: str) -> list[float]:
    """The numbers of a text file, one per line (``#`` comments and blank lines allowed); each
    must be finite and >= 0 (``one`` and ``many`` name them in the errors)."""
    values: list[float] = []
    for line_no, line in enumerate(Path(path).read_text().splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{path}:{line_no}: not {one}: {text!r}") from None
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"{path}:{line_no}: {many} must be finite and >= 0")
        values.append(value)
    return values
