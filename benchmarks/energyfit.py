"""What the live energy fit saw and found, recorded, and read against the simulated GPU's laws.

``python -m benchmarks.recovery --record-fit DIR`` has the learning run write, to ``DIR``:

* ``windows.jsonl``: the energy windows kept at the end (one per line: start and end, s after
  the first; joules; the GPU's busy seconds where the device reports them; per clock, idle
  seconds and busy seconds per (model, requests at Triton));
* ``fits.jsonl``: every energy fit the sidecar adopted (its time, the idle power's law, each
  curve's law, busy seconds, the windows' noise and each model's host part per execution);
* ``tables.json``: the tables in force at the end;
* ``samples.csv``: the isolated executions the times learned from (``at_s`` from the first).

``python -m benchmarks.energyfit DIR`` reads them back. It prints each curve's law over the run
with the energy-optimal clocks of the last tables, and, per batch and band of clocks, the power
measured while that batch was at Triton (one free power per band, so no law's shape is assumed)
beside the simulated GPU's power running it. The measured power above idle over the simulated
one is the share of the time at Triton that the GPU ran: where it falls as the clock rises, time
at the host (a fixed part of each request's time at Triton, at idle power) is a larger share of a
shorter execution, and a law fitted at high clocks comes out flatter than the same law fitted at
low ones. The last column, the rest of that share times the table's time there, is the host's
part per execution: about the same at every clock when that is the cause. Last, per batch and
band, the isolated executions' median time beside the last table's and the simulated GPU's: the
energy written is the power times the table's time, so a table whose time falls with the clock
more slowly than the executions' puts the energy-optimal clocks low.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from api.embedded import EMULATED
from dvfs.profiles import get_profile
from time2clock.online import ExecutionSample
from time2clock.online_energy import (
    ClockSpan,
    EnergyFit,
    EnergyWindow,
    OnlineEnergy,
    PowerLaw,
    split_batch,
)
from time2clock.table import TableSet

WINDOWS = "windows.jsonl"
FITS = "fits.jsonl"
TABLES = "tables.json"
SAMPLES = "samples.csv"


def write_record(directory: Path, energy: OnlineEnergy, tables: TableSet | None) -> None:
    """``energy``'s windows and logged fits (see the module docstring), times from the first
    window's start, and ``tables``."""
    directory.mkdir(parents=True, exist_ok=True)
    windows = energy.windows
    fits = energy.fit_log or []
    t0 = min([w.start_s for w in windows[:1]] + [t for t, _ in fits[:1]], default=0.0)
    with (directory / WINDOWS).open("w") as out:
        for w in windows:
            out.write(json.dumps(window_row(w, t0)) + "\n")
    with (directory / FITS).open("w") as out:
        for at_s, fit in fits:
            out.write(json.dumps(fit_row(fit, at_s - t0)) + "\n")
    if tables is not None:
        tables.save(directory / TABLES)


def write_samples(samples: Sequence[ExecutionSample], path: Path) -> None:
    """Isolated executions as CSV (``at_s`` relative to the first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = samples[0].at_s
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("at_s", "model", "batch", "clock_mhz", "ms"))
        for s in samples:
            writer.writerow((f"{s.at_s - t0:.4f}", s.model, s.batch, s.clock_mhz, f"{s.ms:.4f}"))


def read_samples(path: Path) -> list[ExecutionSample]:
    with path.open(newline="") as handle:
        return [
            ExecutionSample(
                model=row["model"],
                clock_mhz=int(row["clock_mhz"]),
                batch=int(row["batch"]),
                ms=float(row["ms"]),
                at_s=float(row["at_s"]),
            )
            for row in csv.DictReader(handle)
        ]


def window_row(w: EnergyWindow, t0: float) -> dict[str, object]:
    return {
        "start_s": round(w.start_s - t0, 6),
        "end_s": round(w.end_s - t0, 6),
        "energy_j": w.energy_j,
        "gpu_busy_s": w.gpu_busy_s,
        "spans": [
            {
                "clock_mhz": s.clock_mhz,
                "idle_s": s.idle_s,
                "busy": [[m, n, sec] for (m, n), sec in s.busy],
            }
            for s in w.spans
        ],
    }


def read_windows(path: Path) -> list[EnergyWindow]:
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        spans = tuple(
            ClockSpan(
                int(s["clock_mhz"]),
                float(s["idle_s"]),
                tuple(((str(m), int(n)), float(sec)) for m, n, sec in s["busy"]),
            )
            for s in row["spans"]
        )
        gpu = row.get("gpu_busy_s")
        out.append(
            EnergyWindow(
                row["start_s"],
                row["end_s"],
                row["energy_j"],
                spans,
                None if gpu is None else float(gpu),
            )
        )
    return out


def _law(law: PowerLaw) -> list[float]:
    return [round(law.a_w, 3), round(law.c_w, 3)]


def fit_row(fit: EnergyFit, at_s: float) -> dict[str, object]:
    return {
        "at_s": round(at_s, 3),
        "idle_w": _law(fit.idle),
        "noise_w": fit.noise_w,
        "host_ms": {m: round(h * 1000.0, 3) for m, h in sorted(fit.host_s.items())},
        "curves": [
            {
                "model": m,
                "batch": b,
                "law_w": _law(law),
                "busy_s": round(fit.live_s.get((m, b), 0.0), 3),
            }
            for (m, b), law in sorted(fit.laws.items())
        ],
    }


@dataclass(frozen=True)
class BandPower:
    """The power measured while ``batch`` requests of ``model`` were at Triton in one band of
    clocks, over ``busy_s`` of such time; ``clock_mhz`` is the band's mean clock over it."""

    model: str
    batch: int
    clock_mhz: int
    busy_s: float
    power_w: float


