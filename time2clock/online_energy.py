"""Energy that learns: the GPU's energy counter attributed to clock windows, and each model's
energy per inference per clock refitted from them (no I/O, time injected).

**Attribution.** The scheduler reports every change of what runs (:meth:`ClockWindows.occupancy`:
the clock target and how many requests of each model are at Triton) and every new value of the
GPU's cumulative energy counter (:meth:`ClockWindows.reading`, a
:class:`dvfs.energy.EnergyReading`: the value and the time it became current). The time between
two counter values is a **window** when it spans at least ``min_window_s`` and ``MIN_INTERVALS``
of the counter's refresh interval (a shorter one is not trusted; see :mod:`dvfs.energy`);
otherwise it is merged with the next one. A window may span clock changes: it holds its energy
and, per clock (a :class:`ClockSpan`), its idle seconds (nothing at Triton) and, per (model,
requests of it at Triton), its busy seconds; time with several models at Triton is shared
among them equally (they time-share the GPU). A change takes ``settle_s`` to land (the clock
controller's own delay): until then the time counts at the clock before. So a GPU that drops
to an idle clock between requests and rises at the next still measures both clocks, idle and
busy, in every window. A window with time under a clock the sidecar did not set (the GPU's
own) is dropped.

**The power model.** Over a window, summed over its clocks ``f`` (``x = f / f_max``)::

    E = Σ_f [ P_idle(x)·t_idle(f) + Σ_(model, batch) P_(model, batch)(x)·t_(model, batch)(f) ]

with every power on the law ``P(x) = a + c·x^k`` (``a, c >= 0``; ``k`` = ``power_exponent``, 3:
dynamic power goes as ``C·V²·f`` and voltage rises about linearly with the clock over the DVFS
range, the law the simulated GPUs follow, see :mod:`dvfs.profiles`). A model's batch sizes are
its table's curves; ``n`` of its requests at Triton count as a batch of ``n``, shared linearly
between the two curves around it. The law is linear in ``(a, c)``, so one bounded least squares
over every window of the last ``window_s`` fits every model and the idle power at once. A first
fit of the windows alone measures their noise (``min_noise_w`` at least); windows more than
``outlier_sigmas`` of it off (a counter value late, a burst of host work) are left out of the
second, which weighs the windows by that noise against the prior.

**The host's part.** A request is at Triton from when the scheduler sends it until its answer
is back, and part of that time the GPU idles (the hop, Triton's queue, the backend's hand-off):
about as long at every clock, so a larger share of a shorter execution, and a law fitted to the
power over the whole time at Triton bends with the clocks it was measured at. Where the device
reports the GPU's busy time (:meth:`dvfs.device.Device.gpu_busy_s`, carried by each window),
each model's host part per execution is measured: over the windows, the time at Triton with the
GPU idle against the executions there (each busy second over its curve's time), by bounded
least squares. That part of each execution is then at the idle power, in the windows and in the
prior alike, and each curve's law is the GPU's own. Without the busy time the host part is 0:
the windows alone do not tell it (their error barely moves with it while the laws swing).

**The prior.** Each curve's power at its clocks, from the table in force: its energy per
inference times its batch over its predicted time (the power the profile saw while that batch
ran, host time included, as the time it measured includes it), put on the law and trusted to
``prior_uncertainty``. Where the traffic measures a curve the measurement wins; elsewhere the
law and the prior hold the shape. The idle power has no prior.

**The refit.** A model whose curves saw at least ``min_live_s`` of busy time in the window
gets, for every curve, energy per inference ``P(f)·t(f)/batch`` at each of its clocks, with
``t`` the (refitted) mean time of its table and ``P`` the power over it (the curve's law over
the GPU's part of ``t``, the idle power over the host's): a curve busy for ``min_curve_s`` by
its own law; a batch the traffic never forms by a measured curve times the two curves' power
ratio in the prior, smoothed over the clock (a bias the profile had at a clock for every batch
alike cancels in it). Every other model's energy moves only with its times (its table's power
at each clock, times its new time). A law that is not positive and finite over the whole ladder
is not used; a curve with no energy in its prior and busy time at one clock only is not written
(the law's shape is unknown), and neither is a curve whose power above idle at the top clock is
under ``min_busy_share`` of its prior's (requests waiting at the host with the GPU idle: see
:meth:`OnlineEnergy._diluted`).

**Probes.** A floor set too high by a wrong table is never measured below: the policy never runs
there. So while there is traffic, every ``probe_every_s`` the floor may be lowered for
``probe_s`` to the next clock down (of ``probe_clocks`` spread over the ladder) that has less
than ``probe_min_s`` of busy time in the window (:meth:`OnlineEnergy.probe_floor_mhz`). The
policy's deadlines still hold: a probe lowers only the energy floor, never the clock the queue
needs.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from scipy.optimize import lsq_linear

from dvfs.energy import MIN_INTERVALS, EnergyReading, gpu_busy_between_s
from time2clock.profile import select_clocks
from time2clock.table import ModelTable, TableSet, Time2ClockTable

_T = TypeVar("_T")
UNKNOWN_BATCH = 0  # the one component of a model with no table yet (its energy goes somewhere)
MAX_CHANGES = 4096  # occupancy changes kept while no counter value closes a window


@dataclass(frozen=True)
class EnergyParams:
    """How energy windows are cut, weighed and fitted, and how the floor is probed."""

    window_s: float = 120.0
    max_windows: int = 3000
    min_window_s: float = 0.05
    settle_s: float = 0.005  # a clock target lands this long after it is set (NVML: a few ms)
    min_live_s: float = 2.0
    min_curve_s: float = 0.5
    min_busy_share: float = 0.25
    prior_uncertainty: float = 0.1
    min_noise_w: float = 0.5
    outlier_sigmas: float = 4.0
    power_exponent: float = 3.0
    # The host's part of each execution's time at Triton (the GPU idle), measured from the
    # GPU's busy time where the device reports it: at most max_host_share of a model's
    # shortest execution, and only from min_live_s of busy time in windows that have it.
    max_host_share: float = 0.9
    probe: bool = True
    probe_every_s: float = 10.0
    probe_s: float = 2.0
    probe_min_s: float = 1.0
    probe_clocks: int = 8
    poll_s: float = 0.02  # how often a reader reads the counter (it is refreshed on its own)
    # The live reader, once nothing has been at Triton or queued for idle_after_s, reads every
    # idle_poll_s instead (api.learning.EnergyReader says why it loses nothing).
    idle_poll_s: float = 0.25
    idle_after_s: float = 1.0

    def __post_init__(self) -> None:
        positive = (
            self.window_s,
            self.min_window_s,
            self.prior_uncertainty,
            self.min_noise_w,
            self.outlier_sigmas,
            self.poll_s,
            self.power_exponent,
        )
        if min(positive) <= 0:
            raise ValueError(
                "window_s, min_window_s, prior_uncertainty, min_noise_w, outlier_sigmas, poll_s "
                "and power_exponent must be > 0"
            )
        if self.idle_poll_s < self.poll_s or self.idle_after_s < 0:
            raise ValueError("idle_poll_s must be >= poll_s and idle_after_s >= 0")
        if self.max_windows < 1 or self.probe_clocks < 2:
            raise ValueError("max_windows must be >= 1 and probe_clocks >= 2")
        if not 0 <= self.max_host_share < 1:
            raise ValueError("max_host_share must be in [0, 1)")


Busy = tuple[tuple[tuple[str, int], float], ...]  # ((model, requests at Triton), seconds)


@dataclass(frozen=True, slots=True)
class ClockSpan:
    """The seconds of a window at ``clock_mhz``: ``idle_s`` with nothing at Triton, and
    ``busy[(model, n)]`` with ``n`` requests of ``model`` there."""

    clock_mhz: int
    idle_s: float
    busy: Busy

    @property
    def busy_s(self) -> float:
        """Busy seconds at this clock, every model's."""
        return sum(sec for _, sec in self.busy)


