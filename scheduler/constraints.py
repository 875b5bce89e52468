"""The constraints of one ``slack`` plan, evaluated at every clock or only at the few that decide.

A plan (see :class:`scheduler.policies.SlackPolicy`) asks, for every clock on the ladder, whether
every constraint holds (each request in flight, queued, bounded or about to arrive meeting its
room), and takes the lowest clock where all do. Evaluating all of a GPU's clocks (187 on a V100)
for some thirty constraints is most of the scheduler's CPU per request. But when each model's
times fall (or stay) as the clock rises, and the work credited to what is in flight is the same
at every clock, every constraint's need falls with the clock too, so feasibility is monotone:
false below some clock, true from it up. Then the lowest feasible clock is known from two
clocks, the one below it infeasible and it feasible, and the plan checks just those two around
its previous answer (:meth:`Constraints.first`), evaluating the whole ladder only when the answer
moved or the need is not monotone. The answer is the same as the full evaluation's, exactly:
the two clocks' values are computed by the same operations as the full evaluation's.

A plan has some twenty constraints and checks two clocks: on arrays that small, numpy's cost per
call is most of the work. So the check at one clock (:meth:`Constraints.holds_at`) is plain
Python over plain lists, with the same floating-point operations in the same order as the array
evaluation (:meth:`Constraints.evaluate`), which is kept for the whole ladder when feasibility is
not monotone. When it is monotone and the hint missed, the lowest feasible clock is found by
bisection with the same check: exactly the full evaluation's answer, from a few clocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int_]
BoolArray = npt.NDArray[np.bool_]
Columns = slice | IntArray


class WorkTable:
    """One model's mean time (ms) for ``n`` requests run in full batches (``⌊n/B⌋`` of ``B``
    and one of ``n mod B``), at every clock: row ``n``, grown as larger ``n`` are asked for.
    ``rows`` holds the same values as plain lists (what one-clock checks read)."""

    def __init__(self, times_ms: FloatArray, max_batch: int) -> None:
        """``times_ms``: row ``b`` one execution of batch ``b`` at every clock (row 0: zeros)."""
        self.times_ms = times_ms
        self.max_batch = max_batch
        self.table: FloatArray = np.zeros((0, times_ms.shape[1]))
        self.rows: list[list[float]] = []
        # Whether no batch's time rises with the clock (then neither does any work).
        self.monotone = bool(np.all(np.diff(times_ms, axis=1) <= 0.0))
        # Whether no work falls as requests are added, at any clock (rows so far).
        self.rising = True

    def upto(self, n: int) -> FloatArray:
        """The table with at least rows ``0..n``."""
        have = len(self.rows)
        if n >= have:
            grow = np.arange(have, max(n + 1, 2 * have, 64))
            full, part = np.divmod(grow, self.max_batch)
            rows = full[:, None] * self.times_ms[self.max_batch] + self.times_ms[part]
            self.table = np.vstack([self.table, rows])
            self.rows.extend(rows.tolist())
            self.rising = bool(np.all(np.diff(self.table, axis=0) >= 0.0))
        return self.table


def _floats(values: Sequence[float] | FloatArray) -> list[float]:
    if isinstance(values, list):
        return values
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def _ints(values: Sequence[int] | IntArray) -> list[int]:
    if isinstance(values, list):
        return values
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


@dataclass
class Constraints:
    """The constraints of one plan: per row its model (index into ``work``), the requests of
    that model ahead of it (itself included), its room (ms) and its tail margin (ms); per model
    its work table, the requests of it in flight and known, and the work already done on what is
    in flight (ms, the credit's cap)."""

    work: list[WorkTable]
    row_model: Sequence[int] | IntArray
    row_n: Sequence[int] | IntArray
    room_ms: Sequence[float] | FloatArray
    margin_ms: Sequence[float] | FloatArray
    inflight: list[int]
    known: list[int]
    elapsed_ms: list[float]
    safety: float
    change_delay_ms: float

    def __post_init__(self) -> None:
        # ``known`` counts every request of a model, so no row's count passes it.
        known, rows = self.known, []
        monotone = True
        for k, w in enumerate(self.work):
            if known[k] >= len(w.rows):
                w.upto(known[k])
            rows.append(w.rows)
            monotone = monotone and w.monotone
        self._rows = rows
        self._models = _ints(self.row_model)
        self._n = _ints(self.row_n)
        self._margins = _floats(self.margin_ms)
        self._rooms = _floats(self.room_ms)
        self._room_at: list[list[float] | None] = [None, None]  # as it stands, after a delay
        self.top = top = len(rows[0][0]) - 1
        # The credit is the same at every clock when the work done so far is below what the
        # model's in-flight requests need even at the top clock (their least).
        if monotone:
            elapsed, inflight = self.elapsed_ms, self.inflight
            for k, table in enumerate(rows):
                if not elapsed[k] <= 0.95 * table[inflight[k]][top]:
                    monotone = False
                    break
        self.monotone = monotone
        self._full: tuple[BoolArray, BoolArray] | None = None
        # Set where these rows are a bound on the plan's, not the plan's own (stronger rows:
        # where they hold, the plan's hold): the plan's own constraints, made when asked for.
        self.exact: Callable[[], Constraints] | None = None

    def _room(self, delayed: bool) -> list[float]:
        """Each row's room with the safety share kept back (``delayed``: less the raise's
        delay), worked out once per plan."""
        rooms = self._room_at[delayed]
        if rooms is None:
            safety = self.safety
            if delayed:
                delay = self.change_delay_ms
                rooms = [(room - delay) * safety for room in self._rooms]
            else:
                rooms = [room * safety for room in self._rooms]
            self._room_at[delayed] = rooms
        return rooms

    def holds_at(self, clock: int, delayed: bool) -> bool:
        """Whether every constraint holds at clock index ``clock`` (``delayed``: after a raise's
        delay): one column of :meth:`evaluate`, by the same operations in plain Python."""
        rooms = self._room(delayed)
        tables = self._rows
        elapsed, inflight = self.elapsed_ms, self.inflight
        if len(tables) == 1:
            table = tables[0]
            c = min(elapsed[0], 0.95 * table[inflight[0]][clock])
            for n, margin, room in zip(self._n, self._margins, rooms, strict=True):
                if not table[n][clock] - c + margin <= room:
                    return False
            return True
        credit = [min(elapsed[k], 0.95 * t[inflight[k]][clock]) for k, t in enumerate(tables)]
        known = [t[self.known[k]][clock] - credit[k] for k, t in enumerate(tables)]
        models = range(len(tables))
        for m, n, margin, room in zip(self._models, self._n, self._margins, rooms, strict=True):
            own = tables[m][n][clock] - credit[m]
            total = own
            for k in models:
                if k != m:
                    total += min(own, known[k])
            if not total + margin <= room:
                return False
        return True

    def evaluate(self, columns: Columns) -> tuple[BoolArray, BoolArray]:
        """At the clocks ``columns`` (indices into the ladder), whether every constraint holds:
        as the clock stands, and when a raise must first wait ``change_delay_ms``.

        A constraint of model ``M`` with ``n`` of ``M`` ahead of it needs its own model's work
        ``X = W_M(n) − credit`` plus, for every other model ``M'``, ``min(X, Y_M')`` with
        ``Y_M'`` all the work of ``M'`` known (in flight, queued, about to arrive): models
        time-share the GPU, so another model's work delays it until either is done.
        """
        tables = [w.table for w in self.work]
        row_n = np.array(self._n, dtype=int)
        row_model = np.array(self._models, dtype=int)
        credit = [
            np.minimum(self.elapsed_ms[k], 0.95 * table[self.inflight[k], columns])
            for k, table in enumerate(tables)
        ]
        if len(tables) == 1:
            own = _rows(tables[0], row_n, columns) - credit[0]
            total = own
        else:
            masks = [row_model == k for k in range(len(tables))]
            width = len(credit[0])
            own = np.empty((len(row_n), width))
            for k, (table, mask) in enumerate(zip(tables, masks, strict=True)):
                own[mask] = _rows(table, row_n[mask], columns) - credit[k]
            total = own.copy()
            for k, (table, mask) in enumerate(zip(tables, masks, strict=True)):
                others = ~mask
                if others.any():
                    known = table[self.known[k], columns] - credit[k]
                    total[others] += np.minimum(own[others], known)
        need = total + np.array(self._margins)[:, None]
        now_ok = (need <= np.array(self._room(False))[:, None]).all(axis=0)
        delayed_ok = (need <= np.array(self._room(True))[:, None]).all(axis=0)
        return now_ok, delayed_ok

    def everywhere(self) -> tuple[BoolArray, BoolArray]:
        """:meth:`evaluate` at every clock (once per plan)."""
        if self._full is None:
            self._full = self.evaluate(slice(None))
        return self._full

    def first(self, delayed: bool, hint: int) -> int:
        """The lowest clock index where every constraint holds (``delayed``: after a raise's
        delay), or the top index when none does; ``hint``, the likely answer, is checked first
        when feasibility is monotone (see the module docstring)."""
        top = self.top
        if self.monotone and self._full is None:
            h = min(max(hint, 0), top)
            if self.holds_at(h, delayed):
                if h == 0 or not self.holds_at(h - 1, delayed):
                    return h
                lo, hi = 0, h - 1  # infeasible below lo (none), feasible at hi
            elif h == top:
                return top  # none holds at the top clock: none holds anywhere
            else:
                lo, hi = h + 1, top
                if not self.holds_at(top, delayed):
                    return top
            # Monotone: false below the answer, true from it up; it lies in lo..hi.
            while lo < hi:
                mid = (lo + hi) // 2
                if self.holds_at(mid, delayed):
                    hi = mid
                else:
                    lo = mid + 1
            return lo
        feasible = self.everywhere()[1 if delayed else 0]
        return int(np.argmax(feasible)) if feasible.any() else top


def _rows(table: FloatArray, n: IntArray, columns: Columns) -> FloatArray:
    """``table[n][:, columns]``, gathering only the columns asked for."""
    if isinstance(columns, slice):
        out: FloatArray = table[n][:, columns]
    else:
        out = table[n[:, None], columns[None, :]]
    return out
