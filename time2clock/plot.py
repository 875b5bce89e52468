"""Plot a time2clock table like seed 003's Figure 2: points, spread, fitted curves, R²."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from time2clock.table import Time2ClockTable


class PlotUnavailableError(ImportError):
    """A plot was asked for, but the 'plot' extra (matplotlib) is not installed."""


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend; a clear error without the 'plot' extra."""
    try:
        import matplotlib
    except ImportError as err:
        raise PlotUnavailableError(
            "plots need matplotlib: pip install '.[plot]' (make setup installs it)"
        ) from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_table(
    table: Time2ClockTable,
    out_path: Path,
    samples: Mapping[int, Sequence[float]] | None = None,
) -> Path:
    """Write a PNG of the measured points (and raw samples if given) with the fitted curves."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    if samples:
        xs = [c for c, vals in samples.items() for _ in vals]
        ys = [v for vals in samples.values() for v in vals]
        ax.scatter(xs, ys, s=6, alpha=0.25, color="grey", label="requests")
    clocks = np.array(table.clocks_mhz, dtype=float)
    means = np.array([p.trimmed_mean_ms for p in table.points])
    stds = np.array([p.std_ms for p in table.points])
    ax.errorbar(
        clocks,
        means,
        yerr=stds,
        fmt="o",
        ms=3,
        capsize=2,
        color="tab:blue",
        label=f"trimmed mean (trim {table.trim:g}) ± std",
    )
    ax.plot(clocks, [p.p99_ms for p in table.points], "v", ms=3, color="tab:red", label="p99")
    grid = np.linspace(clocks.min(), clocks.max(), 200)
    ax.plot(
        grid,
        [table.predict_ms(f) for f in grid],
        color="tab:blue",
        label=f"mean fit 1/(m·x+b), R²={table.r2:.4f}",
    )
    if "p99" in table.tail_fits:
        fit = table.tail_fits["p99"]
        ax.plot(
            grid,
            [fit.predict_ms(f) for f in grid],
            "--",
            color="tab:red",
            label=f"p99 fit, R²={fit.r2:.4f}",
        )
    ax.set_xlabel("graphics clock (MHz)")
    ax.set_ylabel("inference time (ms)")
    ax.set_title(
        f"time2clock: {table.model} on {table.gpu} (concurrency {table.concurrency})\n"
        f"m={table.m:.4g}, b={table.b:.4g}"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