@dataclass(frozen=True, slots=True)
class EnergyWindow:
    """``energy_j`` used from ``start_s`` to ``end_s``, its time split by clock (``spans``,
    one per clock in force; time with several models at Triton shared among them), and the
    GPU's busy seconds in it where the device reports them (``gpu_busy_s``)."""

    start_s: float
    end_s: float
    energy_j: float
    spans: tuple[ClockSpan, ...]
    gpu_busy_s: float | None = None

    @classmethod
    def at_clock(
        cls,
        start_s: float,
        end_s: float,
        clock_mhz: int,
        energy_j: float,
        idle_s: float,
        busy: Busy,
    ) -> EnergyWindow:
        """A window at one clock throughout."""
        return cls(start_s, end_s, energy_j, (ClockSpan(clock_mhz, idle_s, busy),))

    @property
    def span_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def idle_s(self) -> float:
        return sum(c.idle_s for c in self.spans)

    @property
    def clocks_mhz(self) -> list[int]:
        return [c.clock_mhz for c in self.spans]

    def busy_s(self, model: str | None = None) -> float:
        """Busy seconds of ``model`` (all models: None)."""
        return sum(s for c in self.spans for (m, _), s in c.busy if model is None or m == model)

    @property
    def busy(self) -> Busy:
        """Busy seconds per (model, requests at Triton), over every clock."""
        total: dict[tuple[str, int], float] = {}
        for c in self.spans:
            for key, sec in c.busy:
                total[key] = total.get(key, 0.0) + sec
        return tuple(sorted(total.items()))


Composition = tuple[tuple[str, int], ...]  # (model, requests of it at Triton), by model


def composition(inflight: Mapping[str, Sized]) -> Composition:
    """What is at Triton, as :class:`ClockWindows` logs it: each model with requests there and
    how many, in the models' order."""
    return tuple(sorted((m, len(v)) for m, v in inflight.items() if len(v)))


class ClockWindows:
    """Cuts the counter's values into :class:`EnergyWindow` s from the occupancy the scheduler
    reports (see the module docstring)."""

    def __init__(self, params: EnergyParams | None = None) -> None:
        self.params = params or EnergyParams()
        self._clocks: deque[tuple[float, int | None]] = deque()  # (since_s, clock target)
        self._busy: deque[tuple[float, Composition]] = deque()  # (since_s, what is at Triton)
        self._start: EnergyReading | None = None
        self.kept_s = 0.0  # counter time attributed to windows
        self.dropped_s = 0.0  # and lost: time under a clock not known

    def occupancy(self, now_s: float, clock_mhz: int | None, inflight: Mapping[str, Sized]) -> None:
        """From ``now_s`` the clock target is ``clock_mhz`` (None: the GPU's own) and
        ``len(inflight[model])`` requests of each model are at Triton."""
        self.record(now_s, clock_mhz, composition(inflight))

    def record(self, now_s: float, clock_mhz: int | None, busy: Composition) -> None:
        """:meth:`occupancy` with what is at Triton given as its :func:`composition` (the
        scheduler's request path makes it in compiled code)."""
        clocks, log = self._clocks, self._busy
        if not clocks or clocks[-1][1] != clock_mhz:
            self._append(clocks, now_s, clock_mhz)
        if not log or log[-1][1] != busy:
            self._append(log, now_s, busy)
        if len(log) > MAX_CHANGES:  # no counter value for a long while: start over
            log.popleft()
            self._start = None
        if len(clocks) > MAX_CHANGES:
            clocks.popleft()
            self._start = None

    def forget(self) -> None:
        """The clock changed at a moment not known: no window spans it."""
        self._clocks.clear()
        self._busy.clear()
        self._start = None

    @staticmethod
    def _append(log: deque[tuple[float, _T]], now_s: float, value: _T) -> None:
        if log and log[-1][0] >= now_s:
            log.pop()  # the same instant: the later state wins
            if log and log[-1][1] == value:
                return
        log.append((now_s, value))

    def reading(
        self, reading: EnergyReading, update_interval_s: float | None
    ) -> EnergyWindow | None:
        """A value of the counter (deliver them in order); the window it closes, if one."""
        start = self._start
        if start is None or reading.energy_j < start.energy_j:
            self._restart(reading)
            return None
        end_s = reading.as_of_s
        if end_s <= start.as_of_s:
            return None
        clocks = self._clocks_between(start.as_of_s, end_s)
        if clocks is None:
            self.dropped_s += end_s - start.as_of_s
            self._restart(reading)
            return None
        shortest = self.params.min_window_s
        if update_interval_s is None:
            return None  # the refresh interval is not known yet: keep accumulating
        shortest = max(shortest, MIN_INTERVALS * update_interval_s)
        if end_s - start.as_of_s < shortest:
            return None
        window = self._window(start, reading, clocks)
        self.kept_s += window.span_s
        self._restart(reading)
        return window

    def _restart(self, reading: EnergyReading) -> None:
        self._start = reading
        horizon = reading.as_of_s - self.params.settle_s
        for log in (self._clocks, self._busy):
            while len(log) > 1 and log[1][0] <= horizon:
                log.popleft()

    def _clocks_between(self, from_s: float, to_s: float) -> list[tuple[float, float, int]] | None:
        """The clocks in force over ``[from_s, to_s]``, as ``(from_s, to_s, clock)``, each
        target counted from ``settle_s`` after it was set; None when one is not known (the
        GPU's own, or none reported yet)."""
        settle = self.params.settle_s
        if not self._clocks or self._clocks[0][0] + settle > from_s:
            return None
        out = []
        for lo, hi, clock in _pieces(self._clocks, from_s, to_s, settle):
            if clock is None:
                return None
            out.append((lo, hi, clock))
        return out

    def _occupancy_between(
        self, from_s: float, to_s: float, idle_s: float, busy: dict[tuple[str, int], float]
    ) -> float:
        """Adds to ``busy`` the busy seconds in ``[from_s, to_s]``; returns ``idle_s`` plus
        the idle ones."""
        changes = self._busy
        if not changes or changes[0][0] > from_s:  # before the first change nothing was there
            idle_s += min(changes[0][0], to_s) - from_s if changes else to_s - from_s
        for lo, hi, composition in _pieces(changes, from_s, to_s):
            dt = hi - lo
            if not composition:
                idle_s += dt
            for m, n in composition:
                busy[m, n] = busy.get((m, n), 0.0) + dt / len(composition)
        return idle_s

    def _window(
        self, start: EnergyReading, end: EnergyReading, clocks: Sequence[tuple[float, float, int]]
    ) -> EnergyWindow:
        idle: dict[int, float] = {}
        busy: dict[int, dict[tuple[str, int], float]] = {}
        for lo, hi, clock in clocks:
            idle[clock] = self._occupancy_between(
                lo, hi, idle.get(clock, 0.0), busy.setdefault(clock, {})
            )
        spans = tuple(ClockSpan(c, idle[c], tuple(sorted(busy[c].items()))) for c in sorted(idle))
        return EnergyWindow(
            start.as_of_s,
            end.as_of_s,
            end.energy_j - start.energy_j,
            spans,
            gpu_busy_between_s(start, end),
        )


