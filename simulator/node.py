"""A node of several simulated GPUs behind one sidecar, in one virtual-time event loop.

Each GPU is what :func:`simulator.simulate.simulate` runs for one: its own
:class:`scheduler.core.Scheduler` (queue, clock policy, tables), its own
:class:`dvfs.simulated.SimulatedDevice` and its own emulated Triton. The queues share one
:class:`scheduler.queue.VruntimeLedger` (a client's share is counted over the node), and a
:class:`scheduler.placement.Placer` picks the GPU of each arrival, as the live sidecar does.

With one GPU the run is the same, event for event and draw for draw, as
:func:`simulator.simulate.simulate`'s (a test holds them together).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dvfs.energy import EnergyCounter
from dvfs.simulated import SimulatedDevice
from dvfs.timesource import VirtualTime
from scheduler.changedelay import ChangeDelays
from scheduler.core import Scheduler
from scheduler.placement import Placer
from scheduler.queue import VruntimeLedger
from scheduler.request import Request
from scheduler.view import ModelServing
from simulator.oracle import oracle_energy
from simulator.simulate import (
    ClientStats,
    SimConfig,
    SimResult,
    _arrivals,
    _Triton,
    profiled_tables,
)
from simulator.workload import assign_clients
from time2clock.online import OnlineTables
from time2clock.table import TableSet

# At equal times: clock changes land, then completions, timers, arrivals, energy counter reads.
_CLOCK, _COMPLETE, _TIMER, _ARRIVAL, _ENERGY = 0, 1, 2, 3, 4
BUSY_SHARE = 0.05  # a GPU busy at least this share of the run counts as used


@dataclass
class GpuStats:
    """What one GPU of the node did."""

    placed: int = 0
    completed: int = 0
    batches: int = 0
    energy_j: float = 0.0
    mean_clock_mhz: float = 0.0
    clock_changes: int = 0
    busy_s: float = 0.0


@dataclass
class NodeResult(SimResult):
    """A node's run: the whole node's figures as :class:`SimResult` has them (seed 000's
    isolation metric over the node's clients included), and what each GPU did."""

    per_gpu: list[GpuStats] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        c = self.config
        out["gpus"] = c.gpus
        out["placement"] = c.placement.mode
        out["gpus_used"] = int(sum(g.busy_s >= BUSY_SHARE * self.span_s for g in self.per_gpu))
        out["per_gpu"] = [
            {
                "placed": g.placed,
                "completed": g.completed,
                "mean_batch": g.completed / g.batches if g.batches else math.nan,
                "energy_j": g.energy_j,
                "mean_clock_mhz": g.mean_clock_mhz,
                "clock_changes": g.clock_changes,
                "busy_share": g.busy_s / self.span_s if self.span_s else math.nan,
            }
            for g in self.per_gpu
        ]
        return out


class _Gpu:
    """One GPU of the node: its device, scheduler and emulated Triton, and its timers."""

    def __init__(
        self,
        index: int,
        device: SimulatedDevice,
        sched: Scheduler[None],
        triton: _Triton,
        vt: VirtualTime,
    ) -> None:
        self.index = index
        self.device = device
        self.sched = sched
        self.triton = triton
        self.vt = vt
        # The raises timed, as the live sidecar times them (scheduler.changedelay).
        self.delays = ChangeDelays()
        self.delays.plan_for(sched.policy)  # nothing learned yet: timing on or off
        self.applied_mhz: int | None = None
        self.timer_at: float | None = None
        self.batcher_at: float | None = None
        # Learning: the device's energy counter, read every ``poll_s`` as the live reader does.
        # Not the GPU's busy time: in virtual time the GPU runs exactly while a request is at
        # Triton, so there is no host part to measure.
        self.counter = (
            EnergyCounter(device.energy_j, vt)
            if sched.learner is not None and sched.learner.energy is not None
            else None
        )
        self.stats = GpuStats()

    def set_clock(self, clock_mhz: int) -> None:
        """Lock ``clock_mhz``. A raise is timed now and then, as the live sidecar times it
        (:class:`api.dispatcher.ClockApplier`), with the moment the simulated GPU lands it (what
        a reading polled without pause shows; a raise is never cut short by the next change
        here, which live one in a few may be), and the policy plans with what was learned."""
        now_s = self.vt()
        previous, self.applied_mhz = self.applied_mhz, clock_mhz
        delays = self.delays
        time_it = delays.wants(now_s, previous, clock_mhz) and self.device.clock_mhz() != clock_mhz
        self.device.set_clock_mhz(clock_mhz)
        if not time_it:
            return
        delays.started(now_s)
        pending = self.device.pending_change()
        if pending is not None and pending[1] == clock_mhz:
            delays.landed((pending[0] - now_s) * 1000.0)
        else:
            delays.missed(now_s)
        delays.plan_for(self.sched.policy)


def run(cfg: SimConfig) -> SimResult:
    """``cfg`` simulated (on ``cfg.gpus`` GPUs)."""
    return simulate_node(cfg)


def simulate_node(
    cfg: SimConfig, tables: TableSet | None = None, learner: OnlineTables | None = None
) -> NodeResult:
    """Run one node of ``cfg.gpus`` identical GPUs; deterministic for a given config (seed
    included). ``learner``: GPU 0's online fit when ``cfg.learn`` (default: a fresh one; the
    other GPUs get fresh ones).

    Every GPU uses the same profiled tables (they are the same model of GPU). The oracles bound
    one GPU's energy, not a node's: with several GPUs they are not computed (None)."""
    if cfg.gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {cfg.gpus}")
    profile = cfg.gpu_profile
    rng = np.random.default_rng(cfg.seed)
    arrival_rng, client_rng, device_rng = (
        np.random.default_rng(s) for s in rng.integers(0, 2**63, 3)
    )
    model_rng = np.random.default_rng(int(rng.integers(0, 2**63)))
    arrivals = _arrivals(cfg, arrival_rng)
    who = assign_clients(len(arrivals), list(cfg.clients), client_rng)
    which = model_rng.choice(len(cfg.models), size=len(arrivals), p=[m.share for m in cfg.models])
    client_slos = [c.slo_ms for c in cfg.clients]
    model_slos = [cfg.model_slo_ms(m) for m in cfg.models]
    slos_ms = np.array(
        [client_slos[c] or model_slos[m] for c, m in zip(who, which, strict=True)], dtype=float
    )

    names = tuple(m.name for m in cfg.models)
    serving = {
        n: ModelServing(
            profile.model(n).max_batch,
            cfg.instances,
            priority_levels=cfg.triton_priority_levels,
            default_priority_level=cfg.triton_priority_levels,
        )
        for n in names
    }
    tables = tables or profiled_tables(cfg.gpu, names, 0, cfg.profile_requests_per_clock)
    vt = VirtualTime()
    ledger = VruntimeLedger()
    # The GPU's idle power at its lowest and top clock, what a live sidecar reads from the
    # device at start (idle, locked low then high): adaptive's energy floor counts energy
    # above idle, and its idle clock weighs idling lower against waking up.
    policy_config = cfg.policy_config
    if policy_config.feedback.idle_power_w is None:
        policy_config = replace(
            policy_config,
            feedback=replace(
                policy_config.feedback,
                idle_power_w=profile.idle_power_w(profile.min_clock_mhz),
                idle_power_top_w=profile.idle_power_w(profile.max_clock_mhz),
            ),
        )
    sched_config = cfg.scheduler_config
    gpus: list[_Gpu] = []
    for i in range(cfg.gpus):
        # GPU 0 draws as a lone GPU does; the others from streams of their own.
        dev_rng = device_rng if i == 0 else np.random.default_rng([cfg.seed, 7919, i])
        device = SimulatedDevice(profile, index=i, time_source=vt, rng=dev_rng)
        clocks = device.supported_clocks_mhz()
        policy = policy_config.build(clocks)
        fit = None
        if cfg.learn:
            fit = (
                learner
                if learner is not None and i == 0
                else OnlineTables(clocks, gpu=cfg.gpu, base=tables)
            )
        sched: Scheduler[None] = Scheduler(
            tables, policy, sched_config, serving=serving, learner=fit, ledger=ledger
        )
        initial = policy.initial_clock_mhz()
        triton = _Triton(profile, device, cfg.instances, serving)
        gpus.append(_Gpu(i, device, sched, triton, vt))
        if initial is None:
            device.reset()
        else:
            gpus[-1].set_clock(initial)
    placer = Placer(cfg.placement, idle_w=[profile.idle_w] * cfg.gpus, default_slo_ms=cfg.slo_ms)
    schedulers = [g.sched for g in gpus]

    stats = {c.name: ClientStats() for c in cfg.clients}
    arrivals_end_s = float(arrivals[-1]) if len(arrivals) else 0.0
    # GPU time per request of each model, in full batches at the top clock (isolation's unit)
    work_ms = {
        n: profile.model(n).mean_latency_ms(profile.max_clock_mhz, profile.model(n).max_batch)
        / profile.model(n).max_batch
        for n in names
    }
    per_model = {n: ClientStats() for n in names}
    latencies: list[float] = []
    work = np.ones(len(arrivals))  # each request's drawn service time over its mean
    index_of: dict[tuple[int, int], int] = {}  # (gpu, request seq) -> its arrival's index
    met = rejected = events = batches = 0
    heap: list[tuple[float, int, int, int, Any]] = [
        (float(t), _ARRIVAL, i, 0, None) for i, t in enumerate(arrivals)
    ]
    heapq.heapify(heap)
    seq = len(arrivals)

    def push(t: float, kind: int, gpu: _Gpu, payload: Any) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, kind, seq, gpu.index, payload))
        seq += 1

    for gpu in gpus:
        if gpu.counter is not None:
            push(0.0, _ENERGY, gpu, None)

    def after_clock_request(gpu: _Gpu) -> None:
        """Schedule the moment a requested clock change lands, so running work speeds up."""
        pending = gpu.device.pending_change()
        if pending is not None and gpu.triton.running:
            push(pending[0], _CLOCK, gpu, None)

    def apply(gpu: _Gpu, clock: int | None) -> None:
        if clock is not None:
            gpu.set_clock(clock)
            after_clock_request(gpu)

    def dispatch(gpu: _Gpu, now: float) -> None:
        triton = gpu.triton
        while (d := gpu.sched.next_dispatch(now)) is not None:
            apply(gpu, d.clock_mhz)
            triton.release(d.request)
        if cfg.batcher_delay_ms > 0 and any(triton.queues.values()):
            # Triton's batcher waits up to its delay for a fuller batch (not past it).
            oldest = min(q[0].dispatch_s for q in triton.queues.values() if q)
            due = oldest + cfg.batcher_delay_ms / 1000.0
            if now < due:
                if gpu.batcher_at != due:
                    gpu.batcher_at = due
                    push(due, _TIMER, gpu, "batcher")
                return
        if triton.start_batches(now):
            after_clock_request(gpu)
            for t_end, key in triton.completions():
                push(t_end, _COMPLETE, gpu, key)

    while heap:
        now, kind, idx, at, payload = heapq.heappop(heap)
        vt.advance_to(now)
        gpu = gpus[at]
        if kind == _ENERGY:
            energy = gpu.sched.learner.energy if gpu.sched.learner is not None else None
            assert gpu.counter is not None and energy is not None
            gpu.sched.on_energy(gpu.counter.read(), gpu.counter.update_interval_s)
            if heap:  # while anything else is to come
                push(now + energy.params.poll_s, _ENERGY, gpu, None)
            continue
        events += 1
        if kind == _ARRIVAL:
            client = cfg.clients[who[idx]]
            req: Request[None] = Request(
                model=names[which[idx]],
                arrival_s=now,
                slo_ms=float(slos_ms[idx]),
                priority=client.priority,
                nice=client.nice,
                client_id=client.name,
            )
            stats[client.name].offered_work_ms += work_ms[req.model]
            if len(gpus) > 1:
                req.level = sched_config.level_of(req.priority)
                gpu = gpus[placer.place(schedulers, req, now)]
            gpu.stats.placed += 1
            result = gpu.sched.enqueue(req, now)
            if result.accepted:
                index_of[(gpu.index, req.seq)] = idx
            else:
                rejected += 1
                stats[client.name].rejected += 1
                per_model[req.model].rejected += 1
            apply(gpu, result.clock_mhz)
        elif kind == _COMPLETE:
            execution = gpu.triton.finish(payload, now)
            if execution is None:
                continue  # rescheduled after a clock or sharing change
            batches += 1
            gpu.stats.batches += 1
            for t_end, key in gpu.triton.completions():
                push(t_end, _COMPLETE, gpu, key)
            for req in execution.requests:
                work[index_of.pop((gpu.index, req.seq))] = execution.work
                service_s = now - req.dispatch_s
                apply(gpu, gpu.sched.on_complete(req, service_s, now).clock_mhz)
                latency_ms = (now - req.arrival_s) * 1000.0
                latencies.append(latency_ms)
                ok = latency_ms <= req.slo_ms
                met += ok
                gpu.stats.completed += 1
                if now <= arrivals_end_s:
                    stats[req.client_id].served_work_ms += work_ms[req.model]
                for s in (stats[req.client_id], per_model[req.model]):
                    s.completed += 1
                    s.latencies_ms.append(latency_ms)
                    s.service_ms += service_s * 1000.0
                    s.met += ok
        elif kind == _CLOCK:
            for t_end, key in gpu.triton.clock_landed(now):
                push(t_end, _COMPLETE, gpu, key)
        elif payload == "batcher":
            gpu.batcher_at = None
        else:
            gpu.timer_at = None
            apply(gpu, gpu.sched.poll(now))
        dispatch(gpu, now)
        wake = gpu.sched.wake_at_s()
        if wake is not None and wake != gpu.timer_at:
            gpu.timer_at = max(wake, now)
            push(gpu.timer_at, _TIMER, gpu, None)

    span_s = max(cfg.duration_s, vt())
    vt.advance_to(span_s)
    energy_j = clock_mhz_s = 0.0
    clock_changes = 0
    for gpu in gpus:
        dev = gpu.device.stats()
        gpu.stats.energy_j = dev.energy_j
        gpu.stats.mean_clock_mhz = dev.clock_mhz_s / span_s
        gpu.stats.clock_changes = dev.clock_changes
        gpu.stats.busy_s = dev.busy_s
        energy_j += dev.energy_j
        clock_mhz_s += dev.clock_mhz_s
        clock_changes += dev.clock_changes
    oracle = clairvoyant = None
    if cfg.gpus == 1 and cfg.with_oracle and len(arrivals):
        deadlines, models = arrivals + slos_ms / 1000.0, [names[w] for w in which]
        oracle = oracle_energy(profile, arrivals, deadlines, span_s, models).energy_j
        clairvoyant = oracle_energy(profile, arrivals, deadlines, span_s, models, work).energy_j
    return NodeResult(
        config=cfg,
        requests=len(arrivals),
        completed=len(latencies),
        rejected=rejected,
        span_s=span_s,
        energy_j=energy_j,
        oracle_energy_j=oracle,
        clairvoyant_energy_j=clairvoyant,
        latencies_ms=np.asarray(latencies),
        met=met,
        clock_changes=clock_changes,
        mean_clock_mhz=clock_mhz_s / span_s / cfg.gpus,
        clients=stats,
        models=per_model,
        batches=batches,
        events=events,
        per_gpu=[g.stats for g in gpus],
    )
