"""Tables that learn from live traffic: the online refit of each model's time2clock table.

Every isolated execution the scheduler sees (:mod:`scheduler.observe`) is a measurement of one
cell (model, batch, clock). Cells are windowed (``window_s``, at most ``cell_cap`` samples each,
newest kept) and summarised as the offline fit does (:mod:`time2clock.fit`: a trimmed mean,
trim 0.2). Each refit starts from a **prior**: the model's *reference* table (the profiled one,
``base``) where there is one, else the table in force:

* a cell with at least ``min_cell_samples`` live samples is a point of its curve at its
  trimmed mean, weighted by its number of samples, so live cells dominate;
* every other (clock, batch) of the prior moves with the observed ones (weight
  ``prior_weight``) in one of the two ways a prior is usually off: by a factor (the median over
  the live cells of live / prior: a slower or faster GPU) or by a constant (the median of
  live − prior: host time, which a busy CPU adds to every execution whatever the clock). With
  live cells at one clock only, which way is right cannot be told, so the one that predicts
  the slower time at the lowest clock is taken: there a guess too fast costs deadlines, one too
  slow only energy, and the clocks the policy then picks measure the rest. Within
  ``factor_band`` (5%) of the prior, always the factor: the choice of the slower guess would
  otherwise ratchet the unmeasured clocks up a little at every refit with the noise of the
  measured ones (seen live: +15% at the lowest clock in 60 s). The moves are made from the
  reference, not from the table in force: with the table in force as the prior, a busy spell
  moved the points nobody measured up by the factor, and the quiet after it moved them back
  only by the constant (the slower guess each time), so every busy spell left the large
  batches slower for good (five busy minutes, then ten quiet ones: batch 32 at 2.2× its time).
  From the reference, a point nobody measures is where the evidence of the window puts it,
  whatever came before;
* the law ``1/(m·x + b)`` is fitted by weighted least squares of ``1/y`` on ``x``, where ``y``
  is each point's time less the **host's part** of it: the time of each execution spent at the
  host with the GPU idle (the hop, Triton's queue, the hand-off to the model's process), which
  the clock does not change. The energy fit measures it from the GPU's busy time
  (:mod:`time2clock.online_energy`, ``host_s``; nil without that time, as in the simulator),
  and the law ``host + 1/(m·x + b)`` then bends as such times do. A law without it cannot:
  fitted through the clocks measured most, it errs between them and more so away from them,
  and the energy written (the power times the time) and the energy-optimal clocks move with
  those errors. Its tail fits are the same law with the margin added to the host part;
* the tail margins (pooled residual quantiles) come from the live residuals once there are
  ``min_residual_samples`` of them, else stay the prior's.

A model with no table gets the prior "time ∝ 1/clock through its measured top-clock trimmed
mean": the compute-bound worst case, since a GPU kernel slows at most in proportion to the
clock (memory and host time do not slow at all). So a model without a table runs at the top
clock (nothing is known of it) until its own traffic gives it a table that errs on the slow
side, and the clocks the policy then picks measure the rest.

A refit never produces a broken curve: a curve whose fit has ``m <= 0`` (e.g. from two close
clocks) or whose prediction is not positive and finite over the whole clock ladder keeps the
prior's curve (or, for a batch the prior has no curve for, is left out).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from dvfs.energy import EnergyReading
from time2clock.fit import trimmed_mean
from time2clock.online_energy import Composition, EnergyParams, EnergyRefit, OnlineEnergy
from time2clock.profile import select_clocks
from time2clock.table import (
    TAIL_QUANTILES,
    ClockPoint,
    InverseLinearFit,
    ModelTable,
    TableSet,
    Time2ClockTable,
)

MAX_RATIOS = 1000  # measured / predicted times kept per model between refits, for its error
# The host part a law takes, at most, as a share of the shortest time it is fitted to (the
# energy fit bounds it so already, against the times of the tables it fitted with).
HOST_SHARE_CAP = 0.9


class ExecutionSample(NamedTuple):
    """One isolated execution: ``batch`` requests of ``model`` took ``ms`` at ``clock_mhz``;
    ``at_s`` is when the last of them completed (see :mod:`scheduler.observe`). A named tuple:
    the request path makes one per isolated execution, and a tuple is the cheapest to make."""

    model: str
    clock_mhz: int
    batch: int
    ms: float
    at_s: float


@dataclass(frozen=True)
class OnlineParams:
    """How the online fit windows, trims and weighs what it measures."""

    window_s: float = 120.0
    cell_cap: int = 50
    min_cell_samples: int = 5
    trim: float = 0.2
    refit_every_s: float = 5.0
    min_residual_samples: int = 100
    residual_cap: int = 1000
    factor_band: float = 0.05
    prior_weight: float = 1.0
    new_model_clocks: int = 8

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and self.refit_every_s > 0 and self.prior_weight > 0):
            raise ValueError("window_s, refit_every_s and prior_weight must be > 0")
        if min(self.cell_cap, self.min_cell_samples, self.min_residual_samples) < 1:
            raise ValueError("cell_cap, min_cell_samples and min_residual_samples must be >= 1")
        if self.residual_cap < self.min_residual_samples:
            raise ValueError("residual_cap must be >= min_residual_samples")
        if not 0.0 <= self.trim < 0.5:
            raise ValueError(f"trim must be in [0, 0.5), got {self.trim}")


@dataclass
class _ModelState:
    cells: dict[tuple[int, int], deque[tuple[float, float]]] = field(default_factory=dict)
    # (at_s, batch, clock, ms), newest last: the tail margins' samples (a cell keeps fewer)
    recent: deque[tuple[float, int, int, float]] = field(default_factory=deque)
    samples_total: int = 0
    new_samples: int = 0
    refits: int = 0
    last_refit_s: float | None = None
    ratios: list[float] = field(default_factory=list)  # measured / predicted since last refit
    last_error: float | None = None


def curve_is_sound(fit: InverseLinearFit, clocks_mhz: Sequence[int]) -> bool:
    """Whether ``fit`` falls with the clock and predicts a positive, finite time at every clock
    of the ladder (its denominator is linear: checking both ends is enough)."""
    if not (math.isfinite(fit.m) and math.isfinite(fit.b)) or fit.m <= 0:
        return False
    ends = (min(clocks_mhz), max(clocks_mhz))
    return all(math.isfinite(fit.predict_ms(c)) and fit.predict_ms(c) > 0 for c in ends)


def weighted_fit(
    clocks_mhz: Sequence[float], latency_ms: Sequence[float], weights: Sequence[float]
) -> InverseLinearFit:
    """Weighted least squares of ``1/y`` on ``x`` (weights on squared residuals); R² weighted."""
    x = np.asarray(clocks_mhz, dtype=float)
    inv = 1.0 / np.asarray(latency_ms, dtype=float)
    w = np.asarray(weights, dtype=float)
    if len(np.unique(x)) < 2:
        return InverseLinearFit(m=math.nan, b=math.nan, r2=math.nan)
    m, b = np.polyfit(x, inv, 1, w=np.sqrt(w))
    mean = float(np.average(inv, weights=w))
    residual = float(np.sum(w * (inv - (m * x + b)) ** 2))
    total = float(np.sum(w * (inv - mean) ** 2))
    return InverseLinearFit(float(m), float(b), 1.0 - residual / total if total > 0 else 1.0)


def compute_bound_prior(
    gpu: str,
    model: str,
    top_ms: Mapping[int, tuple[int, float]],
    clocks_mhz: Sequence[int],
    n_clocks: int,
) -> ModelTable:
    """A table for a model that has none: per batch, ``t(f) = t_top · f_top / f`` through the
    measured ``top_ms[batch] = (f_top, t_top)``, the compute-bound worst case (no table
    promises it runs faster at a low clock than this)."""
    ladder = select_clocks(sorted(clocks_mhz), n_clocks)
    curves = {}
    for batch, (top_mhz, t_ms) in sorted(top_ms.items()):
        fit = InverseLinearFit(m=1.0 / (t_ms * top_mhz), b=0.0, r2=1.0)
        clocks = sorted({*ladder, top_mhz})
        points = tuple(_point(c, fit.predict_ms(c)) for c in clocks)
        curves[batch] = Time2ClockTable(
            gpu=gpu,
            model=model,
            trim=0.2,
            concurrency=1,
            mean_fit=fit,
            points=points,
            batch=batch,
        )
    return ModelTable(gpu=gpu, model=model, curves=curves)


def _point(clock_mhz: int, ms: float, n: int = 0, energy_j: float | None = None) -> ClockPoint:
    return ClockPoint(clock_mhz, n, ms, ms, ms, ms, 0.0, ms, ms, energy_j)


@dataclass(frozen=True, slots=True)
class FitInput:
    """One model's part of a refit: its prior and copies of its live samples."""

    model: str
    prior: ModelTable | None
    cells: dict[tuple[int, int], list[tuple[float, float]]]
    recent: list[tuple[int, int, float]]
    base: ModelTable | None = None
    host_ms: float = 0.0