def _pieces(
    log: Iterable[tuple[float, _T]], from_s: float, to_s: float, shift_s: float = 0.0
) -> Iterator[tuple[float, float, _T]]:
    """The stretches of a change log (``(since_s, value)`` in order, each change counted from
    ``shift_s`` after it) that overlap ``[from_s, to_s]``, cut to it: ``(lo, hi, value)``."""
    changes = [(since_s + shift_s, value) for since_s, value in log]
    for i, (since_s, value) in enumerate(changes):
        until_s = changes[i + 1][0] if i + 1 < len(changes) else to_s
        lo, hi = max(since_s, from_s), min(until_s, to_s)
        if hi > lo:
            yield lo, hi, value


# -- the power law ------------------------------------------------------------------------


@dataclass(frozen=True)
class PowerLaw:
    """``P(f) = a + c·(f / f_max)^k`` watts."""

    a_w: float
    c_w: float
    max_clock_mhz: float
    exponent: float = 3.0

    def power_w(self, clock_mhz: float) -> float:
        return float(self.a_w + self.c_w * (clock_mhz / self.max_clock_mhz) ** self.exponent)

    def power_array_w(self, clocks_mhz: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        watts: npt.NDArray[np.float64] = (
            self.a_w + self.c_w * (clocks_mhz / self.max_clock_mhz) ** self.exponent
        )
        return watts

    def is_sound(self, clocks_mhz: Sequence[int]) -> bool:
        """Positive and finite over the ladder, never falling with the clock."""
        ends = (min(clocks_mhz), max(clocks_mhz))
        values = [self.power_w(c) for c in ends]
        return (
            math.isfinite(self.a_w)
            and math.isfinite(self.c_w)
            and self.c_w >= 0
            and all(math.isfinite(v) and v > 0 for v in values)
        )


def split_batch(n: int, batches: Sequence[int]) -> list[tuple[int, float]]:
    """``n`` requests at Triton as shares of the table's batch sizes around it (linearly)."""
    if n <= batches[0]:
        return [(batches[0], 1.0)]
    if n >= batches[-1]:
        return [(batches[-1], 1.0)]
    hi = next(b for b in batches if b >= n)
    if hi == n:
        return [(n, 1.0)]
    lo = batches[batches.index(hi) - 1]
    share_hi = (n - lo) / (hi - lo)
    return [(lo, 1.0 - share_hi), (hi, share_hi)]


def curve_power_w(curve: Time2ClockTable) -> dict[int, float]:
    """The power a curve's measured energy implies at each of its clocks: energy per inference
    × batch over its predicted time."""
    out = {}
    for point in curve.points:
        t_ms = curve.predict_ms(point.clock_mhz)
        e_j = point.energy_per_inference_j
        if e_j is not None and e_j > 0 and math.isfinite(t_ms) and t_ms > 0:
            out[point.clock_mhz] = e_j * curve.batch / (t_ms / 1000.0)
    return out


def with_power(
    curve: Time2ClockTable, power: Mapping[int, float] | PowerLaw | Sequence[float]
) -> Time2ClockTable:
    """``curve`` with energy per inference ``P(f)·t(f)/batch`` at each of its clocks (``power``
    a law; values at clocks, interpolated linearly in the clock between them; or one value per
    clock of the curve)."""
    clocks = np.asarray(curve.clocks_mhz, dtype=float)
    if isinstance(power, PowerLaw):
        watts = power.power_array_w(clocks)
    elif isinstance(power, Mapping):
        xs = sorted(power)
        watts = np.interp(clocks, xs, [power[c] for c in xs])
    else:
        watts = np.asarray(power, dtype=float)
    t_ms = curve.mean_fit.predict_array_ms(clocks)
    with np.errstate(invalid="ignore"):
        energy = watts * t_ms / 1000.0 / curve.batch
    points = tuple(
        replace(p, energy_per_inference_j=float(e) if math.isfinite(e) else None)
        for p, e in zip(curve.points, energy, strict=True)
    )
    return replace(curve, points=points)


# -- the online fit -----------------------------------------------------------------------


@dataclass
class _ModelEnergy:
    diluted: int = 0  # refits where a curve's busy power was too close to idle to be used
    refits: int = 0
    last_refit_s: float | None = None
    last_error: float | None = None
    windows_total: int = 0


@dataclass
class EnergyFit:
    """What one fit of the windows found: the idle power's law, each curve's law (``(model,
    batch)``: the GPU's power running it), each curve's busy seconds in the windows, in all
    (``live_s``) and per clock (``clock_live``), the windows' noise (mean power), and the host's
    part of each execution's time at Triton, per model (``host_s``; the GPU idles through
    it)."""

    idle: PowerLaw
    laws: dict[tuple[str, int], PowerLaw]
    live_s: dict[tuple[str, int], float]
    clock_live: dict[tuple[str, int], dict[int, float]] = field(default_factory=dict)
    noise_w: float | None = None
    host_s: dict[str, float] = field(default_factory=dict)

    def observed_w(
        self, comp: tuple[str, int], curve: Time2ClockTable, clocks_mhz: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        """The power over the time ``comp``'s executions are at Triton, at ``clocks_mhz``: its
        law over the GPU's part of ``curve``'s time there, the idle power over the host's."""
        gpu = 1.0 - host_share(self.host_s.get(comp[0], 0.0), curve, clocks_mhz)
        out: npt.NDArray[np.float64] = gpu * self.laws[comp].power_array_w(clocks_mhz) + (
            1.0 - gpu
        ) * self.idle.power_array_w(clocks_mhz)
        return out


class EnergyRefit:
    """An energy refit, prepared by :meth:`OnlineEnergy.prepare` from copies of the windows:
    :meth:`run` fits them (it may run on another thread), :meth:`OnlineEnergy.adopt` keeps
    what it learned."""

    def __init__(
        self,
        energy: OnlineEnergy,
        now_s: float,
        windows: list[EnergyWindow],
        new: list[EnergyWindow],
        rows: list[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]],
        layout: tuple[tuple[str, int], ...],
        models: list[str],
    ) -> None:
        self.now_s = now_s
        self.windows = windows  # every window in the fit's time window
        self.new = new  # those that came since the last refit
        # the rows of a prefix of the windows, under ``layout`` (the fit extends them to every
        # window, under its own layout)
        self.rows = rows
        self.layout = layout
        self.models = models  # every model the windows saw busy
        self._energy = energy
        # What :meth:`run` learns: the fit; the tables that changed; per model refitted, its
        # energy error (None: not judged); curves left out as diluted, per model.
        self.fit: EnergyFit | None = None
        self.tables: dict[str, ModelTable] = {}
        self.measured: dict[str, float | None] = {}
        self.diluted: dict[str, int] = {}

    def run(self, prior: TableSet, tables: TableSet) -> None:
        """New energy for the models of ``tables`` (their times refitted, or not, from
        ``prior``): the models measured from the windows, the others moved with their times;
        only the tables that changed are kept."""
        energy = self._energy
        fit = energy._fit(self, prior, tables) if self.new and self.windows else None
        self.fit = fit
        for table in tables:
            before = prior.get(table.model)
            refitted = None
            if fit is not None and energy._measured(table.model, fit):
                refitted = energy._from_fit(self, table, before, fit)
                if refitted is not None:
                    self.measured[table.model] = energy._error(table.model, self.new, before, fit)
            if refitted is None and before is not None and before is not table:
                refitted = _moved_with_times(table, before)
            if refitted is not None and refitted != table:
                self.tables[table.model] = refitted


class OnlineEnergy:
    """The online energy fit of every model behind one GPU (see the module docstring)."""

    def __init__(self, clocks_mhz: Sequence[int], params: EnergyParams | None = None) -> None:
        if not clocks_mhz:
            raise ValueError("the energy fit needs the GPU's clock ladder")
        self.clocks_mhz = sorted(clocks_mhz)
        self.params = params or EnergyParams()
        self.attribution = ClockWindows(self.params)
        self._windows: deque[EnergyWindow] = deque()
        self._new: list[EnergyWindow] = []  # since the last refit
        self._models: dict[str, _ModelEnergy] = {}
        self.windows_total = 0
        self.idle: PowerLaw | None = None  # the idle power, as last fitted
        self.noise_w: float | None = None  # the windows' noise (mean power), as last fitted
        self.host_s: dict[str, float] = {}  # each model's host part per execution, as last fitted
        self.update_interval_s: float | None = None
        self._probe: tuple[int, float] | None = None  # (clock, until_s)
        self._last_probe_s = -math.inf
        self.probes = 0
        self._probe_ladder = select_clocks(self.clocks_mhz, self.params.probe_clocks)
        self._evidence: dict[int, float] = {}  # busy seconds in the window, per probe clock
        # each window's row of the least squares and its (column, clock, busy s) rows, for the
        # components of _layout (parallel to _windows, a prefix of it): built once, not at
        # every refit
        self._rows: deque[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] = deque()
        self._layout: tuple[tuple[str, int], ...] = ()
        # a list: every fit adopted is kept there, with its time (for a benchmark to record)
        self.fit_log: list[tuple[float, EnergyFit]] | None = None

    # -- measurements ---------------------------------------------------------------------

    def reading(self, reading: EnergyReading, update_interval_s: float | None) -> None:
        """A value of the GPU's energy counter, with the counter's refresh interval as learned."""
        if update_interval_s is not None:
            self.update_interval_s = update_interval_s
        window = self.attribution.reading(reading, update_interval_s)
        if window is not None:
            self.add(window)

    def add(self, window: EnergyWindow) -> None:
        self._windows.append(window)
        self._new.append(window)
        self.windows_total += 1
        for model in {m for (m, _), _s in window.busy}:
            self._models.setdefault(model, _ModelEnergy()).windows_total += 1
        for span in window.spans:
            bucket = self._bucket(span.clock_mhz)
            self._evidence[bucket] = self._evidence.get(bucket, 0.0) + span.busy_s
        while len(self._windows) > self.params.max_windows:
            self._pop()
        del self._new[: -self.params.max_windows]

    def _bucket(self, clock_mhz: int) -> int:
        """The probe ladder's clock nearest ``clock_mhz``."""
        ladder = self._probe_ladder
        i = bisect.bisect_left(ladder, clock_mhz)
        near = ladder[max(0, i - 1) : i + 1]
        return min(near, key=lambda c: (abs(c - clock_mhz), c))

    def _pop(self) -> None:
        window = self._windows.popleft()
        if self._rows:
            self._rows.popleft()
        for span in window.spans:
            bucket = self._bucket(span.clock_mhz)
            self._evidence[bucket] = max(0.0, self._evidence.get(bucket, 0.0) - span.busy_s)

    @property
    def windows(self) -> list[EnergyWindow]:
        """The windows kept for the fit (the last ``window_s``, at most ``max_windows``)."""
        return list(self._windows)

    def pending(self) -> bool:
        """Whether windows came since the last refit."""
        return bool(self._new)

    def _prune(self, now_s: float) -> None:
        horizon = now_s - self.params.window_s
        while self._windows and self._windows[0].end_s < horizon:
            self._pop()

    # -- the fit --------------------------------------------------------------------------

    def refit(self, prior: TableSet, tables: TableSet, now_s: float) -> dict[str, ModelTable]:
        """New energy for the models of ``tables`` (their times refitted, or not, from
        ``prior``, the tables in force): the models measured from the windows, the others
        moved with their times. Only tables that changed are returned. The three steps of
        :meth:`prepare`, :meth:`EnergyRefit.run` and :meth:`adopt` in a row."""
        job = self.prepare(now_s)
        job.run(prior, tables)
        self.adopt(job)
        return job.tables

    def prepare(self, now_s: float) -> EnergyRefit:
        """The first step of a refit: the windows it fits (copied) and the new ones taken.
        :meth:`EnergyRefit.run` then fits them, reading nothing of this object that changes,
        so it may run on another thread while windows keep coming in; :meth:`adopt` keeps
        what it learned (or :meth:`restore` gives the new windows back, when its tables are
        dropped)."""
        self._prune(now_s)
        new, self._new = self._new, []
        windows, rows = list(self._windows), list(self._rows)
        return EnergyRefit(self, now_s, windows, new, rows, self._layout, list(self._models))

    def adopt(self, job: EnergyRefit) -> None:
        """The last step of a refit, on the caller's thread: what ``job`` (run) learned."""
        fit = job.fit
        if fit is not None:
            self.idle = fit.idle
            self.noise_w = fit.noise_w
            self.host_s = dict(fit.host_s)
            if self.fit_log is not None:
                self.fit_log.append((job.now_s, fit))
        for model, n in job.diluted.items():
            self._models.setdefault(model, _ModelEnergy()).diluted += n
        for model, error in job.measured.items():
            state = self._models.setdefault(model, _ModelEnergy())
            state.refits += 1
            state.last_refit_s = job.now_s
            state.last_error = state.last_error if error is None else error
        # The rows built for the job's windows, less those dropped meanwhile, are the rows of a
        # prefix of the windows now (windows only come at the end and go at the start).
        if self._windows:
            first = self._windows[0]
            gone = next((i for i, w in enumerate(job.windows) if w is first), None)
            if gone is not None:
                self._layout = job.layout
                self._rows = deque(job.rows[gone:])

    def restore(self, job: EnergyRefit) -> None:
        """Give back the windows ``job`` took as new (its tables were dropped): the next refit
        counts them."""
        self._new[:0] = job.new
        del self._new[: -self.params.max_windows]

    def _measured(self, model: str, fit: EnergyFit) -> bool:
        live = sum(s for (m, _), s in fit.live_s.items() if m == model)
        return live >= self.params.min_live_s

    @staticmethod
    def _components(models: Iterable[str], tables: TableSet) -> list[tuple[str, int]]:
        """Every curve of every model the windows saw busy, ``models`` (one for a model with
        no table)."""
        comps: set[tuple[str, int]] = set()
        for m in models:
            table = tables.get(m)
            batches = table.batches if table is not None else [UNKNOWN_BATCH]
            comps.update((m, b) for b in batches)
        return sorted(comps)

    def _fit(self, job: EnergyRefit, prior: TableSet, tables: TableSet) -> EnergyFit | None:
        """Bounded least squares over ``job``'s windows and every curve's prior, each weighed
        by its uncertainty, windows more than ``outlier_sigmas`` off left out. Reads only what
        never changes of this object (it may run on another thread): each window's row is
        built once, kept in ``job`` for :meth:`adopt` to cache."""
        p = self.params
        comps = self._components(job.models, tables)
        index = {c: 2 + 2 * i for i, c in enumerate(comps)}
        f_max = float(self.clocks_mhz[-1])
        k = p.power_exponent
        width = 2 + 2 * len(comps)
        if tuple(comps) != job.layout:
            job.layout, job.rows = tuple(comps), []
        rows = job.rows
        windows = job.windows
        for w in windows[len(rows) :]:
            row = np.zeros(width)
            live_rows: list[tuple[float, float, float]] = []
            for span in w.spans:
                x = (span.clock_mhz / f_max) ** k
                row[0] += span.idle_s
                row[1] += span.idle_s * x
                for (m, n), sec in span.busy:
                    table = tables.get(m)
                    shares = split_batch(n, table.batches) if table else [(UNKNOWN_BATCH, 1.0)]
                    for b, share in shares:
                        j = index[m, b]
                        row[j] += share * sec
                        row[j + 1] += share * sec * x
                        live_rows.append((j, span.clock_mhz, share * sec))
            rows.append((row / w.span_s, np.array(live_rows, dtype=float).reshape(-1, 3)))
        windows_a = np.vstack([row for row, _ in rows])
        spans = np.array([w.span_s for w in windows])
        windows_y = np.array([w.energy_j for w in windows]) / spans
        busy_s = windows_a[:, 2::2] * spans[:, None]  # per window, per component
        live = {c: float(busy_s[:, i].sum()) for i, c in enumerate(comps)}
        clock_live: dict[tuple[str, int], dict[int, float]] = {}
        at = np.vstack([live_rows for _, live_rows in rows])
        for (column, clock), sec in _sum_by(at[:, :2], at[:, 2]).items():
            comp = comps[(int(column) - 2) // 2]
            clock_live.setdefault(comp, {})[int(clock)] = sec
        curves = {c: curve for c in comps if (curve := _curve_of(tables, c)) is not None}
        host_s: dict[str, float] = {}
        if any(w.gpu_busy_s is not None for w in windows):  # else no host part to measure
            host = _HostPart(at, [len(live_rows) for _, live_rows in rows], spans, comps, curves)
            host_s = self._host_s(host, windows, comps)
            windows_a = host.moved(windows_a, host_s, comps, f_max, k)
        prior_rows = []  # (row, target watts)
        ladder = self._probe_ladder
        ladder_a = np.asarray(ladder, dtype=float)
        for c in comps:
            law = _law_through(_prior_power(prior.get(c[0]), tables.get(c[0]), c[1]), f_max, k)
            if law is None:
                continue
            curve = curves.get(c)
            at_host = (
                np.zeros(len(ladder))
                if curve is None
                else host_share(host_s.get(c[0], 0.0), curve, ladder_a)
            )
            # the prior law at the probe ladder's clocks, each known to prior_uncertainty·√n
            # (so that together they know the curve to about prior_uncertainty); it is the power
            # over the time at Triton, the host's share of it at the idle power
            for clock, away in zip(ladder, at_host, strict=True):
                x = (clock / f_max) ** k
                row = np.zeros(width)
                row[index[c]], row[index[c] + 1] = 1.0 - away, (1.0 - away) * x
                row[0], row[1] = away, away * x
                watts = law.power_w(clock)
                std = max(p.prior_uncertainty * watts, p.min_noise_w) * math.sqrt(len(ladder))
                prior_rows.append((row / std, watts / std))
        # How noisy the windows are, from a fit to them alone (the prior barely there): it sets
        # how much the prior counts against them, and which windows are outliers.
        faint = [(r * 1e-6, t * 1e-6) for r, t in prior_rows]
        first = _solve(windows_a, windows_y, faint)
        if first is None:
            return None
        residual = windows_a @ first - windows_y
        noise_w = max(1.4826 * float(np.median(np.abs(residual))), p.min_noise_w)
        keep = np.abs(residual) <= p.outlier_sigmas * noise_w
        solution = _solve(windows_a[keep] / noise_w, windows_y[keep] / noise_w, prior_rows)
        if solution is None:
            return None
        laws = {
            c: PowerLaw(float(solution[index[c]]), float(solution[index[c] + 1]), f_max, k)
            for c in comps
        }
        idle = PowerLaw(float(solution[0]), float(solution[1]), f_max, k)
        live = {c: v for c, v in live.items() if v > 0}
        return EnergyFit(idle, laws, live, clock_live, noise_w, host_s)

    def _host_s(
        self, host: _HostPart, windows: Sequence[EnergyWindow], comps: Sequence[tuple[str, int]]
    ) -> dict[str, float]:
        """Each model's host part per execution, measured: in every window whose GPU busy time
        is known, the time with requests at Triton and the GPU idle, over the executions there
        (each entry's busy seconds over its curve's time), fitted over the windows by bounded
        least squares (0 or more). Empty where no window has the GPU's busy time, or too little
        of it."""
        p = self.params
        known = np.array([w.gpu_busy_s is not None for w in windows])
        if p.max_host_share <= 0 or not known.any():
            return {}
        models = sorted({m for m, _ in comps})
        per_model = np.zeros((len(windows), len(models)))  # executions, per window and model
        model_of = np.array([models.index(m) for m, _ in comps], dtype=int)
        entry_model = model_of[(host.column - 2) // 2]
        finite = np.isfinite(host.time_s)
        np.add.at(
            per_model,
            (host.window[finite], entry_model[finite]),
            host.busy_s[finite] / host.time_s[finite],
        )
        at_triton = np.array([w.busy_s() for w in windows])
        gpu = np.array([w.gpu_busy_s if w.gpu_busy_s is not None else 0.0 for w in windows])
        if float(at_triton[known].sum()) < p.min_live_s:
            return {}
        a, y = per_model[known], (at_triton - gpu)[known]
        upper = np.array(
            [
                p.max_host_share * float(host.time_s[finite & (entry_model == i)].min())
                if (finite & (entry_model == i)).any()
                else 0.0
                for i in range(len(models))
            ]
        )
        seen = a.sum(axis=0) > 0
        if not seen.any():
            return {}
        solution = lsq_linear(a[:, seen], y, bounds=(np.zeros(seen.sum()), upper[seen] + 1e-12))
        return {str(m): float(h) for m, h in zip(np.array(models)[seen], solution.x, strict=True)}

    def _from_fit(
        self, job: EnergyRefit, table: ModelTable, prior: ModelTable | None, fit: EnergyFit
    ) -> ModelTable | None:
        """``table`` with the energy of the fit: each curve measured by its own law (over the
        GPU's part of its time at Triton, the idle power over the host's); each other curve by a
        measured one times the ratio of their powers in the prior (smoothed over the clock), the
        median over the measured curves at each clock."""
        p = self.params
        priors: dict[int, dict[int, float]] = {}
        measured: list[int] = []
        for b in table.batches:
            priors[b] = _prior_power(prior, table, b)
            comp = (table.model, b)
            law = fit.laws.get(comp)
            if law is None or fit.live_s.get(comp, 0.0) < p.min_curve_s:
                continue
            if not law.is_sound(self.clocks_mhz):
                continue
            if not priors[b] and len(fit.clock_live.get(comp, {})) < 2:
                continue  # no prior and one clock: the law's shape is not known
            if self._diluted(fit, comp, table.curves[b], priors[b]):
                job.diluted[table.model] = job.diluted.get(table.model, 0) + 1
                continue
            measured.append(b)
        if not measured:
            return None
        curves = {}
        for b, curve in table.curves.items():
            clocks = np.asarray(curve.clocks_mhz, dtype=float)
            if b in measured:
                curves[b] = with_power(curve, list(fit.observed_w((table.model, b), curve, clocks)))
                continue
            moved = [
                fit.observed_w((table.model, m), table.curves[m], clocks) * ratio
                for m in measured
                if (ratio := _power_ratio(priors[b], priors[m], clocks)) is not None
            ]
            watts = np.median(moved, axis=0) if moved else None
            if watts is not None and bool(np.all(np.isfinite(watts) & (watts > 0))):
                curves[b] = with_power(curve, list(watts))
            else:
                curves[b] = curve
        return replace(table, curves=curves)

    def _diluted(
        self,
        fit: EnergyFit,
        comp: tuple[str, int],
        curve: Time2ClockTable,
        prior: Mapping[int, float],
    ) -> bool:
        """Whether the power measured while the curve's requests were at Triton is barely above
        idle: under ``min_busy_share`` of the prior's excess over idle at the top clock. Then the
        requests mostly waited with the GPU idle (host contention: the sidecar sees requests at
        Triton, not the GPU running them), and multiplying that power by an execution's time
        would count the execution at little more than idle power."""
        if not prior:
            return False
        top = self.clocks_mhz[-1]
        xs = sorted(prior)
        idle = fit.idle.power_w(top)
        expected = float(np.interp(top, xs, [prior[c] for c in xs])) - idle
        seen = float(fit.observed_w(comp, curve, np.array([float(top)]))[0]) - idle
        return expected > 0 and seen < self.params.min_busy_share * expected

    def _error(
        self, model: str, windows: Sequence[EnergyWindow], prior: ModelTable | None, fit: EnergyFit
    ) -> float | None:
        """Median ``|measured / predicted − 1|`` of the busy energy (the window's, less the idle
        power fitted now over its idle time) of the new windows that only ``model`` kept busy, a
        quarter of the time or more, predicted from the table in force (its power at each
        clock, as :func:`table_power_w` gives it)."""
        if prior is None:
            return None
        ratios = []
        power_of: dict[int, tuple[list[int], list[float]]] = {}  # batch -> clocks, watts
        for w in windows:
            busy_s = w.busy_s(model)
            if busy_s < 0.25 * w.span_s or w.busy_s() > busy_s:
                continue
            predicted = 0.0
            measured = w.energy_j
            for span in w.spans:
                measured -= fit.idle.power_w(span.clock_mhz) * span.idle_s
                for (_, n), sec in span.busy:
                    for b, share in split_batch(n, prior.batches):
                        if b not in power_of:
                            powers = table_power_w(prior, b)
                            xs = sorted(powers)
                            power_of[b] = (xs, [powers[c] for c in xs])
                        xs, ys = power_of[b]
                        if not xs:
                            return None  # the table has no energy for this batch
                        watts = float(np.interp(span.clock_mhz, xs, ys))
                        predicted += share * sec * watts
            if predicted > 0:
                ratios.append(measured / predicted - 1.0)
        return float(np.median(np.abs(ratios))) if ratios else None

    # -- probes ---------------------------------------------------------------------------

    def probe_floor_mhz(self, floor_mhz: int, now_s: float) -> int:
        """The energy floor to use now: ``floor_mhz``, or a lower clock while it is probed."""
        p = self.params
        if not p.probe or not self.windows_total:
            return floor_mhz
        if self._probe is not None:
            clock, until_s = self._probe
            if now_s < until_s:
                return min(floor_mhz, clock)
            self._probe = None
            self._last_probe_s = now_s
        if now_s - self._last_probe_s < p.probe_every_s:
            return floor_mhz
        self._prune(now_s)
        evidence = self._evidence
        below = [c for c in self._probe_ladder if c < floor_mhz]
        for clock in reversed(below):
            if evidence.get(clock, 0.0) < p.probe_min_s:
                self._probe = (clock, now_s + p.probe_s)
                self.probes += 1
                return clock
            break  # the next clock down was measured: no probe
        self._last_probe_s = now_s
        return floor_mhz

    # -- what the admin state and the metrics show -----------------------------------------

    @property
    def models(self) -> list[str]:
        return sorted(self._models)

    def refits(self, model: str) -> int:
        state = self._models.get(model)
        return 0 if state is None else state.refits

    def error(self, model: str) -> float | None:
        state = self._models.get(model)
        return None if state is None else state.last_error

    def state(self, model: str, now_s: float, table: ModelTable | None) -> dict[str, object]:
        """Per model: windows and busy seconds in the window, refits, age of the last refit, the
        table's energy error, the host's part per execution as last measured (None: not
        measured), and the energy-optimal clocks its table now gives."""
        state = self._models.get(model, _ModelEnergy())
        horizon = now_s - self.params.window_s
        recent = [w for w in self._windows if w.end_s >= horizon and w.busy_s(model) > 0]
        return {
            "windows_in_window": len(recent),
            "busy_s_in_window": round(sum(w.busy_s(model) for w in recent), 3),
            "refits": state.refits,
            "diluted": state.diluted,
            "last_refit_age_s": (
                None if state.last_refit_s is None else round(now_s - state.last_refit_s, 3)
            ),
            "error": None if state.last_error is None else round(state.last_error, 4),
            "host_ms": round(self.host_s[model] * 1000.0, 3) if model in self.host_s else None,
            "optimal_clock_mhz": (
                None
                if table is None
                else {b: table.energy_optimal_clock_mhz(b) for b in table.batches}
            ),
        }


def curve_time_s(
    curve: Time2ClockTable, clocks_mhz: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """``curve``'s mean time at ``clocks_mhz``, in seconds (infinite where its law has none)."""
    out: npt.NDArray[np.float64] = curve.mean_fit.predict_array_ms(clocks_mhz) / 1000.0
    return out


def host_share(
    host_s: float, curve: Time2ClockTable, clocks_mhz: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """The share of ``curve``'s time at Triton that is the host's (``host_s`` per execution)."""
    out: npt.NDArray[np.float64] = np.clip(host_s / curve_time_s(curve, clocks_mhz), 0.0, 1.0)
    return out


def _curve_of(tables: TableSet, comp: tuple[str, int]) -> Time2ClockTable | None:
    table = tables.get(comp[0])
    return None if table is None else table.curves.get(comp[1])


class _HostPart:
    """The busy time of a fit's windows, entry by entry (window, column, clock, seconds), with
    each entry's execution time, to move a host part of it from the curves' columns to the
    idle power's."""

    def __init__(
        self,
        entries: npt.NDArray[np.float64],
        per_window: Sequence[int],
        spans_s: npt.NDArray[np.float64],
        comps: Sequence[tuple[str, int]],
        curves: Mapping[tuple[str, int], Time2ClockTable],
    ) -> None:
        self.window = np.repeat(np.arange(len(per_window)), per_window)
        self.column = entries[:, 0].astype(int)
        self.clock = entries[:, 1]
        self.busy_s = entries[:, 2]
        self.per_s = self.busy_s / spans_s[self.window]  # the row's share of the window
        self.time_s = np.full(len(entries), np.inf)
        for i, comp in enumerate(comps):
            curve = curves.get(comp)
            mine = self.column == 2 + 2 * i
            if curve is not None and mine.any():
                self.time_s[mine] = curve_time_s(curve, self.clock[mine])

    def moved(
        self,
        a: npt.NDArray[np.float64],
        host_s: Mapping[str, float],
        comps: Sequence[tuple[str, int]],
        max_clock_mhz: float,
        exponent: float,
    ) -> npt.NDArray[np.float64]:
        """The windows' rows ``a`` with ``host_s[model]`` of each of its executions at the idle
        power."""
        if not any(h > 0 for h in host_s.values()):
            return a
        per_comp = np.array([host_s.get(m, 0.0) for m, _ in comps])
        entry_host_s = per_comp[(self.column - 2) // 2]
        share = np.clip(entry_host_s / self.time_s, 0.0, 1.0) * self.per_s
        x_share = share * (self.clock / max_clock_mhz) ** exponent
        out = a.copy()
        zeros = np.zeros_like(self.column)
        np.add.at(out, (self.window, self.column), -share)
        np.add.at(out, (self.window, self.column + 1), -x_share)
        np.add.at(out, (self.window, zeros), share)
        np.add.at(out, (self.window, zeros + 1), x_share)
        return out


def _sum_by(
    keys: npt.NDArray[np.float64], values: npt.NDArray[np.float64]
) -> dict[tuple[float, ...], float]:
    """``values`` summed per distinct row of ``keys``."""
    if not len(keys):
        return {}
    seen, where = np.unique(keys, axis=0, return_inverse=True)
    sums = np.bincount(where.ravel(), weights=values)
    return {tuple(float(k) for k in key): float(v) for key, v in zip(seen, sums, strict=True)}


def _solve(
    a: npt.NDArray[np.float64],
    y: npt.NDArray[np.float64],
    extra: Sequence[tuple[npt.NDArray[np.float64], float]],
) -> npt.NDArray[np.float64] | None:
    """Bounded (every parameter >= 0) least squares of ``a·θ = y`` and the ``extra`` rows."""
    if extra:
        a = np.vstack([a, np.vstack([r for r, _ in extra])])
        y = np.concatenate([y, [t for _, t in extra]])
    try:
        result = lsq_linear(a, y, bounds=(0.0, np.inf), method="bvls")
    except (ValueError, np.linalg.LinAlgError):
        return None
    x: npt.NDArray[np.float64] = result.x
    return x if bool(np.all(np.isfinite(x))) else None


def _power_ratio(
    num: Mapping[int, float], den: Mapping[int, float], clocks_mhz: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64] | None:
    """``num / den`` (powers of two curves in the prior) at ``clocks_mhz``, smoothed: a
    quadratic in the clock fitted to the ratio at ``num``'s clocks (what a profile got wrong
    for every batch alike, a clock-dependent bias, cancels in it; its noise is smoothed)."""
    if not num or not den:
        return None
    xs = sorted(den)
    at = np.array(sorted(num), dtype=float)
    ratio = np.array([num[int(c)] for c in at]) / np.interp(at, xs, [den[c] for c in xs])
    degree = min(2, len(at) - 1)
    scale = float(clocks_mhz.max()) or 1.0
    coef = np.polyfit(at / scale, ratio, degree) if degree > 0 else ratio[:1]
    out: npt.NDArray[np.float64] = np.polyval(coef, clocks_mhz / scale)
    return out


def _law_through(
    powers: Mapping[int, float], max_clock_mhz: float, exponent: float
) -> PowerLaw | None:
    """The law fitted to ``powers`` (watts at clocks) alone: least squares with ``a, c >= 0``
    (two parameters: in closed form, the bound taken where the free optimum breaks it)."""
    if not powers:
        return None
    x = np.array([(c / max_clock_mhz) ** exponent for c in powers])
    y = np.array(list(powers.values()))
    if len(x) >= 2 and float(np.var(x)) > 0:
        c = float(np.cov(x, y, bias=True)[0, 1] / np.var(x))
        a = float(y.mean() - c * x.mean())
    else:
        a, c = float(y.mean()), 0.0
    if c < 0:
        a, c = float(y.mean()), 0.0
    if a < 0:
        a, c = 0.0, float(x @ y / (x @ x)) if float(x @ x) > 0 else 0.0
    return PowerLaw(max(a, 0.0), max(c, 0.0), max_clock_mhz, exponent)


def _moved_with_times(table: ModelTable, before: ModelTable) -> ModelTable | None:
    """``table`` (times refitted from ``before``) with ``before``'s power at each clock: the
    energy per inference moves with the time, as power × time does."""
    curves = {}
    changed = False
    for b, curve in table.curves.items():
        old = before.curves.get(b)
        powers = curve_power_w(old) if old is not None else {}
        if not powers or old is None or old.mean_fit == curve.mean_fit:
            curves[b] = curve
            continue
        curves[b] = with_power(curve, powers)
        changed = True
    return replace(table, curves=curves) if changed else None


def _prior_power(
    prior: ModelTable | None, table: ModelTable | None, batch: int
) -> dict[int, float]:
    """The power of ``batch``'s curve in the table in force (else in the refitted one)."""
    for source in (prior, table):
        if source is not None:
            powers = table_power_w(source, batch)
            if powers:
                return powers
    return {}


def table_power_w(table: ModelTable, batch: int) -> dict[int, float]:
    """The power at ``batch`` that ``table``'s energy implies, per clock: its curve's own, or,
    for a curve without energy (a batch only the traffic formed), linearly between the curves
    around it that have some (at the clocks of the nearer one)."""
    own = table.curves.get(batch)
    powers = curve_power_w(own) if own is not None else {}
    if powers:
        return powers
    known = {b: p for b, c in table.curves.items() if (p := curve_power_w(c))}
    if not known:
        return {}
    shares = split_batch(batch, sorted(known))
    nearest = max(shares, key=lambda bs: bs[1])[0]
    out = {}
    for clock in known[nearest]:
        total = 0.0
        for b, share in shares:
            xs = sorted(known[b])
            total += share * float(np.interp(clock, xs, [known[b][c] for c in xs]))
        out[clock] = total
    return out
