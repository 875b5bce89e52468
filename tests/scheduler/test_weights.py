from __future__ import annotations

from itertools import pairwise

import pytest

from scheduler.weights import SCHED_PRIO_TO_WEIGHT, weight_for_nice


def test_linux_weight_table() -> None:
    assert len(SCHED_PRIO_TO_WEIGHT) == 40
    assert weight_for_nice(0) == 1024
    assert weight_for_nice(-20) == 88761
    assert weight_for_nice(19) == 15
    assert (weight_for_nice(-5), weight_for_nice(5)) == (3121, 335)
    assert list(SCHED_PRIO_TO_WEIGHT) == sorted(SCHED_PRIO_TO_WEIGHT, reverse=True)
    ratios = [a / b for a, b in pairwise(SCHED_PRIO_TO_WEIGHT)]
    assert all(1.19 < r < 1.29 for r in ratios)  # ~10% of CPU share per nice step


@pytest.mark.parametrize("nice", [-21, 20])
def test_nice_out_of_range(nice: int) -> None:
    with pytest.raises(ValueError, match=r"nice must be in -20\.\.19"):
        weight_for_nice(nice)
