"""One way to run a function over many simulator runs: in order, over a pool of processes (each
run is independent and deterministic, so the results do not depend on how many)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

_In = TypeVar("_In")
_Out = TypeVar("_Out")


def parallel_map(
    fn: Callable[[_In], _Out],
    items: Sequence[_In],
    jobs: int | None,
    progress: Callable[[int], None] | None = None,
) -> list[_Out]:
    """``fn`` of every item, in order, over at most ``jobs`` processes (None: one per CPU; one:
    in this process); ``progress`` is advanced once per item."""
    workers = min(jobs or os.cpu_count() or 1, max(1, len(items)))
    out: list[_Out] = []
    if workers == 1:
        for item in items:
            out.append(fn(item))
            if progress:
                progress(1)
        return out
    with ProcessPoolExecutor(workers) as pool:
        for result in pool.map(fn, items):
            out.append(result)
            if progress:
                progress(1)
    return out