def power_by_band(
    windows: Sequence[EnergyWindow],
    batches: Mapping[str, Sequence[int]],
    band_mhz: int,
    max_clock_mhz: float,
    exponent: float = 3.0,
) -> tuple[PowerLaw, list[BandPower]]:
    """Least squares over ``windows`` of the idle power's law and one free power per (model,
    curve of ``batches``, band of clocks): what each batch drew at each clock, with no law's
    shape assumed for it. Requests at Triton are shared between curves as the fit shares them
    (:func:`time2clock.online_energy.split_batch`)."""
    columns: dict[tuple[str, int, int], int] = {}
    clock_s: dict[int, float] = {}  # per column, busy seconds times the clock
    rows: list[dict[int, float]] = []
    for w in windows:
        row: dict[int, float] = {0: 0.0, 1: 0.0}
        for span in w.spans:
            row[0] += span.idle_s
            row[1] += span.idle_s * (span.clock_mhz / max_clock_mhz) ** exponent
            band = round(span.clock_mhz / band_mhz) * band_mhz
            for (m, n), sec in span.busy:
                for b, share in split_batch(n, batches.get(m, [1])):
                    j = columns.setdefault((m, b, band), 2 + len(columns))
                    row[j] = row.get(j, 0.0) + share * sec
                    clock_s[j] = clock_s.get(j, 0.0) + share * sec * span.clock_mhz
        rows.append(row)
    a = np.zeros((len(rows), 2 + len(columns)))
    for i, row in enumerate(rows):
        for j, v in row.items():
            a[i, j] = v
    y = np.array([w.energy_j for w in windows])
    theta, *_ = np.linalg.lstsq(a, y, rcond=None)
    busy = a.sum(axis=0)
    idle = PowerLaw(float(theta[0]), float(theta[1]), max_clock_mhz, exponent)
    bands = [
        BandPower(m, b, round(clock_s[j] / busy[j]), float(busy[j]), float(theta[j]))
        for (m, b, _), j in sorted(columns.items())
        if busy[j] > 0
    ]
    return idle, bands


