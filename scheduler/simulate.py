"""Discrete-event simulation: the scheduler core, in virtual time, driving a SimulatedDevice.

The same :class:`scheduler.core.Scheduler` the gateway runs makes every decision; the simulator
only plays the GPU (service times drawn from the device at the clock in force, energy from its
counter) and the clients (arrivals). Everything random comes from one seed.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from dvfs.profiles import GpuProfile, get_profile
from dvfs.simulated import SimulatedDevice
from dvfs.timesource import VirtualTime
from scheduler.core import Scheduler, SchedulerConfig
from scheduler.oracle import oracle_energy
from scheduler.policies import SlackParams, make_policy
from scheduler.request import Request
from scheduler.workload import (
    ClientSpec,
    FloatArray,
    assign_clients,
    bursty_arrivals,
    poisson_arrivals,
    trace_arrivals,
)
from time2clock.fit import fit_table
from time2clock.profile import SimulatedMeasurer, sweep
from time2clock.table import Time2ClockTable

# At equal times: clock changes land, then completions, timers, arrivals.
_CLOCK, _COMPLETE, _TIMER, _ARRIVAL = 0, 1, 2, 3


@dataclass(frozen=True)
class SimConfig:
    """One simulation run."""

    gpu: str = "v100"
    policy: str = "slack"
    slo_ms: float = 30.0
    duration_s: float = 30.0
    seed: int = 0
    load: float | None = 0.5
    rate_rps: float | None = None
    arrival: str = "poisson"  # poisson | bursty | trace
    trace: Path | None = None
    clients: tuple[ClientSpec, ...] = (ClientSpec("default"),)
    max_inflight: int = 2
    max_queue: int = 1000
    priority_levels: int = 2
    profile_requests_per_clock: int = 20
    with_oracle: bool = True
    slack: SlackParams = field(default_factory=SlackParams)

    def rate(self, profile: GpuProfile) -> float:
        if self.rate_rps is not None:
            return self.rate_rps
        assert self.load is not None
        return self.load * profile.capacity_rps(self.max_inflight)


@lru_cache(maxsize=32)
def profiled_table(gpu: str, seed: int = 0, requests_per_clock: int = 20) -> Time2ClockTable:
    """The time2clock table the scheduler would have: seed 003's sweep of the simulated GPU
    (every clock), not the ground truth. This simulator runs the requests in flight side by
    side, each at its own speed, so one request's time measured alone is the time of a round of
    2 (the table's concurrency)."""
    sim = SimulatedMeasurer.for_profile(gpu, seed=10_000 + seed)
    result = sweep(
        sim.device, sim, sim.device.supported_clocks_mhz(), requests_per_clock=requests_per_clock
    )
    return fit_table(
        result.samples[1],
        trim=0.2,
        gpu=gpu,
        model="inception-sim",
        concurrency=2,
        energy_j=result.energy_per_inference_j[1],
    )


@dataclass
class ClientStats:
    completed: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    met: int = 0
    service_ms: float = 0.0
    rejected: int = 0


@dataclass
class SimResult:
    """Everything a run measured; :meth:`to_json` is the ``--json`` line."""

    config: SimConfig
    requests: int
    completed: int
    rejected: int
    span_s: float
    energy_j: float
    oracle_energy_j: float | None
    latencies_ms: FloatArray
    met: int
    clock_changes: int
    mean_clock_mhz: float
    clients: dict[str, ClientStats]
    events: int

    def _pct(self, q: float, values: FloatArray | None = None) -> float:
        data = self.latencies_ms if values is None else values
        return float(np.percentile(data, q)) if len(data) else math.nan

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {
            "policy": c.policy,
            "gpu": c.gpu,
            "slo_ms": c.slo_ms,
            "load": c.load if c.rate_rps is None else None,
            "rate_rps": c.rate(get_profile(c.gpu)),
            "seed": c.seed,
            "duration_s": c.duration_s,
            "requests": self.requests,
            "completed": self.completed,
            "rejected": self.rejected,
            "throughput_rps": self.completed / self.span_s if self.span_s else 0.0,
            "energy_j": self.energy_j,
            "energy_per_inference_j": (
                self.energy_j / self.completed if self.completed else math.nan
            ),
            "oracle_energy_j": self.oracle_energy_j,
            "p50_ms": self._pct(50),
            "p90_ms": self._pct(90),
            "p99_ms": self._pct(99),
            "slo_attainment": self.met / self.completed if self.completed else math.nan,
            "clock_changes": self.clock_changes,
            "mean_clock_mhz": self.mean_clock_mhz,
            "clients": {
                name: {
                    "completed": s.completed,
                    "rejected": s.rejected,
                    "p99_ms": self._pct(99, np.asarray(s.latencies_ms)),
                    "slo_attainment": s.met / s.completed if s.completed else math.nan,
                    "service_ms": s.service_ms,
                }
                for name, s in self.clients.items()
            },
        }


@dataclass
class _Running:
    request: Request
    start_s: float
    base_ms: float  # its duration at the top clock (same noise draw)
    done: float = 0.0  # fraction of its work done
    since_s: float = 0.0
    version: int = 0


class _GpuWork:
    """Requests on the simulated GPU, progressing at the speed of the clock in force.

    A request's duration is drawn at the clock it starts at; when the clock changes mid-way, the
    rest of its work goes at the new clock's speed (the latency law scales it), as on a real GPU.
    """

    def __init__(self, profile: GpuProfile, device: SimulatedDevice) -> None:
        self.profile = profile
        self.device = device
        self.inflight: dict[int, _Running] = {}
        self.clock_mhz = device.clock_mhz()
        self._top_ms = profile.mean_latency_ms(profile.max_clock_mhz)

    def _scale(self) -> float:
        return self.profile.mean_latency_ms(self.clock_mhz) / self._top_ms

    def _progress(self, now: float) -> None:
        scale = self._scale()
        for run in self.inflight.values():
            run.done += (now - run.since_s) * 1000.0 / (run.base_ms * scale)
            run.since_s = now

    def start(self, request: Request, now: float) -> None:
        self._progress(now)
        self.device.begin_work()
        self.clock_mhz = self.device.clock_mhz()
        sample_ms = self.device.sample_latency_ms(self.clock_mhz)
        self.inflight[request.seq] = _Running(request, now, sample_ms / self._scale(), since_s=now)

    def completions(self) -> list[tuple[float, tuple[int, int]]]:
        """(end time, key) for every in-flight request, each with a fresh version."""
        scale = self._scale()
        out = []
        for seq, run in self.inflight.items():
            run.version += 1
            left_s = max(0.0, 1.0 - run.done) * run.base_ms * scale / 1000.0
            out.append((run.since_s + left_s, (seq, run.version)))
        return out

    def clock_landed(self, now: float) -> list[tuple[float, tuple[int, int]]]:
        self._progress(now)
        clock = self.device.clock_mhz()
        if clock == self.clock_mhz:
            return []
        self.clock_mhz = clock
        return self.completions()

    def finish(self, key: tuple[int, int], now: float) -> tuple[Request, float] | None:
        seq, version = key
        run = self.inflight.get(seq)
        if run is None or run.version != version:
            return None
        self._progress(now)
        del self.inflight[seq]
        self.device.end_work()
        if not self.inflight:
            self.clock_mhz = self.device.clock_mhz()
        return run.request, now - run.start_s


def _arrivals(cfg: SimConfig, profile: GpuProfile, rng: np.random.Generator) -> FloatArray:
    if cfg.arrival == "trace":
        if cfg.trace is None:
            raise ValueError("arrival 'trace' needs a trace file")
        return trace_arrivals(cfg.trace)
    rate = cfg.rate(profile)
    if cfg.arrival == "bursty":
        return bursty_arrivals(rate, cfg.duration_s, rng)
    if cfg.arrival == "poisson":
        return poisson_arrivals(rate, cfg.duration_s, rng)
    raise ValueError(f"unknown arrival process {cfg.arrival!r}; known: poisson, bursty, trace")


def simulate(cfg: SimConfig, table: Time2ClockTable | None = None) -> SimResult:
    """Run one simulation; deterministic for a given config (seed included)."""
    profile = get_profile(cfg.gpu)
    rng = np.random.default_rng(cfg.seed)
    arrival_rng, client_rng, device_rng = (
        np.random.default_rng(s) for s in rng.integers(0, 2**63, 3)
    )
    arrivals = _arrivals(cfg, profile, arrival_rng)
    who = assign_clients(len(arrivals), list(cfg.clients), client_rng)
    client_slos_ms = np.array([c.slo_ms or cfg.slo_ms for c in cfg.clients])
    slos_ms = client_slos_ms[who] if len(arrivals) else np.zeros(0)

    table = table or profiled_table(cfg.gpu, 0, cfg.profile_requests_per_clock)
    vt = VirtualTime()
    device = SimulatedDevice(profile, time_source=vt, rng=device_rng)
    policy = make_policy(cfg.policy, table, device.supported_clocks_mhz(), cfg.slack)
    sched = Scheduler(
        table,
        policy,
        SchedulerConfig(
            max_inflight=cfg.max_inflight,
            max_queue=cfg.max_queue,
            priority_levels=cfg.priority_levels,
            default_slo_ms=cfg.slo_ms,
        ),
    )

    initial = policy.initial_clock_mhz()
    if initial is None:
        device.reset()
    else:
        device.set_clock_mhz(initial)

    stats = {c.name: ClientStats() for c in cfg.clients}
    latencies: list[float] = []
    met = rejected = events = 0
    heap: list[tuple[float, int, int, Any]] = [
        (float(t), _ARRIVAL, i, None) for i, t in enumerate(arrivals)
    ]
    heapq.heapify(heap)
    seq = len(arrivals)
    timer_at: float | None = None
    gpu = _GpuWork(profile, device)

    def push(t: float, kind: int, payload: Any) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, kind, seq, payload))
        seq += 1

    def after_clock_request(now: float) -> None:
        """Schedule the moment a requested clock change lands, so in-flight work speeds up."""
        pending = device.pending_change()
        if pending is not None and gpu.inflight:
            push(pending[0], _CLOCK, None)

    def apply(clock: int | None, now: float) -> None:
        if clock is not None:
            device.set_clock_mhz(clock)
            after_clock_request(now)

    def dispatch(now: float) -> None:
        while (d := sched.next_dispatch(now)) is not None:
            apply(d.clock_mhz, now)
            gpu.start(d.request, now)
            after_clock_request(now)
            for t_end, key in gpu.completions():
                push(t_end, _COMPLETE, key)

    while heap:
        now, kind, idx, payload = heapq.heappop(heap)
        vt.advance_to(now)
        events += 1
        if kind == _ARRIVAL:
            client = cfg.clients[who[idx]]
            req = Request(
                model="inception-sim",
                arrival_s=now,
                slo_ms=float(slos_ms[idx]),
                priority=client.priority,
                nice=client.nice,
                client_id=client.name,
            )
            result = sched.enqueue(req, now)
            if not result.accepted:
                rejected += 1
                stats[client.name].rejected += 1
            apply(result.clock_mhz, now)
        elif kind == _COMPLETE:
            done = gpu.finish(payload, now)
            if done is None:
                continue  # rescheduled after a clock change
            req, service_s = done
            apply(sched.on_complete(req, service_s, now).clock_mhz, now)
            latency_ms = (now - req.arrival_s) * 1000.0
            latencies.append(latency_ms)
            s = stats[req.client_id]
            s.completed += 1
            s.latencies_ms.append(latency_ms)
            s.service_ms += service_s * 1000.0
            if latency_ms <= req.slo_ms:
                met += 1
                s.met += 1
        elif kind == _CLOCK:
            for t_end, key in gpu.clock_landed(now):
                push(t_end, _COMPLETE, key)
        else:
            timer_at = None
            apply(sched.poll(now), now)
        dispatch(now)
        wake = sched.wake_at_s()
        if wake is not None and wake != timer_at:
            timer_at = max(wake, now)
            push(timer_at, _TIMER, None)

    span_s = max(cfg.duration_s, vt())
    vt.advance_to(span_s)
    dev_stats = device.stats()
    oracle = None
    if cfg.with_oracle and len(arrivals):
        oracle = oracle_energy(
            profile, arrivals, arrivals + slos_ms / 1000.0, span_s, cfg.max_inflight
        ).energy_j
    return SimResult(
        config=cfg,
        requests=len(arrivals),
        completed=len(latencies),
        rejected=rejected,
        span_s=span_s,
        energy_j=dev_stats.energy_j,
        oracle_energy_j=oracle,
        latencies_ms=np.asarray(latencies),
        met=met,
        clock_changes=dev_stats.clock_changes,
        mean_clock_mhz=dev_stats.clock_mhz_s / span_s,
        clients=stats,
        events=events,
    )
