"""The plan's constraints: the search around a hint finds what the full evaluation finds."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.constraints import Constraints, FloatArray, WorkTable


def times(rng: np.random.Generator, batches: int, clocks: int, monotone: bool) -> FloatArray:
    """Row ``b``: one execution of batch ``b`` at each clock (falling with the clock when
    ``monotone``), row 0 zeros."""
    base = np.sort(rng.uniform(2.0, 40.0, clocks))[::-1]
    rows = [np.zeros(clocks)] + [base * (1 + 0.6 * b) for b in range(batches)]
    t = np.array(rows)
    if not monotone:
        t[1:, clocks // 2] *= 3.0  # a bump: slower at a higher clock
    return t


def constraints(rng: np.random.Generator, monotone: bool, models: int) -> Constraints:
    clocks = 40
    work = [WorkTable(times(rng, 8, clocks, monotone), 8) for _ in range(models)]
    rows = int(rng.integers(3, 30))
    row_model = rng.integers(0, models, rows)
    row_n = rng.integers(1, 40, rows)
    return Constraints(
        work=work,
        row_model=row_model,
        row_n=row_n,
        room_ms=rng.uniform(20.0, 2000.0, rows),
        margin_ms=rng.uniform(0.0, 5.0, rows),
        inflight=[int(rng.integers(0, 4)) for _ in range(models)],
        known=[int(row_n.max()) + 1] * models,
        elapsed_ms=[float(rng.uniform(0.0, 3.0)) for _ in range(models)],
        safety=0.95,
        change_delay_ms=5.0,
    )


def full_answer(c: Constraints, delayed: bool) -> int:
    ok = c.evaluate(slice(None))[1 if delayed else 0]
    return int(np.argmax(ok)) if ok.any() else len(ok) - 1


@pytest.mark.parametrize("monotone", [True, False])
@pytest.mark.parametrize("models", [1, 2])
def test_any_hint_gives_the_full_evaluations_answer(monotone: bool, models: int) -> None:
    rng = np.random.default_rng(7 + models + 10 * monotone)
    answers = set()
    for _ in range(150):
        c = constraints(rng, monotone, models)
        for delayed in (False, True):
            expected = full_answer(c, delayed)
            answers.add(expected)
            for hint in (0, expected - 1, expected, expected + 1, 39, 100):
                assert constraints_answer(c, delayed, hint) == expected
    assert len(answers) > 5  # the cases cover many answers, not one


def constraints_answer(c: Constraints, delayed: bool, hint: int) -> int:
    fresh = Constraints(**{k: getattr(c, k) for k in Constraints.__dataclass_fields__})
    return fresh.first(delayed, hint)


def test_the_two_clock_check_is_what_monotone_feasibility_allows() -> None:
    rng = np.random.default_rng(1)
    c = constraints(rng, True, 1)
    assert c.monotone
    bumpy = constraints(rng, False, 1)
    assert not bumpy.monotone  # such tables always take the full evaluation


def test_work_tables_add_full_batches_and_the_rest() -> None:
    t = np.array([[0.0, 0.0], [3.0, 2.0], [5.0, 4.0]])  # batch 1 and 2 at two clocks
    table = WorkTable(t, 2).upto(5)
    np.testing.assert_array_equal(table[5], 2 * t[2] + t[1])
    np.testing.assert_array_equal(table[4], 2 * t[2])
    np.testing.assert_array_equal(table[0], [0.0, 0.0])


@pytest.mark.parametrize("monotone", [True, False])
@pytest.mark.parametrize("models", [1, 3])
def test_the_one_clock_check_is_a_column_of_the_array_evaluation(
    monotone: bool, models: int
) -> None:
    rng = np.random.default_rng(3 + models + 10 * monotone)
    flips = 0
    for _ in range(60):
        c = constraints(rng, monotone, models)
        now_ok, delayed_ok = c.evaluate(slice(None))
        for clock in range(len(now_ok)):
            assert c.holds_at(clock, False) == bool(now_ok[clock])
            assert c.holds_at(clock, True) == bool(delayed_ok[clock])
        flips += int(now_ok.any() and not now_ok.all())
    assert flips > 10  # the cases have feasible and infeasible clocks both