class TableRefit:
    """A refit prepared by :meth:`OnlineTables.prepare_refit`: :meth:`run` fits every model's
    times from copies of its samples and then the energy from copies of the energy windows
    (pure: it may run on another thread), and :meth:`OnlineTables.finish_refit` adopts what it
    fitted."""

    def __init__(
        self,
        online: OnlineTables,
        prior: TableSet,
        now_s: float,
        inputs: list[FitInput],
        energy: EnergyRefit | None,
    ) -> None:
        self.prior = prior  # the tables in force when it was prepared
        self.now_s = now_s
        self._online = online
        self.inputs = inputs
        self.energy = energy
        self.fitted: dict[str, ModelTable | None] = {}
        self.result: TableSet | None = None  # the prior with every fit over it, once run

    def run(self) -> None:
        """Fit every model's times, then the energy over them (what a fit raises is raised
        here, as before the split)."""
        fit = self._online.fit_model
        self.fitted = {
            i.model: fit(i.model, i.prior, i.cells, i.recent, i.base, i.host_ms)
            for i in self.inputs
        }
        result = TableSet(list(self.prior))
        for fitted in self.fitted.values():
            if fitted is not None:
                result.add(fitted)
        if self.energy is not None:
            self.energy.run(self.prior, result)
            for table in self.energy.tables.values():
                result.add(table)
        self.result = result


