"""Runs over a pool of processes give what one process gives, in the same order."""

from __future__ import annotations

from simulator.pool import parallel_map


def square_less_itself(x: int) -> int:
    return x * x - x


def test_a_pool_gives_the_serial_results_in_order_and_counts_each_item() -> None:
    items = [7, 3, 11, 0, 5]
    for jobs in (1, 2):
        ticks: list[int] = []
        assert parallel_map(square_less_itself, items, jobs, ticks.append) == [42, 6, 110, 0, 20]
        assert ticks == [1] * len(items)
    assert parallel_map(square_less_itself, [], 2) == []