def explain(directory: Path, gpu: str, band_mhz: int = 100, min_busy_s: float = 0.5) -> str:
    """The fits over the run and the power per band of clocks against ``gpu``'s laws."""
    profile = get_profile(gpu)
    tables = TableSet.load(directory / TABLES) if (directory / TABLES).is_file() else TableSet()
    batches = {t.model: t.batches for t in tables}
    lines = ["fits (s: idle a + c·x³ W; per curve a + c·x³ W, busy s):"]
    for row in _rows(directory / FITS):
        curves = ", ".join(
            f"b{c['batch']} {c['law_w'][0]:.0f}+{c['law_w'][1]:.0f} ({c['busy_s']:.1f} s)"
            for c in row["curves"]
            if c["busy_s"] > 0
        )
        idle = row["idle_w"]
        host = "".join(f"; host {h:.1f} ms ({m})" for m, h in row.get("host_ms", {}).items())
        lines.append(f"  {row['at_s']:6.1f}: idle {idle[0]:.1f}+{idle[1]:.1f}; {curves}{host}")
    for t in tables:
        optimal = {b: t.energy_optimal_clock_mhz(b) for b in t.batches}
        lines.append(f"energy-optimal clocks of {t.model}'s last table, per batch: {optimal}")
    windows = read_windows(directory / WINDOWS)
    measured = [w for w in windows if w.gpu_busy_s is not None]
    if measured:
        at_triton = sum(w.busy_s() for w in measured)
        gpu_s = sum(w.gpu_busy_s or 0.0 for w in measured)
        lines.append(
            f"GPU busy {gpu_s:.2f} s of {at_triton:.2f} s at Triton in {len(measured)} windows "
            f"that have it (the device's own count: {gpu_s / at_triton:.2f} of it)"
            if at_triton > 0
            else f"GPU busy {gpu_s:.2f} s, nothing at Triton"
        )
    idle, bands = power_by_band(windows, batches, band_mhz, float(profile.max_clock_mhz))
    lines += [
        "",
        f"power while at Triton, per band of {band_mhz} MHz (simulated {gpu}: the GPU running it):",
        "model | batch | clock MHz | busy s | measured W | simulated W | above idle, measured "
        "/ simulated | host ms per execution",
        "--- | --- | --- | --- | --- | --- | --- | ---",
    ]
    for band in bands:
        if band.busy_s < min_busy_s:
            continue
        law = profile.model(EMULATED.get(band.model, band.model))
        truth = law.busy_power_w(band.clock_mhz, band.batch)
        rest = profile.idle_power_w(band.clock_mhz)
        share = (band.power_w - rest) / (truth - rest) if truth > rest else float("nan")
        table = tables.get(band.model)
        curve = None if table is None else table.curves.get(band.batch)
        host_ms = float("nan") if curve is None else (1 - share) * curve.predict_ms(band.clock_mhz)
        lines.append(
            f"{band.model} | {band.batch} | {band.clock_mhz} | {band.busy_s:.1f} | "
            f"{band.power_w:.1f} | {truth:.1f} | {share:.2f} | {host_ms:.1f}"
        )
    lines.append(
        f"idle power fitted: {idle.power_w(profile.min_clock_mhz):.1f} W at the lowest clock, "
        f"{idle.power_w(profile.max_clock_mhz):.1f} W at the top (simulated "
        f"{profile.idle_power_w(profile.min_clock_mhz):.1f}, "
        f"{profile.idle_power_w(profile.max_clock_mhz):.1f})"
    )
    if (directory / SAMPLES).is_file():
        lines += ["", *sample_lines(read_samples(directory / SAMPLES), tables, gpu, band_mhz)]
    return "\n".join(lines)


def sample_lines(
    samples: Sequence[ExecutionSample], tables: TableSet, gpu: str, band_mhz: int
) -> list[str]:
    """Per model, batch and band of clocks, the isolated executions' median time beside the
    last table's and the simulated GPU's at the band's median clock."""
    profile = get_profile(gpu)
    groups: dict[tuple[str, int, int], list[ExecutionSample]] = {}
    for s in samples:
        band = round(s.clock_mhz / band_mhz) * band_mhz
        groups.setdefault((s.model, s.batch, band), []).append(s)
    lines = [
        f"isolated executions (the times learned from), per band of {band_mhz} MHz:",
        "model | batch | clock MHz | executions | median ms | table ms | simulated GPU ms",
        "--- | --- | --- | --- | --- | --- | ---",
    ]
    for (model, batch, _), group in sorted(groups.items()):
        clock = int(np.median([s.clock_mhz for s in group]))
        table = tables.get(model)
        table_ms = table.predict_ms(clock, batch) if table is not None else float("nan")
        law = profile.model(EMULATED.get(model, model))
        lines.append(
            f"{model} | {batch} | {clock} | {len(group)} | "
            f"{float(np.median([s.ms for s in group])):.2f} | {table_ms:.2f} | "
            f"{law.mean_latency_ms(clock, batch):.2f}"
        )
    return lines


def _rows(path: Path) -> Iterable[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.energyfit", description=__doc__)
    parser.add_argument("directory", type=Path, help="what --record-fit wrote")
    parser.add_argument("--gpu", default="v100", help="the simulated GPU the run was on")
    parser.add_argument("--band-mhz", type=int, default=100)
    args = parser.parse_args(argv)
    if not (args.directory / WINDOWS).is_file():
        parser.error(f"no {WINDOWS} in {args.directory} (write one with --record-fit)")
    if args.band_mhz <= 0:
        parser.error("--band-mhz must be > 0")
    print(explain(args.directory, args.gpu, args.band_mhz))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
