"""Discrete-event simulation: the scheduler core, in virtual time, driving a SimulatedDevice.

The same :class:`scheduler.core.Scheduler` the gateway runs makes every decision; the simulator
only plays the GPU (service times drawn from the device at the clock in force, energy from its
counter) and the clients (arrivals). Everything random comes from one seed. Here: the run's
configuration, its results, the emulated Triton; the event loop, for one GPU or a node of
several, is :mod:`simulator.node`'s.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from dvfs.profiles import CNN, GpuProfile, ModelProfile, get_profile
from dvfs.simulated import SimulatedDevice, shared_time_ms
from scheduler.clients import ClientSpec
from scheduler.config import PolicyConfig
from scheduler.core import SchedulerConfig
from scheduler.feedback import FeedbackParams
from scheduler.isolation import ClientUsage, IsolationReport, isolation
from scheduler.placement import PlacementParams
from scheduler.policies import SlackParams
from scheduler.request import Request
from scheduler.view import ModelServing
from simulator.workload import (
    DayCycle,
    FloatArray,
    bursty_arrivals,
    day_arrivals,
    poisson_arrivals,
    trace_arrivals,
)
from time2clock.fit import fit_model_table
from time2clock.online import OnlineTables
from time2clock.profile import SimulatedMeasurer, sweep
from time2clock.table import TableSet


@dataclass(frozen=True)
class ModelMix:
    """One model in the simulated traffic: its share of the arrivals and its SLO (None: the
    run's ``slo_ms``)."""

    name: str
    share: float = 1.0
    slo_ms: float | None = None


def parse_models(spec: str) -> tuple[ModelMix, ...]:
    """``"resnet50:0.7,bert-large:0.3"`` (shares, normalised) or ``"resnet50:0.7:60,..."``
    (share and SLO in ms)."""
    mixes = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, *rest = part.split(":")
        try:
            share = float(rest[0]) if rest else 1.0
            slo = float(rest[1]) if len(rest) > 1 else None
        except ValueError:
            raise ValueError(
                f"model {name!r}: share and SLO must be numbers, got {part!r}"
            ) from None
        if share <= 0 or (slo is not None and slo <= 0):
            raise ValueError(f"model {name!r}: share and SLO must be > 0")
        mixes.append(ModelMix(name, share, slo))
    if not mixes:
        raise ValueError("no models in spec")
    total = sum(m.share for m in mixes)
    return tuple(ModelMix(m.name, m.share / total, m.slo_ms) for m in mixes)


@dataclass(frozen=True)
class SimConfig:
    """One simulation run.

    ``load`` is a fraction of what the top clock holds for this mix, its SLOs and its Triton
    setup (:func:`top_clock_capacity_rps`, unless ``capacity_rps`` gives it); ``rate_rps``
    sets the rate instead. For ``arrival="day"`` either is the highest rate the day reaches
    (:class:`simulator.workload.DayCycle`). Triton runs each model with ``instances``
    instances and its dynamic batcher (largest batch: the model's, ``batcher_delay_ms`` of
    waiting for a fuller one, ``triton_priority_levels`` priority levels, the sidecar's level
    sent as each request's priority, as the embedded models are configured; 0: first come,
    first served); ``max_inflight`` caps what the sidecar keeps at Triton.

    ``gpus`` > 1: a node of that many GPUs (:mod:`simulator.node`), ``load`` a fraction of
    ``gpus`` times what one GPU's top clock holds, ``placement`` choosing each request's GPU.
    """

    gpu: str = "v100"
    policy: str = PolicyConfig.name
    slo_ms: float = SchedulerConfig.default_slo_ms
    duration_s: float = 30.0
    seed: int = 0
    load: float | None = 0.5
    rate_rps: float | None = None
    capacity_rps: float | None = None  # what ``load`` is a fraction of (None: measured)
    arrival: str = "poisson"  # poisson | bursty | day | trace
    day: DayCycle = field(default_factory=DayCycle)
    trace: Path | None = None
    clients: tuple[ClientSpec, ...] = (ClientSpec("default"),)
    models: tuple[ModelMix, ...] = (ModelMix(CNN),)
    instances: int = 2
    batcher_delay_ms: float = 0.0
    triton_priority_levels: int = 2  # each model's dynamic_batching.priority_levels (0: FIFO)
    max_inflight: int = SchedulerConfig.max_inflight
    max_queue: int = SchedulerConfig.max_queue
    priority_levels: int = SchedulerConfig.priority_levels
    triton_batches: int = SchedulerConfig.triton_batches
    triton_batches_alone: int = SchedulerConfig.triton_batches_alone
    slo_multiplier: float | None = None  # what set the models' SLOs, for reports
    profile_requests_per_clock: int = 20
    with_oracle: bool = True
    slack: SlackParams = field(default_factory=SlackParams)
    feedback: FeedbackParams = field(default_factory=FeedbackParams)
    learn: bool = False  # refit the tables online from what the run measures
    gpus: int = 1
    placement: PlacementParams = field(default_factory=PlacementParams)
    clock_change_ms: float | None = None  # the GPU's clock-change delay (None: its profile's)

    @property
    def gpu_profile(self) -> GpuProfile:
        """The GPU's profile, with ``clock_change_ms`` in place of its clock-change delay."""
        profile = get_profile(self.gpu)
        if self.clock_change_ms is None:
            return profile
        if not self.clock_change_ms >= 0:
            raise ValueError(f"clock_change_ms must be >= 0, got {self.clock_change_ms}")
        return replace(profile, clock_change_delay_s=self.clock_change_ms / 1000.0)

    @property
    def scheduler_config(self) -> SchedulerConfig:
        """The scheduler's bounds, as the live sidecar's :class:`SchedulerConfig` has them."""
        return SchedulerConfig(
            max_inflight=self.max_inflight,
            max_queue=self.max_queue,
            priority_levels=self.priority_levels,
            triton_batches=self.triton_batches,
            triton_batches_alone=self.triton_batches_alone,
            default_slo_ms=self.slo_ms,
        )

    @property
    def policy_config(self) -> PolicyConfig:
        """The policy and its parameters, as the live sidecar's :class:`PolicyConfig` has them."""
        return PolicyConfig(self.policy, self.slack, self.feedback)

    def rate(self) -> float:
        """Requests per second: the Poisson rate, or the highest rate of a day."""
        if self.rate_rps is not None:
            return self.rate_rps
        assert self.load is not None
        capacity = self.capacity_rps or top_clock_capacity_rps(self)
        return self.load * self.gpus * capacity

    def model_slo_ms(self, mix: ModelMix) -> float:
        return mix.slo_ms if mix.slo_ms is not None else self.slo_ms


def mix_capacity_rps(profile: GpuProfile, models: Sequence[ModelMix]) -> float:
    """Requests per second the GPU would sustain at its top clock if every execution were a
    full batch, for this mix: an upper bound that Triton's batcher reaches only when queues
    are long (a bound, not what ``load`` counts; see :func:`top_clock_capacity_rps`)."""
    return 1.0 / sum(m.share / profile.model(m.name).capacity_rps() for m in models)


CAPACITY_DURATION_S = 20.0
CAPACITY_STEPS = 8


def top_clock_capacity_rps(cfg: SimConfig) -> float:
    """The highest Poisson rate at which the top clock (``max``) keeps every model's p99 within
    its SLO: what ``load`` 1 means.

    Measured as perf_analyzer measures a server's throughput under a latency limit: the same
    mix, SLOs, clients and Triton setup, Poisson arrivals for ``CAPACITY_DURATION_S`` (seed
    0), bisected over the rate (``CAPACITY_STEPS`` runs, to 1/256 of the full-batch bound
    :func:`mix_capacity_rps`). The bound caps it: where the SLO leaves room for more (a loose
    one, or none), load 1 is the bound, although two batches at Triton, instances side by
    side, may serve a little more. Counting capacity in full batches instead overstates it: at
    moderate load Triton's batcher forms batches of a few requests and the models time-share
    the GPU in small executions, so "0.9 of full-batch capacity" overloads the GPU at any
    clock. Cached per process.
    """
    key = replace(
        cfg,
        policy="max",
        load=None,
        rate_rps=None,
        capacity_rps=None,
        arrival="poisson",
        trace=None,
        day=DayCycle(),
        seed=0,
        duration_s=CAPACITY_DURATION_S,
        with_oracle=False,
        learn=False,
        slack=SlackParams(),
        feedback=FeedbackParams(),
        slo_multiplier=None,
        gpus=1,
        placement=PlacementParams(),
    )
    return _capacity(key)


@lru_cache(maxsize=256)
def _capacity(key: SimConfig) -> float:
    bound = mix_capacity_rps(get_profile(key.gpu), key.models)

    def meets(rate: float) -> bool:
        return bool(simulate(replace(key, rate_rps=rate)).p99_over_slo() <= 1.0)

    lo, hi = 0.0, bound  # lo meets the SLO (trivially at 0), hi is at or past the knee
    for _ in range(CAPACITY_STEPS):
        mid = (lo + hi) / 2
        if meets(mid):
            lo = mid
        else:
            hi = mid
    if lo == 0.0:
        raise ValueError(
            f"the top clock of {key.gpu} misses these SLOs even at {hi:.2f} req/s: "
            "give the rate (--rate) instead of a load"
        )
    return lo


PROFILE_BATCHES = (1, 2, 4, 8, 16, 32)


@lru_cache(maxsize=32)
def profiled_tables(
    gpu: str, models: tuple[str, ...] = (CNN,), seed: int = 0, requests_per_clock: int = 20
) -> TableSet:
    """The time2clock tables the scheduler would have: seed 003's sweep of the simulated GPU
    (every clock, each batch size up to the model's largest, one execution at a time), not
    the ground truth."""
    tables = TableSet()
    for i, model in enumerate(models):
        sim = SimulatedMeasurer.for_profile(gpu, seed=10_000 + seed + 97 * i, model=model)
        max_batch = sim.device.profile.model(model).max_batch
        batches = [b for b in PROFILE_BATCHES if b <= max_batch]
        result = sweep(
            sim.device,
            sim,
            sim.device.supported_clocks_mhz(),
            batches=batches,
            requests_per_clock=requests_per_clock,
            concurrency=1,
        )
        tables.add(
            fit_model_table(
                result.samples,
                trim=0.2,
                gpu=gpu,
                model=model,
                concurrency=1,
                energy_j=result.energy_per_inference_j,
            )
        )
    return tables


@dataclass
class ClientStats:
    completed: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    met: int = 0
    service_ms: float = 0.0
    rejected: int = 0
    offered_work_ms: float = 0.0  # what it sent while arrivals ran, in GPU time (see isolation)
    served_work_ms: float = 0.0  # what was served of it by then


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
    clairvoyant_energy_j: float | None
    latencies_ms: FloatArray
    met: int
    clock_changes: int
    mean_clock_mhz: float
    clients: dict[str, ClientStats]
    models: dict[str, ClientStats]
    batches: int
    events: int

    def _pct(self, q: float, values: FloatArray | None = None) -> float:
        data = self.latencies_ms if values is None else values
        return float(np.percentile(data, q)) if len(data) else math.nan

    def p99_over_slo(self) -> float:
        """The worst model's p99 over its SLO (> 1: some model missed its p99 SLO)."""
        worst = math.nan
        for mix in self.config.models:
            s = self.models[mix.name]
            if s.completed:
                ratio = self._pct(99, np.asarray(s.latencies_ms)) / self.config.model_slo_ms(mix)
                worst = ratio if math.isnan(worst) else max(worst, ratio)
        return worst

    def misses_past_p99(self) -> float:
        """The worst model's requests over its SLO less the 1% its p99 may leave over it:
        positive, that many requests too many; negative, the room still left (nan: none
        completed). It says by how many requests a p99 over or under the SLO was decided."""
        past = [
            (s.completed - s.met) - 0.01 * s.completed
            for s in (self.models[m.name] for m in self.config.models)
            if s.completed
        ]
        return max(past, default=math.nan)

    def isolation(self) -> IsolationReport:
        """Seed 000's isolation metric over the clients (:mod:`scheduler.isolation`): GPU work
        served while arrivals ran (the drain after them serves every backlog to the end, which
        no fair share decides), against the same work shared by ideal CFS with what each client
        offered as its demand."""
        c = self.config
        levels = SchedulerConfig(priority_levels=c.priority_levels)
        return isolation(
            [
                ClientUsage(
                    spec.name,
                    levels.level_of(spec.priority),
                    spec.nice,
                    self.clients[spec.name].served_work_ms,
                    self.clients[spec.name].offered_work_ms,
                )
                for spec in c.clients
            ]
        )

    def to_json(self) -> dict[str, Any]:
        c = self.config
        iso = self.isolation()
        shares = {share.name: share for share in iso.clients}
        return {
            "policy": c.policy,
            "gpu": c.gpu,
            "mix": ",".join(f"{m.name}:{m.share:g}" for m in c.models),
            "slo_ms": c.slo_ms,
            "slo_mult": c.slo_multiplier,
            "load": c.load if c.rate_rps is None else None,
            "rate_rps": c.rate(),
            "arrival": c.arrival if c.arrival != "day" else f"day:{c.day.shape}",
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
            "clairvoyant_energy_j": self.clairvoyant_energy_j,
            "p50_ms": self._pct(50),
            "p90_ms": self._pct(90),
            "p99_ms": self._pct(99),
            "slo_attainment": self.met / self.completed if self.completed else math.nan,
            "p99_over_slo": self.p99_over_slo(),
            "misses_past_p99": self.misses_past_p99(),
            "mean_batch": self.completed / self.batches if self.batches else math.nan,
            "clock_changes": self.clock_changes,
            "mean_clock_mhz": self.mean_clock_mhz,
            "models": {
                name: {
                    "completed": s.completed,
                    "rejected": s.rejected,
                    "slo_ms": c.model_slo_ms(mix),
                    "p99_ms": self._pct(99, np.asarray(s.latencies_ms)),
                    "slo_attainment": s.met / s.completed if s.completed else math.nan,
                }
                for mix in c.models
                for name, s in [(mix.name, self.models[mix.name])]
            },
            "clients": {
                name: {
                    "completed": s.completed,
                    "rejected": s.rejected,
                    "p99_ms": self._pct(99, np.asarray(s.latencies_ms)),
                    "slo_attainment": s.met / s.completed if s.completed else math.nan,
                    "service_ms": s.service_ms,
                    "dct_over_ideal": iso.ratio_of(name),
                    # GPU time served while arrivals ran, and ideal CFS's share of it
                    "level": shares[name].level,
                    "nice": shares[name].nice,
                    "served_work_ms": shares[name].served,
                    "ideal_work_ms": shares[name].ideal,
                }
                for name, s in self.clients.items()
            },
            "isolation_deviation": iso.deviation,
        }


@dataclass
class _Execution:
    """One batch running on the GPU."""

    model: ModelProfile
    requests: list[Request[None]]
    start_s: float
    work: float  # its drawn time over its mean time (the noise draw)
    done: float = 0.0  # fraction of its work done
    since_s: float = 0.0
    version: int = 0


class _Triton:
    """Triton on the simulated GPU: per model, a queue, its dynamic batcher and ``instances``
    instances. Batches running at once share the GPU as :func:`dvfs.simulated.shared_time_ms`
    says; when the clock, or that sharing, changes mid-way, the rest of each batch's work goes
    at the new speed. With ``priority_levels`` the queue is Triton's priority queue: a request
    goes ahead of every waiting one of a lower priority (a larger number), behind those of its
    own, and batches are formed from the front; a running batch is never preempted.
    """

    def __init__(
        self,
        profile: GpuProfile,
        device: SimulatedDevice,
        instances: int,
        serving: dict[str, ModelServing] | None = None,
    ) -> None:
        self.profile = profile
        self.device = device
        self.instances = instances
        self.serving = serving or {}
        self.running: dict[int, _Execution] = {}
        self.busy: dict[str, int] = {}
        self.requests_running: dict[str, int] = {}
        self.queues: dict[str, deque[Request[None]]] = {}
        self.clock_mhz = device.clock_mhz()
        self._next_id = 0

    def _time_ms(self, run: _Execution) -> float:
        """How long ``run`` would take in all at the present speed."""
        models = sum(1 for n in self.requests_running.values() if n)
        running = self.requests_running[run.model.name]
        batch = len(run.requests)
        return run.work * shared_time_ms(run.model, self.clock_mhz, batch, running, models)

    def _progress(self, now: float) -> None:
        for run in self.running.values():
            run.done += (now - run.since_s) * 1000.0 / self._time_ms(run)
            run.since_s = now

    def release(self, request: Request[None]) -> None:
        queue = self.queues.setdefault(request.model, deque())
        serving = self.serving.get(request.model)
        priority = None if serving is None else serving.triton_priority(request.level)
        if priority is None:
            queue.append(request)
            return
        at = len(queue)
        while at and self._priority(queue[at - 1]) > priority:
            at -= 1
        queue.insert(at, request)

    def _priority(self, request: Request[None]) -> int:
        priority = self.serving[request.model].triton_priority(request.level)
        assert priority is not None
        return priority

    def start_batches(self, now: float) -> bool:
        """Every free instance takes a batch of what waits for it; whether any started."""
        started = False
        for model, queue in self.queues.items():
            largest = self.profile.model(model).max_batch
            while queue and self.busy.get(model, 0) < self.instances:
                batch = [queue.popleft() for _ in range(min(largest, len(queue)))]
                self._start(model, batch, now)
                started = True
        return started

    def _start(self, name: str, batch: list[Request[None]], now: float) -> None:
        self._progress(now)
        model = self.profile.model(name)
        self.device.begin_work(name, len(batch))
        self.clock_mhz = self.device.clock_mhz()
        sample_ms = self.device.sample_latency_ms(self.clock_mhz, model=name, batch=len(batch))
        work = sample_ms / model.mean_latency_ms(self.clock_mhz, len(batch))
        self.running[self._next_id] = _Execution(model, batch, now, work, since_s=now)
        self._next_id += 1
        self.busy[name] = self.busy.get(name, 0) + 1
        self.requests_running[name] = self.requests_running.get(name, 0) + len(batch)

    def completions(self) -> list[tuple[float, tuple[int, int]]]:
        """(end time, key) for every running execution, each with a fresh version."""
        out = []
        for key, run in self.running.items():
            run.version += 1
            left_s = max(0.0, 1.0 - run.done) * self._time_ms(run) / 1000.0
            out.append((run.since_s + left_s, (key, run.version)))
        return out

    def clock_landed(self, now: float) -> list[tuple[float, tuple[int, int]]]:
        self._progress(now)
        clock = self.device.clock_mhz()
        if clock == self.clock_mhz:
            return []
        self.clock_mhz = clock
        return self.completions()

    def finish(self, key: tuple[int, int], now: float) -> _Execution | None:
        ident, version = key
        run = self.running.get(ident)
        if run is None or run.version != version:
            return None
        self._progress(now)
        del self.running[ident]
        name = run.model.name
        self.busy[name] -= 1
        self.requests_running[name] -= len(run.requests)
        self.device.end_work(name, len(run.requests))
        if not self.running:
            self.clock_mhz = self.device.clock_mhz()
        return run


ARRIVALS = ("poisson", "bursty", "day", "trace")


def _arrivals(cfg: SimConfig, rng: np.random.Generator) -> FloatArray:
    if cfg.arrival == "trace":
        if cfg.trace is None:
            raise ValueError("arrival 'trace' needs a trace file")
        return trace_arrivals(cfg.trace)
    if cfg.arrival not in ARRIVALS:
        raise ValueError(f"unknown arrival process {cfg.arrival!r}; known: {', '.join(ARRIVALS)}")
    rate = cfg.rate()
    if cfg.arrival == "bursty":
        return bursty_arrivals(rate, cfg.duration_s, rng)
    if cfg.arrival == "day":
        return day_arrivals(rate, cfg.duration_s, cfg.day, rng)
    return poisson_arrivals(rate, cfg.duration_s, rng)


def simulate(
    cfg: SimConfig, tables: TableSet | None = None, learner: OnlineTables | None = None
) -> SimResult:
    """Run one simulation; deterministic for a given config (seed included). ``learner``: the
    online fit to use when ``cfg.learn`` (default: a fresh one). One event loop serves one GPU
    and a node of several: :func:`simulator.node.simulate_node`."""
    from simulator.node import simulate_node  # it imports this module's parts

    return simulate_node(cfg, tables, learner)
