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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int_]
BoolArray = npt.NDArray[np.bool_]
Columns = slice | IntArray


class WorkTable:
    """One model's mean time (ms) for ``n`` requests run in full batches (``⌊n/B⌋`` of ``B``
    and one of ``n mod B``), at every clock: row ``n``, grown as larger ``n`` are asked for."""

    def __init__(self, times_ms: FloatArray, max_batch: int) -> None:
        """``times_ms``: row ``b`` one execution of batch ``b`` at every clock (row 0: zeros)."""
        self.times_ms = times_ms
        self.max_batch = max_batch
        self.table: FloatArray = np.zeros((0, times_ms.shape[1]))
        # Whether no batch's time rises with the clock (then neither does any work).
        self.monotone = bool(np.all(np.diff(times_ms, axis=1) <= 0.0))

    def upto(self, n: int) -> FloatArray:
        """The table with at least rows ``0..n``."""
        have = len(self.table)
        if n >= have:
            grow = np.arange(have, max(n + 1, 2 * have, 64))
            full, part = np.divmod(grow, self.max_batch)
            rows = full[:, None] * self.times_ms[self.max_batch] + self.times_ms[part]
            self.table = np.vstack([self.table, rows])
        return self.table


@dataclass
class Constraints:
    """The constraints of one plan: per row its model (index into ``work``), the requests of
    that model ahead of it (itself included), its room (ms) and its tail margin (ms); per model
    its work table, the requests of it in flight and known, and the work already done on what is
    in flight (ms, the credit's cap)."""

    work: list[WorkTable]
    row_model: IntArray
    row_n: IntArray
    room_ms: FloatArray
    margin_ms: FloatArray
    inflight: list[int]
    known: list[int]
    elapsed_ms: list[float]
    safety: float
    change_delay_ms: float

    def __post_init__(self) -> None:
        # ``known`` counts every request of a model, so no row's count passes it.
        self.tables = [w.upto(self.known[k]) for k, w in enumerate(self.work)]
        self._now_room = self.room_ms * self.safety
        self._delayed_room = (self.room_ms - self.change_delay_ms) * self.safety
        self._masks = (
            None if len(self.work) == 1 else [self.row_model == k for k in range(len(self.work))]
        )
        top = self.tables[0].shape[1] - 1
        # The credit is the same at every clock when the work done so far is below what the
        # model's in-flight requests need even at the top clock (their least).
        flat = all(
            self.elapsed_ms[k] <= 0.95 * self.tables[k][self.inflight[k], top]
            for k in range(len(self.work))
        )
        self.monotone = flat and all(w.monotone for w in self.work)
        self._full: tuple[BoolArray, BoolArray] | None = None

    def evaluate(self, columns: Columns) -> tuple[BoolArray, BoolArray]:
        """At the clocks ``columns`` (indices into the ladder), whether every constraint holds:
        as the clock stands, and when a raise must first wait ``change_delay_ms``.

        A constraint of model ``M`` with ``n`` of ``M`` ahead of it needs its own model's work
        ``X = W_M(n) − credit`` plus, for every other model ``M'``, ``min(X, Y_M')`` with
        ``Y_M'`` all the work of ``M'`` known (in flight, queued, about to arrive): models
        time-share the GPU, so another model's work delays it until either is done.
        """
        credit = [
            np.minimum(self.elapsed_ms[k], 0.95 * table[self.inflight[k], columns])
            for k, table in enumerate(self.tables)
        ]
        if self._masks is None:
            own = _rows(self.tables[0], self.row_n, columns) - credit[0]
            total = own
        else:
            width = len(credit[0])
            own = np.empty((len(self.row_n), width))
            for k, (table, mask) in enumerate(zip(self.tables, self._masks, strict=True)):
                own[mask] = _rows(table, self.row_n[mask], columns) - credit[k]
            total = own.copy()
            for k, (table, mask) in enumerate(zip(self.tables, self._masks, strict=True)):
                others = ~mask
                if others.any():
                    known = table[self.known[k], columns] - credit[k]
                    total[others] += np.minimum(own[others], known)
        need = total + self.margin_ms[:, None]
        now_ok = (need <= self._now_room[:, None]).all(axis=0)
        delayed_ok = (need <= self._delayed_room[:, None]).all(axis=0)
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
        top = self.tables[0].shape[1] - 1
        which = 1 if delayed else 0
        if self.monotone and self._full is None:
            h = min(max(hint, 0), top)
            if h == 0:
                ok = self.evaluate(np.array([0]))[which]
                if ok[0]:
                    return 0
            else:
                ok = self.evaluate(np.array([h - 1, h]))[which]
                if ok[1] and not ok[0]:
                    return h
                if h == top and not ok[1]:
                    return top  # none holds at the top clock: none holds anywhere
        feasible = self.everywhere()[which]
        return int(np.argmax(feasible)) if feasible.any() else top


def _rows(table: FloatArray, n: IntArray, columns: Columns) -> FloatArray:
    """``table[n][:, columns]``, gathering only the columns asked for."""
    if isinstance(columns, slice):
        out: FloatArray = table[n][:, columns]
    else:
        out = table[n[:, None], columns[None, :]]
    return out
