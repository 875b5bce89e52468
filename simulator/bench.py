"""Benchmarks, printed and never asserted: the core's cost per decision, the simulator's speed."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from dvfs.profiles import CNN
from scheduler.core import Scheduler, SchedulerConfig
from scheduler.feedback import FeedbackParams
from scheduler.policies import SlackParams
from scheduler.registry import POLICIES, make_policy
from scheduler.request import Request
from simulator.compare import DEFAULT_MIX, slo_models
from simulator.simulate import SimConfig, profiled_tables, simulate


@dataclass(frozen=True)
class CoreCost:
    policy: str
    queue_len: int
    flows: int
    us_per_enqueue_and_dispatch: float


def core_cost(
    policy: str,
    *,
    queue_len: int = 1000,
    flows: int = 3,
    rounds: int = 3000,
    gpu: str = "v100",
    holds: bool = False,
    phantoms: int | None = None,
) -> CoreCost:
    """Mean µs for one enqueue plus one dispatch (and its completion) at a steady queue length.

    ``holds`` False: batch holds off (``slack``'s and ``adaptive``'s), so that every round
    dispatches (a request held back for a fuller batch is not a decision to time). True: the
    policy's own defaults, which dispatch every round only while a full batch waits (a queue
    of 1000). ``phantoms``: ``adaptive``'s arrivals to come in its plan (default: its own
    default), so that what counting them costs is measured beside it."""
    tables = profiled_tables(gpu)
    clocks = next(iter(tables)).clocks_mhz
    slack, feedback = (
        (None, FeedbackParams())
        if holds
        else (SlackParams(batch_hold=0.0), FeedbackParams(batch_hold=0.0))
    )
    if phantoms is not None:
        feedback = replace(feedback, phantoms=phantoms)
    sched: Scheduler[None] = Scheduler(
        tables,
        make_policy(policy, clocks, slack, feedback),
        SchedulerConfig(max_queue=queue_len + 10, default_slo_ms=10_000.0),
    )
    now = 0.0

    def make(i: int) -> Request[None]:
        return Request(
            model=CNN,
            arrival_s=now,
            slo_ms=10_000.0,
            nice=(i % flows) * 5 - 5,
            client_id=f"c{i % flows}",
        )

    for i in range(queue_len):
        sched.enqueue(make(i), now)
    start = time.process_time()  # this process's CPU: on a shared machine, not others' load
    for i in range(rounds):
        now += 0.001
        sched.enqueue(make(i), now)
        d = sched.next_dispatch(now)
        assert d is not None
        sched.on_complete(d.request, 0.007, now)
    elapsed = time.process_time() - start
    return CoreCost(policy, queue_len, flows, elapsed / rounds * 1e6)


def simulator_speed(
    gpu: str = "v100", policy: str = "slack", duration_s: float = 30.0
) -> dict[str, float]:
    """Wall time, events per second and simulated seconds per wall second for one run."""
    profiled_tables(gpu)
    start = time.perf_counter()
    result = simulate(
        SimConfig(
            gpu=gpu,
            policy=policy,
            load=0.5,
            models=slo_models(gpu, DEFAULT_MIX, 3.0),
            duration_s=duration_s,
        )
    )
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "events": float(result.events),
        "events_per_s": result.events / wall,
        "simulated_s_per_wall_s": result.span_s / wall,
        "requests": float(result.requests),
    }


def run() -> list[str]:
    lines = [
        "core cost in CPU time (enqueue + dispatch + completion), queue held at 1000, 3 flows,"
        " batch holds off:"
    ]
    for name in POLICIES:
        c = core_cost(name)
        lines.append(f"  {name:8s} {c.us_per_enqueue_and_dispatch:7.1f} µs per request")
    for name in ("slack", "adaptive"):
        c = core_cost(name, queue_len=10)
        lines.append(
            f"  {name:8s} {c.us_per_enqueue_and_dispatch:7.1f} µs per request at a queue of 10"
        )
    for queue_len in (1000, 10):
        c = core_cost("adaptive", queue_len=queue_len, phantoms=0)
        lines.append(
            f"  adaptive {c.us_per_enqueue_and_dispatch:7.1f} µs per request at a queue of"
            f" {queue_len}, counting no arrival to come (phantoms 0)"
        )
    c = core_cost("adaptive", holds=True)
    lines.append(
        f"  adaptive {c.us_per_enqueue_and_dispatch:7.1f} µs per request with its batch holds on"
    )
    s = simulator_speed()
    lines.append(
        f"simulator: {s['requests']:.0f} requests, {s['events']:.0f} events in {s['wall_s']:.2f} s "
        f"({s['events_per_s']:.0f} events/s, {s['simulated_s_per_wall_s']:.0f}× real time)"
    )
    return lines
