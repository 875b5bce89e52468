"""The plan's short cuts decide what the full plan decides: the short walk and the bound on the
queue (``SlackPolicy._lookahead``), and the floor checked before any search
(``SlackPolicy._planned_mhz``). Two schedulers fed the same seeded events, one walking the
first ``lookahead`` queued requests and searching the clock at every plan, give the same clocks
and send the same requests."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from dvfs.profiles import CNN
from scheduler.adaptive import AdaptivePolicy
from scheduler.constraints import Constraints
from scheduler.core import Scheduler, SchedulerConfig
from scheduler.policies import ClockPolicy, SlackPolicy
from scheduler.request import Request
from scheduler.view import ModelServing, QueuedRequest, SchedulerView
from simulator.simulate import profiled_tables


class FullSlack(SlackPolicy):
    """Every plan walks the first ``lookahead`` and searches its clock."""

    def _lookahead(self, s: SchedulerView) -> Sequence[QueuedRequest]:
        return s.iter_queue(self.params.lookahead)

    def _planned_mhz(
        self,
        s: SchedulerView,
        now_s: float,
        constraints: Constraints,
        models: list[str],
        floor_mhz: int | None = None,
    ) -> int:
        assert constraints.exact is None
        floor = s.energy_floor_mhz(self._floor(s, models), now_s)
        assert floor_mhz is None or floor_mhz == floor  # the caller's is the same floor
        return max(self._first(constraints), floor)


class FullAdaptive(AdaptivePolicy):
    _lookahead = FullSlack._lookahead
    _planned_mhz = FullSlack._planned_mhz


def trace(policy: ClockPolicy, seed: int) -> tuple[list[tuple[object, ...]], int]:
    """Every decision of a run (clocks proposed, requests sent) and how many plans saw more
    than the lookahead waiting (the case the short walk is for)."""
    tables = profiled_tables("v100")
    sched: Scheduler[None] = Scheduler(
        tables,
        policy,
        SchedulerConfig(max_queue=400, max_inflight=64),
        {CNN: ModelServing(max_batch=8, instances=1)},
    )
    rng = random.Random(seed)
    now_s, long_queues = 0.0, 0
    out: list[tuple[object, ...]] = []
    running: list[tuple[float, Request[None]]] = []
    for i in range(3000):
        now_s += rng.expovariate(700.0 if (i // 400) % 2 else 300.0)  # bursts and lulls
        long_queues += sched.queue_len > 16
        slo_ms = rng.choice([25.0, 400.0, 800.0, 1600.0])
        client = rng.randrange(3)
        r: Request[None] = Request(CNN, now_s, slo_ms, nice=5 * client - 5, client_id=f"c{client}")
        out.append(("enqueue", sched.enqueue(r, now_s).clock_mhz))
        running.sort(key=lambda x: (x[0], x[1].seq))
        while running and running[0][0] <= now_s:
            done_s, req = running.pop(0)
            out.append(("complete", req.seq, sched.on_complete(req, 0.004, done_s).clock_mhz))
        if (wake := sched.wake_at_s()) is not None and wake <= now_s:
            out.append(("poll", sched.poll(now_s)))
        while (d := sched.next_dispatch(now_s)) is not None:
            free_s = max([now_s, *(t for t, _ in running)])  # the GPU runs one at a time
            running.append((free_s + rng.uniform(0.0015, 0.0025), d.request))
            out.append(("send", d.request.seq, d.clock_mhz))
    return out, long_queues


@pytest.mark.parametrize(
    ("short", "full"), [(SlackPolicy, FullSlack), (AdaptivePolicy, FullAdaptive)]
)
def test_the_short_walk_decides_as_the_full_one(
    short: type[SlackPolicy], full: type[SlackPolicy]
) -> None:
    clocks = next(iter(profiled_tables("v100"))).clocks_mhz
    for seed in (1, 2):
        got, long_queues = trace(short(clocks), seed)
        expected, _ = trace(full(clocks), seed)
        assert long_queues > 200  # the queue often held more than the lookahead
        assert len({c for kind, *rest in got if kind == "enqueue" for c in rest[-1:]}) > 3
        assert got == expected
