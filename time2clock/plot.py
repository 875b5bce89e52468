"""Plot time2clock tables like seed 003's Figure 2: a line per batch size, points and fits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scheduler.tokens import EnginePrior
from time2clock.table import ModelTable, TableSet

BatchSamples = Mapping[int, Mapping[int, Sequence[float]]]  # batch -> clock_mhz -> ms


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


def plot_tables(
    tables: TableSet,
    out_path: Path,
    samples: Mapping[str, BatchSamples] | None = None,
) -> Path:
    """Write a PNG with one panel per model: per batch size the measured trimmed means (± std),
    the raw executions if ``samples`` (model -> batch -> clock -> ms) is given, the mean fit, and
    the p99 fit dashed. Log-scaled time, so that batch 1 and batch 64 both read."""
    plt = pyplot()

    models = list(tables)
    fig, axes = plt.subplots(1, len(models), figsize=(8 * len(models), 5.5), dpi=120, squeeze=False)
    for ax, table in zip(axes[0], models, strict=True):
        _draw_model(ax, table, None if samples is None else samples.get(table.model))
    fig.tight_layout()
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def _draw_model(ax: Any, table: ModelTable, samples: BatchSamples | None) -> None:
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.9, len(table.batches)))
    for color, (batch, curve) in zip(colors, table.curves.items(), strict=True):
        if samples and batch in samples:
            xs = [c for c, vals in samples[batch].items() for _ in vals]
            ys = [v for vals in samples[batch].values() for v in vals]
            ax.scatter(xs, ys, s=4, alpha=0.15, color=color)
        clocks = np.array(curve.clocks_mhz, dtype=float)
        ax.errorbar(
            clocks,
            [p.trimmed_mean_ms for p in curve.points],
            yerr=[p.std_ms for p in curve.points],
            fmt="o",
            ms=3,
            capsize=2,
            color=color,
        )
        grid = np.linspace(clocks.min(), clocks.max(), 200)
        ax.plot(
            grid,
            [curve.predict_ms(f) for f in grid],
            color=color,
            label=(
                f"batch {batch}: "
                + (f"{curve.mean_fit.host_ms:.2f}+" if curve.mean_fit.host_ms else "")
                + f"1/({curve.m:.3g}·x+{curve.b:.3g}), R²={curve.r2:.4f}"
            ),
        )
        if "p99" in curve.tail_fits:
            ax.plot(grid, [curve.predict_ms(f, "p99") for f in grid], "--", lw=0.8, color=color)
    ax.set_yscale("log")
    ax.set_xlabel("graphics clock (MHz)")
    ax.set_ylabel("time of one execution (ms); dashed: p99 fit")
    first = table.curve(table.batches[0])
    ax.set_title(
        f"time2clock: {table.model} on {table.gpu} "
        f"(trim {first.trim:g}, concurrency {first.concurrency})"
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)


def plot_engine(prior: EnginePrior, out_path: Path, title: str) -> Path:
    """Write a PNG of an engine profile: per bucket of sequences, a decode step's time and its
    joules per sequence (one output token each) against the clock; and a prompt's time and
    joules."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    clocks = sorted(prior.prefill_ms)
    for i, bucket in enumerate(sorted(prior.step_ms)):
        color = f"C{i % 10}"
        ms = [prior.step_ms[bucket][f] for f in clocks]
        joules = [prior.step_j[bucket][f] / bucket for f in clocks]
        axes[0].plot(clocks, ms, "o-", color=color, label=f"{bucket} seq")
        axes[1].plot(clocks, joules, "o-", color=color, label=f"{bucket} seq")
    axes[0].set_ylabel("decode step (ms)")
    axes[1].set_ylabel("decode energy per output token (J)")
    axes[1].set_yscale("log")
    prompt = axes[2]
    prompt.plot(clocks, [prior.prefill_ms[f] for f in clocks], "o-", color="C0")
    prompt.set_ylabel(f"prompt of {prior.prefill_tokens} tokens (ms)", color="C0")
    twin = prompt.twinx()
    twin.plot(clocks, [prior.prefill_j[f] for f in clocks], "s--", color="C3")
    twin.set_ylabel("its energy (J)", color="C3")
    for ax in axes:
        ax.set_xlabel("SM clock (MHz)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path