class OnlineTables:
    """The online fit of every model behind one GPU (no I/O, time injected).

    :meth:`observe` each sample, with the table it was planned with; when :meth:`due`,
    :meth:`refit` returns the new tables (the scheduler hands them to its policy).
    """

    def __init__(
        self,
        clocks_mhz: Sequence[int],
        *,
        gpu: str = "unknown",
        params: OnlineParams | None = None,
        learn_energy: bool = True,
        energy_params: EnergyParams | None = None,
        base: TableSet | None = None,
    ) -> None:
        """``learn_energy``: also refit the energy per inference from the GPU's energy counter
        (:mod:`time2clock.online_energy`), when its values are handed to :meth:`on_energy`.
        ``base``: the reference tables (profiled) the refits move from (see the module
        docstring); a model without one moves from its table in force."""
        if not clocks_mhz:
            raise ValueError("the online fit needs the GPU's clock ladder")
        self.clocks_mhz = sorted(clocks_mhz)
        self.gpu = gpu
        self.params = params or OnlineParams()
        self.energy: OnlineEnergy | None = (
            OnlineEnergy(self.clocks_mhz, energy_params) if learn_energy else None
        )
        self._models: dict[str, _ModelState] = {}
        self.base = base if base is not None else TableSet()
        self._last_refit_s: float | None = None
        self.version = 0  # bumped by every refit that changed a table
        self.latest: TableSet | None = None  # what the last such refit returned
        self.journal: list[ExecutionSample] | None = None  # a list: every sample is kept there

    # -- measurements ---------------------------------------------------------------------

    def observe(self, sample: ExecutionSample, table: ModelTable | None) -> None:
        """Record ``sample``; ``table`` is the model's table in force (for its error)."""
        if not (sample.ms > 0 and math.isfinite(sample.ms)) or sample.batch < 1:
            return
        if self.journal is not None:
            self.journal.append(sample)
        state = self._models.get(sample.model)
        if state is None:
            state = self._models[sample.model] = _ModelState()
        key = (sample.batch, sample.clock_mhz)
        cell = state.cells.get(key)
        if cell is None:
            cell = state.cells[key] = deque()
        cell.append((sample.at_s, sample.ms))
        while len(cell) > self.params.cell_cap:
            cell.popleft()
        recent = state.recent
        recent.append((sample.at_s, sample.batch, sample.clock_mhz, sample.ms))
        while len(recent) > self.params.residual_cap:
            recent.popleft()
        state.samples_total += 1
        state.new_samples += 1
        if table is not None:
            predicted = table.predict_ms(sample.clock_mhz, sample.batch)
            if predicted > 0 and math.isfinite(predicted):
                ratios = state.ratios
                ratios.append(sample.ms / predicted)
                if len(ratios) > MAX_RATIOS:
                    del ratios[:-MAX_RATIOS]

    def record_occupancy(
        self, now_s: float, clock_mhz: int | None, composition: Composition
    ) -> None:
        """What runs changed: from ``now_s`` the clock target is ``clock_mhz`` and what is at
        Triton is ``composition`` (see :meth:`time2clock.online_energy.ClockWindows.record`)."""
        if self.energy is not None:
            self.energy.attribution.record(now_s, clock_mhz, composition)

    def clock_unknown(self) -> None:
        """The clock target changed at a moment not known (e.g. a new policy)."""
        if self.energy is not None:
            self.energy.attribution.forget()

    def on_energy(self, reading: EnergyReading, update_interval_s: float | None) -> None:
        """A value of the GPU's energy counter, and its refresh interval as learned."""
        if self.energy is not None:
            self.energy.reading(reading, update_interval_s)

    def floor_mhz(self, floor_mhz: int, now_s: float) -> int:
        """The energy floor a policy should use now (lower while a clock under it is probed)."""
        return floor_mhz if self.energy is None else self.energy.probe_floor_mhz(floor_mhz, now_s)

    def due(self, now_s: float) -> bool:
        """Whether a refit is due: ``refit_every_s`` since the last, and something new."""
        if (
            self._last_refit_s is not None
            and now_s - self._last_refit_s < self.params.refit_every_s
        ):
            return False
        if self.energy is not None and self.energy.pending():
            return True
        return any(s.new_samples for s in self._models.values())

    # -- the fit --------------------------------------------------------------------------

    def refit(self, tables: TableSet, now_s: float) -> TableSet | None:
        """Refit every model with new samples from ``tables`` (the prior); None if no table
        changed."""
        job = self.prepare_refit(tables, now_s)
        job.run()
        return self.finish_refit(job, tables)

    def prepare_refit(self, tables: TableSet, now_s: float) -> TableRefit:
        """The first step of :meth:`refit`: what each model with new samples has, and the
        energy windows (copied), and the counters it resets. :meth:`TableRefit.run` then does
        the fits, which read nothing of this object's changing state, so the caller may run
        them on another thread while samples keep coming in; :meth:`finish_refit` adopts them
        back on the caller's thread."""
        self._last_refit_s = now_s
        inputs: list[FitInput] = []
        host_s = self.energy.host_s if self.energy is not None else {}
        for model, state in self._models.items():
            if not state.new_samples:
                continue
            state.new_samples = 0
            self._prune(state, now_s)
            state.last_error = self._median_error(state) if state.ratios else state.last_error
            state.ratios.clear()
            cells = {key: list(cell) for key, cell in state.cells.items()}
            recent = [r[1:] for r in state.recent]
            inputs.append(
                FitInput(
                    model,
                    tables.get(model),
                    cells,
                    recent,
                    self.base.get(model),
                    host_s.get(model, 0.0) * 1000.0,
                )
            )
        energy = self.energy.prepare(now_s) if self.energy is not None else None
        return TableRefit(self, tables, now_s, inputs, energy)

    def finish_refit(self, job: TableRefit, tables: TableSet) -> TableSet | None:
        """The last step of :meth:`refit`: the fits of ``job`` (run) adopted, where ``tables``,
        the tables in force now, are still those it was prepared from; None if no table
        changed. Fits made from tables no longer in force (replaced meanwhile), or not made
        (the fit failed), are dropped, and their models and energy windows refitted at the
        next refit."""
        if tables is not job.prior or job.result is None:
            for fit_input in job.inputs:
                state = self._models.get(fit_input.model)
                if state is not None:
                    state.new_samples += 1
            if self.energy is not None and job.energy is not None:
                self.energy.restore(job.energy)
            return None
        changed = False
        for model, fitted in job.fitted.items():
            state = self._models.get(model)
            if state is None or fitted is None:
                continue
            state.refits += 1
            state.last_refit_s = job.now_s
            changed = True
        if self.energy is not None and job.energy is not None:
            self.energy.adopt(job.energy)
            changed = changed or bool(job.energy.tables)
        if not changed:
            return None
        self.version += 1
        self.latest = job.result
        return job.result

    def fit_model(
        self,
        model: str,
        prior: ModelTable | None,
        cells: Mapping[tuple[int, int], Iterable[tuple[float, float]]],
        recent: Sequence[tuple[int, int, float]] | None = None,
        base: ModelTable | None = None,
        host_ms: float = 0.0,
    ) -> ModelTable | None:
        """``model``'s table from the live ``cells[(batch, clock)]`` (times as ``(at_s, ms)``),
        the points they do not measure moved from ``base`` (the reference) or, without one, from
        ``prior`` (the table in force); its tail margins from the ``recent`` samples ``(batch,
        clock, ms)`` (default: those of the cells). ``host_ms``: the host's part of each
        execution, measured (the law is fitted to the rest; see the module docstring). None when
        there is nothing to fit (no table and no live cell yet)."""
        p = self.params
        samples = {key: [ms for _, ms in cell] for key, cell in cells.items()}
        live = {
            key: (trimmed_mean(v, p.trim), len(v))
            for key, v in samples.items()
            if len(v) >= p.min_cell_samples
        }
        if not live:
            return None
        if prior is None:
            top = max(c for _, c in live)
            top_ms = {b: (c, ms) for (b, c), (ms, _) in live.items() if c == top}
            gpu = self.gpu
            prior = compute_bound_prior(gpu, model, top_ms, self.clocks_mhz, p.new_model_clocks)
        ref = base if base is not None else prior
        priors = {key: ref.predict_ms(key[1], key[0]) for key in live}
        usable = [k for k, v in priors.items() if v > 0 and math.isfinite(v)]
        batches = sorted({*prior.batches, *ref.batches, *(b for b, _ in live)})
        means: dict[int, InverseLinearFit] = {}
        for batch in batches:
            # a batch measured moves by its own cells (the curve then goes through them, and
            # the next refit moves it no further); the others by every measured cell
            own = [k for k in usable if k[0] == batch] or usable
            scale = float(np.median([live[k][0] / priors[k] for k in own])) if own else 1.0
            shift = float(np.median([live[k][0] - priors[k] for k in own])) if own else 0.0
            low = ref.predict_ms(self.clocks_mhz[0], batch)
            by_factor = abs(scale - 1.0) <= p.factor_band or low * scale >= low + shift
            clocks = sorted({*ref.curve(batch).clocks_mhz, *(c for b, c in live if b == batch)})
            guesses = [ref.predict_ms(c, batch) for c in clocks]
            moved = [g * scale if by_factor else g + shift for g in guesses]
            if not all(v > 0 for v in moved):  # a constant would take a time below zero
                moved = [g * scale for g in guesses]
            values, weights = [], []
            for c, guess in zip(clocks, moved, strict=True):
                ms, n = live.get((batch, c), (guess, 0))
                values.append(ms)
                weights.append(float(n) if n else p.prior_weight)
            if not all(v > 0 and math.isfinite(v) for v in values):
                continue
            host = min(host_ms, HOST_SHARE_CAP * min(values))
            fit = replace(weighted_fit(clocks, [v - host for v in values], weights), host_ms=host)
            if host > 0 and not curve_is_sound(fit, self.clocks_mhz):
                fit = weighted_fit(clocks, values, weights)  # the law alone, as without one
            if curve_is_sound(fit, self.clocks_mhz):
                means[batch] = fit
        if not means:
            return None
        fresh = {b: self._curve(prior, model, b, means[b], live) for b in means}
        for b, curve in prior.curves.items():  # a prior curve whose refit was unsound stays
            fresh.setdefault(b, curve)
        table = ModelTable(gpu=prior.gpu, model=model, curves=fresh)
        pool = (
            recent
            if recent is not None
            else [(b, c, ms) for (b, c), v in samples.items() for ms in v]
        )
        residuals = [ms - table.predict_ms(c, b) for b, c, ms in pool]
        if len(residuals) >= p.min_residual_samples or not any(
            c.residual_quantiles_ms for c in prior.curves.values()
        ):
            if not residuals:
                return table
            quantiles = {
                q: float(np.quantile(residuals, int(q[1:]) / 100.0)) for q in TAIL_QUANTILES
            }
            fresh = {b: _with_residuals(c, quantiles, self.clocks_mhz) for b, c in fresh.items()}
            table = ModelTable(gpu=prior.gpu, model=model, curves=fresh)
        return table

    def _curve(
        self,
        prior: ModelTable,
        model: str,
        batch: int,
        fit: InverseLinearFit,
        live: Mapping[tuple[int, int], tuple[float, int]],
    ) -> Time2ClockTable:
        """A curve of ``fit``, at the prior's clocks and the live ones; the prior's tail
        margins and measured energy kept."""
        base = prior.curve(batch)
        own = prior.curves.get(batch)
        energy = {pt.clock_mhz: pt.energy_per_inference_j for pt in own.points} if own else {}
        clocks = sorted({*base.clocks_mhz, *(c for b, c in live if b == batch)})
        points = tuple(
            _point(
                c,
                live[batch, c][0] if (batch, c) in live else fit.predict_ms(c),
                live[batch, c][1] if (batch, c) in live else 0,
                energy.get(c),
            )
            for c in clocks
        )
        curve = Time2ClockTable(
            gpu=prior.gpu,
            model=model,
            trim=self.params.trim,
            concurrency=base.concurrency,
            mean_fit=fit,
            points=points,
            batch=batch,
        )
        if base.residual_quantiles_ms:
            curve = _with_residuals(curve, base.residual_quantiles_ms, self.clocks_mhz)
        return curve

    # -- what the admin state and the metrics show -----------------------------------------

    def _prune(self, state: _ModelState, now_s: float) -> None:
        horizon = now_s - self.params.window_s
        while state.recent and state.recent[0][0] < horizon:
            state.recent.popleft()
        for key in list(state.cells):
            cell = state.cells[key]
            while cell and cell[0][0] < horizon:
                cell.popleft()
            if not cell:
                del state.cells[key]

    @staticmethod
    def _median_error(state: _ModelState) -> float:
        return float(np.median(np.abs(np.asarray(state.ratios) - 1.0)))

    @property
    def models(self) -> list[str]:
        return sorted({*self._models, *(self.energy.models if self.energy else ())})

    def samples_total(self, model: str) -> int:
        state = self._models.get(model)
        return 0 if state is None else state.samples_total

    def refits(self, model: str) -> int:
        state = self._models.get(model)
        return 0 if state is None else state.refits

    def error(self, model: str) -> float | None:
        """Median ``|measured / predicted − 1|`` of ``model``'s samples since the last refit,
        against the table in force when each was measured (before any: the last interval's)."""
        state = self._models.get(model)
        if state is None:
            return None
        return self._median_error(state) if state.ratios else state.last_error

    def state(self, model: str, now_s: float) -> dict[str, object] | None:
        """Per model: samples in the window, refits, age of the last refit, error; and under
        ``energy`` the same of the energy fit."""
        state = self._models.get(model)
        energy = (
            None
            if self.energy is None
            else self.energy.state(model, now_s, self.latest.get(model) if self.latest else None)
        )
        if state is None:
            return None if energy is None else {"energy": energy}
        horizon = now_s - self.params.window_s
        in_window = sum(1 for at, *_ in state.recent if at >= horizon)  # at most residual_cap
        error = self.error(model)
        return {
            "samples_in_window": in_window,
            "samples_total": state.samples_total,
            "refits": state.refits,
            "last_refit_age_s": (
                None if state.last_refit_s is None else round(now_s - state.last_refit_s, 3)
            ),
            "error": None if error is None else round(error, 4),
            **({} if energy is None else {"energy": energy}),
        }


def _with_residuals(
    curve: Time2ClockTable, quantiles: Mapping[str, float], clocks_mhz: Sequence[int]
) -> Time2ClockTable:
    """``curve`` with these pooled residual quantiles and the tail fits they give (with a host
    part, the mean's law with the margin added to that part: the same times, exactly)."""
    clocks = curve.clocks_mhz
    host = curve.mean_fit.host_ms
    tails = {}
    for q, shift in quantiles.items():
        if host > 0 and host + shift >= 0:
            tails[q] = replace(curve.mean_fit, host_ms=host + shift)
            continue
        values = [curve.mean_fit.predict_ms(c) + shift for c in clocks]
        if len(clocks) >= 2 and all(v > 0 and math.isfinite(v) for v in values):
            fit = weighted_fit(clocks, values, [1.0] * len(clocks))
            if curve_is_sound(fit, clocks_mhz):
                tails[q] = fit
    return replace(curve, residual_quantiles_ms=dict(quantiles), tail_fits=tails)
