"""Generative workloads in the discrete-event simulator: an LLM engine that batches continuously,
driven in virtual time, under the GPU's own boost, locked clocks or the token policy.

The engine is :class:`dvfs.llm_engine.ContinuousBatchingEngine`, each iteration priced by
:mod:`dvfs.llm_profiles` at the clock in force (a clock change lands ``clock_change_s`` after it
is asked for, in the middle of an iteration if need be: the rest of its work goes at the new
clock). Each iteration's time carries a random factor (gamma, mean 1, ``noise_cv``). Energy is
the simulated GPU's power integrated over time, idle gaps at its idle power.

Requests: arrivals (Poisson at a share of the engine's capacity, or a rate that rises and falls
between two shares of it), prompt and output lengths drawn from a length mix. The mixes follow
Azure's public LLM inference traces (2023), whose medians Splitwise (Patel et al., ISCA 2024,
§III) reports: conversation, prompts of 1,020 tokens and outputs of 129; coding, 1,500 and 13.
Lengths are log-normal around those medians; their spread (σ of the log) is an assumption.

Policies: ``max`` (top clock locked), ``default`` (the GPU's own boost: top clock while busy,
bottom after ``idle_downclock_s`` idle), ``fixed:MHZ``, ``tokens`` (:mod:`scheduler.tokens`);
``best-fixed`` searches the single locked clock with the least energy per output token whose p99
TTFT and p99 TPOT meet the SLOs, on the same arrivals. All release every request to the engine
at once except ``tokens``, which holds requests above its admission limit; it decides after
every iteration and after every release, as the sidecar's core asks it.

The lower bound (:func:`energy_lower_bound`) is what any schedule of the same requests must
spend under the same laws, whatever its clocks, batching and SLOs (see its docstring).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from dvfs.llm_engine import ContinuousBatchingEngine, EngineLimits, Iteration
from dvfs.llm_profiles import LLM_GPUS, IterationWork, LlmProfile, get_llm_profile
from loadgen.generative import StreamRecord, TokenSloSpec, summarize
from scheduler.config import token_default, token_params
from scheduler.tokens import SEQ_BUCKETS, EnginePrior, TokenPolicy, TokenPolicyParams, TokenSlo
from simulator.bestfixed import cheapest_meeting
from simulator.pool import parallel_map
from simulator.workload import FloatArray, IntArray, poisson_arrivals
from time2clock.fit import trimmed_mean

BEST_FIXED = "best-fixed"
GEN_POLICIES = ("max", "default", "tokens")
VARYING = "varying"
# MLPerf Inference's Llama-3.1-8B interactive scenario (mlcommons/inference loadgen/mlperf.conf):
# p99 TTFT 500 ms, p99 TPOT 30 ms; its server scenario: 2,000 ms and 100 ms.
INTERACTIVE_SLO = TokenSlo(ttft_ms=500.0, tpot_ms=30.0)
SERVER_SLO = TokenSlo(ttft_ms=2000.0, tpot_ms=100.0)
PRIOR_CLOCK_STRIDE = 4  # the prior profile measures every 4th clock of the ladder
PRIOR_REPEATS = 20  # executions per (clock, batch) in the prior profile, as seed 003 measures
PRIOR_CONTEXT = 1024
PRIOR_PROMPT = 1024


@dataclass(frozen=True)
class LengthDist:
    """Log-normal prompt and output lengths (tokens) around medians, clipped to a range."""

    prompt_median: float
    output_median: float
    prompt_sigma: float = 0.9
    output_sigma: float = 0.9
    prompt_range: tuple[int, int] = (8, 8192)
    output_range: tuple[int, int] = (2, 2048)


LENGTH_MIXES: dict[str, tuple[tuple[float, LengthDist], ...]] = {
    "conversation": ((1.0, LengthDist(1020, 129)),),
    "coding": ((1.0, LengthDist(1500, 13)),),
    "mixed": ((0.5, LengthDist(1020, 129)), (0.5, LengthDist(1500, 13))),
}


def sample_lengths(mix: str, n: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
    """``n`` (prompt, output) token counts from the named mix."""
    try:
        parts = LENGTH_MIXES[mix]
    except KeyError:
        raise ValueError(f"unknown length mix {mix!r}; known: {', '.join(LENGTH_MIXES)}") from None
    shares = np.asarray([s for s, _ in parts], dtype=float)
    which = rng.choice(len(parts), size=n, p=shares / shares.sum())
    prompts = np.empty(n, dtype=np.int64)
    outputs = np.empty(n, dtype=np.int64)
    for i, (_, d) in enumerate(parts):
        mine = which == i
        k = int(mine.sum())
        p = rng.lognormal(math.log(d.prompt_median), d.prompt_sigma, k)
        o = rng.lognormal(math.log(d.output_median), d.output_sigma, k)
        prompts[mine] = np.clip(np.round(p), *d.prompt_range)
        outputs[mine] = np.clip(np.round(o), *d.output_range)
    return prompts, outputs


@lru_cache(maxsize=16)
def mix_means(mix: str) -> tuple[float, float]:
    """Mean prompt and output tokens of a mix (a fixed large sample: deterministic)."""
    prompts, outputs = sample_lengths(mix, 200_000, np.random.default_rng(0))
    return float(prompts.mean()), float(outputs.mean())


def capacity_rps(gpu: str, mix: str, max_seqs: int = 256) -> float:
    """Requests/s the engine sustains at the top clock on this mix (see
    :meth:`dvfs.llm_profiles.LlmProfile.capacity_rps`)."""
    prompt, output = mix_means(mix)
    return get_llm_profile(gpu).capacity_rps(prompt, output, max_seqs)


def varying_arrivals(
    capacity: float,
    duration_s: float,
    rng: np.random.Generator,
    *,
    low: float,
    high: float,
    cycles: float,
) -> FloatArray:
    """A Poisson process whose rate rises from ``low`` to ``high`` of ``capacity`` and back,
    ``cycles`` times over the run (raised cosine), by thinning."""
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high, got {low}, {high}")
    peak = capacity * high
    candidates = poisson_arrivals(peak, duration_s, rng)
    phase = 2.0 * math.pi * cycles * candidates / duration_s
    rate = capacity * (low + (high - low) * (1.0 - np.cos(phase)) / 2.0)
    keep = rng.random(len(candidates)) < rate / peak
    kept: FloatArray = candidates[keep]
    return kept


@dataclass(frozen=True)
class GenConfig:
    """One generative run. ``load``: a share of :func:`capacity_rps`, or the word ``varying``
    (from ``varying_low`` to ``varying_high`` of it, ``varying_cycles`` times)."""

    gpu: str = "h100"
    policy: str = "tokens"
    load: float | str = 0.3
    mix: str = "conversation"
    duration_s: float = 120.0
    seed: int = 0
    slo: TokenSlo = INTERACTIVE_SLO
    clock_change_s: float = 0.05
    noise_cv: float = 0.03
    max_seqs: int = 256
    max_batched_tokens: int = 2048
    varying_low: float = 0.1
    varying_high: float = 0.6
    varying_cycles: float = 2.0
    params: TokenPolicyParams = field(default_factory=TokenPolicyParams)

    @property
    def load_label(self) -> str:
        return self.load if isinstance(self.load, str) else f"{self.load:g}"


def _arrivals(cfg: GenConfig, rng: np.random.Generator) -> FloatArray:
    cap = capacity_rps(cfg.gpu, cfg.mix, cfg.max_seqs)
    if cfg.load == VARYING:
        return varying_arrivals(
            cap,
            cfg.duration_s,
            rng,
            low=cfg.varying_low,
            high=cfg.varying_high,
            cycles=cfg.varying_cycles,
        )
    if isinstance(cfg.load, str):
        raise ValueError(f"load must be a share of capacity or {VARYING!r}, got {cfg.load!r}")
    return poisson_arrivals(cfg.load * cap, cfg.duration_s, rng)


def workload(cfg: GenConfig) -> tuple[FloatArray, IntArray, IntArray]:
    """Arrival times and (prompt, output) lengths: the same for every policy of a cell."""
    rng = np.random.default_rng(cfg.seed)
    arrival_rng, length_rng = (np.random.default_rng(s) for s in rng.integers(0, 2**63, 2))
    arrivals = _arrivals(cfg, arrival_rng)
    prompts, outputs = sample_lengths(cfg.mix, len(arrivals), length_rng)
    return arrivals, prompts, outputs


class _GpuClock:
    """The clock of the simulated GPU: locked (changes land ``delay_s`` after the request) or
    the GPU's own boost (top clock ``boost_s`` after work starts, bottom after an idle spell)."""

    def __init__(self, profile: LlmProfile, *, locked_at: int | None, delay_s: float) -> None:
        gpu = profile.gpu
        self.profile = profile
        self.locked = locked_at is not None
        self.clock = locked_at if locked_at is not None else gpu.min_clock_mhz
        self.delay_s = delay_s
        self.pending: tuple[float, int] | None = None
        self.changes = 0
        self.idle_since_s: float | None = 0.0

    def request(self, clock_mhz: int, now_s: float) -> None:
        target = self.pending[1] if self.pending else self.clock
        if clock_mhz == target:
            return
        self.changes += 1
        self.pending = (now_s + self.delay_s, clock_mhz)

    def next_change_s(self) -> float | None:
        if self.pending is not None:
            return self.pending[0]
        idle_since = self.idle_since_s
        if not self.locked and idle_since is not None and self.clock > self.profile.min_clock_mhz:
            return idle_since + self.profile.gpu.idle_downclock_s
        return None

    def advance(self, now_s: float) -> None:
        """Apply every change due by ``now_s``."""
        while (at := self.next_change_s()) is not None and at <= now_s:
            if self.pending is not None:
                self.clock = self.pending[1]
                self.pending = None
            else:
                self.clock = self.profile.min_clock_mhz

    def busy(self, now_s: float) -> None:
        self.idle_since_s = None
        if not self.locked and self.clock < self.profile.max_clock_mhz and self.pending is None:
            boost_s = self.profile.gpu.clock_change_delay_s
            self.pending = (now_s + boost_s, self.profile.max_clock_mhz)

    def idle(self, now_s: float) -> None:
        if self.idle_since_s is None:
            self.idle_since_s = now_s


@dataclass
class GenResult:
    """What one generative run measured."""

    config: GenConfig
    records: list[StreamRecord]
    energy_j: float
    span_s: float
    clock_changes: int
    mean_clock_mhz: float
    bound_j: float
    iterations: int
    fixed_mhz: int | None = None
    policy_state: dict[str, object] | None = None

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.records)

    def p99(self, what: str) -> float:
        if what == "ttft":
            values = [r.ttft_ms for r in self.records]
        else:
            values = [v for r in self.records if (v := r.itl_ms) is not None]
        return float(np.percentile(values, 99)) if values else math.nan

    def row(self) -> dict[str, Any]:
        c = self.config
        tokens = self.output_tokens
        ttft99, tpot99 = self.p99("ttft"), self.p99("tpot")
        report = summarize(
            self.records, energy_j=self.energy_j, slo=TokenSloSpec(c.slo.ttft_ms, c.slo.tpot_ms)
        )
        att = report["slo_attainment"]
        return {
            "gpu": c.gpu,
            "mix": c.mix,
            "load": c.load_label,
            "seed": c.seed,
            "policy": BEST_FIXED if self.fixed_mhz is not None else c.policy,
            "requests": len(self.records),
            "output_tokens": tokens,
            "energy_j": self.energy_j,
            "j_per_token": self.energy_j / tokens if tokens else math.nan,
            "bound_j_per_token": self.bound_j / tokens if tokens else math.nan,
            "ttft_p99_ms": ttft99,
            "tpot_p99_ms": tpot99,
            "ttft_slo_ms": c.slo.ttft_ms,
            "tpot_slo_ms": c.slo.tpot_ms,
            "meets_slos": bool(ttft99 <= c.slo.ttft_ms and tpot99 <= c.slo.tpot_ms),
            "ttft_attainment": att.get("ttft", math.nan),
            "tpot_attainment": att.get("tpot", math.nan),
            "output_tokens_per_s": report["output_token_throughput"]["avg"],
            "mean_clock_mhz": self.mean_clock_mhz,
            "clock_changes": self.clock_changes,
            "fixed_mhz": self.fixed_mhz,
        }


@lru_cache(maxsize=8)
def engine_prior(
    gpu: str, max_seqs: int = 256, seed: int = 0, noise_cv: float = 0.03
) -> EnginePrior:
    """An offline profile of the engine, seed 003's way: at every ``PRIOR_CLOCK_STRIDE``-th
    clock (and the top), ``PRIOR_REPEATS`` decode steps of each bucket's batch and as many
    one-prompt prefills, each time with the run's noise; trimmed means, and the energy the
    GPU's counter saw per step. What a profiler measures, not the laws themselves."""
    profile = get_llm_profile(gpu)
    rng = np.random.default_rng(50_000 + seed)
    ladder = list(profile.clocks_mhz)
    clocks = sorted(set(ladder[::-1][::PRIOR_CLOCK_STRIDE]) | {ladder[-1], ladder[0]})
    step_ms: dict[int, dict[int, float]] = {}
    step_j: dict[int, dict[int, float]] = {}
    prefill_ms: dict[int, float] = {}
    prefill_j: dict[int, float] = {}

    def measure(work: IterationWork, clock: int) -> tuple[float, float]:
        cost = profile.cost(work, clock)
        times = cost.time_ms * _noise(rng, noise_cv, PRIOR_REPEATS)
        return trimmed_mean(times, 0.2), float(np.mean(times)) * cost.power_w / 1000.0

    for bucket in (b for b in SEQ_BUCKETS if b <= max_seqs):
        work = IterationWork(decode_seqs=bucket, decode_context_tokens=bucket * PRIOR_CONTEXT)
        for clock in clocks:
            ms, joules = measure(work, clock)
            step_ms.setdefault(bucket, {})[clock] = ms
            step_j.setdefault(bucket, {})[clock] = joules
    prompt = IterationWork(prefill_tokens=PRIOR_PROMPT, prefill_sq_tokens=PRIOR_PROMPT**2)
    for clock in clocks:
        prefill_ms[clock], prefill_j[clock] = measure(prompt, clock)
    return EnginePrior(
        clocks_mhz=tuple(ladder),
        step_ms=step_ms,
        step_j=step_j,
        prefill_ms=prefill_ms,
        prefill_j=prefill_j,
        prefill_tokens=PRIOR_PROMPT,
        context_tokens=PRIOR_CONTEXT,
    )


def _noise(rng: np.random.Generator, cv: float, size: int | None = None) -> Any:
    """Gamma factors with mean 1 and coefficient of variation ``cv`` (1 when cv is 0)."""
    if cv <= 0:
        return np.ones(size) if size is not None else 1.0
    shape = 1.0 / cv**2
    return rng.gamma(shape, 1.0 / shape, size)


def energy_lower_bound(
    profile: LlmProfile,
    prompts: Sequence[int],
    outputs: Sequence[int],
    duration_s: float,
    limits: EngineLimits,
) -> float:
    """Joules that any schedule of these requests must spend, in expectation, under the laws.

    An iteration's energy above the idle floor ``P_idle`` (idle power at the lowest clock) is,
    with ``x = f/f_max``, ``(P_floor − P_idle)·t_host + (P_floor − P_idle + P_mem + a·P_sm·x³)
    ·t_mem + ((P_floor − P_idle)/x + P_sm·x²)·t_cmp`` (``t_cmp`` at the top clock): linear in the
    three parts, each with a coefficient that has a minimum over the ladder. Summed over
    iterations, the parts are: ``t_host`` once per iteration; ``t_mem`` the weights once per
    iteration plus the KV every token reads and writes (the same in any schedule); ``t_cmp``
    every token's FLOPs (the same in any schedule). Iterations are at least as many as the
    longest output (one token per iteration per request), the output tokens over the engine's
    ``max_seqs``, and all tokens over its per-iteration budget. So

        E ≥ P_idle·duration + Σ_parts (minimum coefficient × the part's least total).

    It ignores the SLOs, the arrival times and clock-change delays (any of them only adds), and
    charges every iteration at the best clock for each of its parts separately.
    """
    idle_w = profile.idle_power_w(profile.min_clock_mhz)
    floor_w = profile.floor_w - idle_w
    xs = np.asarray(profile.clocks_mhz, dtype=float) / profile.max_clock_mhz
    sm_w, mem_w, a = profile.sm_power_w, profile.memory_power_w, profile.sm_wait_activity
    if mem_w + a * sm_w > sm_w:
        raise ValueError("the power cap could bind: the bound's linear form does not hold")
    alpha = float(np.min(floor_w + mem_w + a * sm_w * xs**3))
    beta = float(np.min(floor_w / xs + sm_w * xs**2))
    p = np.asarray(prompts, dtype=float)
    o = np.asarray(outputs, dtype=float)
    if p.size == 0:
        return idle_w * duration_s
    steps = o - 1.0
    work = IterationWork(
        prefill_tokens=int(p.sum()),
        prefill_sq_tokens=float((p**2).sum()),
        decode_seqs=int(steps.sum()),
        decode_context_tokens=int((steps * p + steps * (steps + 1) / 2.0).sum()),
    )
    host_ms, memory_ms, compute_ms = profile.split_ms(work)
    iterations = max(
        int(o.max()),
        math.ceil(steps.sum() / limits.max_seqs),
        math.ceil((p.sum() + steps.sum()) / limits.max_batched_tokens),
    )
    bandwidth = profile.bandwidth_efficiency * profile.bandwidth_bps
    weights_ms = profile.model.weights_bytes / bandwidth * 1000.0
    memory_ms += (iterations - 1) * weights_ms
    busy_j = (floor_w * host_ms * iterations + alpha * memory_ms + beta * compute_ms) / 1000.0
    return float(idle_w * duration_s + busy_j)


def simulate_generative(cfg: GenConfig) -> GenResult:
    """Run one generative simulation; deterministic for a config (seed included)."""
    profile = get_llm_profile(cfg.gpu)
    arrivals, prompts, outputs = workload(cfg)
    rng = np.random.default_rng(cfg.seed + 7919)
    limits = EngineLimits(
        max_seqs=cfg.max_seqs,
        max_batched_tokens=cfg.max_batched_tokens,
        kv_capacity_tokens=profile.kv_capacity_tokens,
    )
    engine = ContinuousBatchingEngine(limits)
    top = profile.max_clock_mhz
    policy: TokenPolicy | None = None
    if cfg.policy == "max":
        clock = _GpuClock(profile, locked_at=top, delay_s=cfg.clock_change_s)
    elif cfg.policy == "default":
        clock = _GpuClock(profile, locked_at=None, delay_s=cfg.clock_change_s)
    elif cfg.policy.startswith("fixed:"):
        mhz = int(cfg.policy.split(":", 1)[1])
        if mhz not in profile.clocks_mhz:
            raise ValueError(f"{mhz} MHz is not on the {cfg.gpu}'s clock ladder")
        clock = _GpuClock(profile, locked_at=mhz, delay_s=cfg.clock_change_s)
    elif cfg.policy == "tokens":
        clock = _GpuClock(profile, locked_at=top, delay_s=cfg.clock_change_s)
        params = replace(
            cfg.params,
            max_seqs=cfg.max_seqs,
            batched_tokens=cfg.max_batched_tokens,
            change_latency_s=cfg.clock_change_s,
        )
        prior = engine_prior(cfg.gpu, cfg.max_seqs, 0, cfg.noise_cv)
        policy = TokenPolicy(profile.clocks_mhz, cfg.slo, prior, params)
    else:
        raise ValueError(
            f"unknown policy {cfg.policy!r}; known: {', '.join(GEN_POLICIES)}, fixed:MHZ, "
            f"{BEST_FIXED}"
        )

    n = len(arrivals)
    first = np.full(n, math.nan)
    last = np.full(n, math.nan)
    queue: deque[int] = deque()
    t = 0.0
    energy = 0.0
    clock_time = 0.0
    iterations = 0
    next_arrival = 0
    in_engine = 0

    def integrate_idle(until: float) -> None:
        nonlocal t, energy, clock_time
        while t < until:
            clock.advance(t)  # afterwards the next change, if any, is later than t
            nxt = clock.next_change_s()
            end = until if nxt is None else min(until, nxt)
            energy += profile.idle_power_w(clock.clock) * (end - t)
            clock_time += clock.clock * (end - t)
            t = end

    def run(it: Iteration) -> None:
        nonlocal t, energy, clock_time
        factor = float(_noise(rng, cfg.noise_cv))
        remaining = 1.0
        while remaining > 1e-12:
            clock.advance(t)
            cost = profile.cost(it.work, clock.clock)
            total_s = cost.time_ms / 1000.0 * factor
            land = clock.next_change_s()
            if land is not None and t <= land < t + remaining * total_s:
                dt = land - t
                remaining -= dt / total_s
            else:
                dt = remaining * total_s
                remaining = 0.0
            energy += cost.power_w * dt
            clock_time += clock.clock * dt
            t += dt

    while True:
        while next_arrival < n and arrivals[next_arrival] <= t:
            queue.append(next_arrival)
            next_arrival += 1
        if policy is not None:
            wake = policy.wake_at_s()
            if wake is None or t >= wake:
                policy.on_energy(t, energy)
            policy.on_held(len(queue))
            choice = policy.decide(t)
            if choice is not None:
                clock.request(choice, t)
        limit = policy.admission_limit if policy is not None else limits.max_seqs
        released = False
        while queue and in_engine < limit:
            i = queue.popleft()
            engine.submit(i, int(prompts[i]), int(outputs[i]))
            in_engine += 1
            released = True
            if policy is not None:
                policy.on_release(i, t, float(arrivals[i]), int(prompts[i]))
        if policy is not None and released:
            # As the sidecar's core does: a release is a decision point (on_dispatch).
            policy.on_held(len(queue))
            choice = policy.decide(t)
            if choice is not None:
                clock.request(choice, t)
        it = engine.next_iteration()
        if it is None:
            clock.idle(t)
            candidates = [float(arrivals[next_arrival])] if next_arrival < n else []
            if policy is not None and (wake := policy.wake_at_s()) is not None and queue:
                candidates.append(wake)
            if not candidates:
                break
            integrate_idle(max(t, min(candidates)))
            continue
        clock.busy(t)
        run(it)
        iterations += 1
        for e in engine.finish_iteration():
            if e.index == 1:
                first[e.request_id] = t
            if policy is not None:
                policy.on_token(e.request_id, t)
            if e.last:
                last[e.request_id] = t
                in_engine -= 1
                if policy is not None:
                    policy.on_finish(e.request_id, t)

    span_s = max(t, cfg.duration_s)
    if t < span_s:
        clock.idle(t)
        integrate_idle(span_s)
    records = [
        StreamRecord(
            start_s=float(arrivals[i]),
            first_token_s=float(first[i]),
            end_s=float(last[i]),
            input_tokens=int(prompts[i]),
            output_tokens=int(outputs[i]),
        )
        for i in range(n)
    ]
    return GenResult(
        config=cfg,
        records=records,
        energy_j=energy,
        span_s=span_s,
        clock_changes=clock.changes,
        mean_clock_mhz=clock_time / span_s if span_s > 0 else math.nan,
        bound_j=energy_lower_bound(
            profile, prompts.tolist(), outputs.tolist(), cfg.duration_s, limits
        ),
        iterations=iterations,
        policy_state=policy.state() if policy is not None else None,
    )


def best_fixed_generative(cfg: GenConfig) -> GenResult:
    """The single locked clock, in hindsight, with the least energy per output token whose p99
    TTFT and p99 TPOT meet the SLOs on these arrivals (the top clock's run, marked, where none
    does). Assumes the tails fall as the clock rises (a bisection for the lowest clock that
    meets them), then walks up while energy per token keeps falling."""
    clocks = list(get_llm_profile(cfg.gpu).clocks_mhz)
    runs: dict[int, GenResult] = {}

    def run(i: int) -> GenResult:
        if i not in runs:
            runs[i] = simulate_generative(replace(cfg, policy=f"fixed:{clocks[i]}"))
        return runs[i]

    def meets(r: GenResult) -> bool:
        return bool(r.row()["meets_slos"])

    def joules(r: GenResult) -> float:
        return float(r.row()["j_per_token"])

    _, chosen = cheapest_meeting(
        len(clocks), meets=lambda i: meets(run(i)), cost=lambda i: joules(run(i))
    )
    best = run(chosen)
    best.fixed_mhz = clocks[chosen]
    return best


def run_one(cfg: GenConfig) -> dict[str, Any]:
    """One row of the comparison (``best-fixed`` searches; the rest run once)."""
    if cfg.policy == BEST_FIXED:
        return best_fixed_generative(cfg).row()
    return simulate_generative(cfg).row()


def provenance() -> dict[str, Any]:
    """Where a result came from: the git commit (and whether the tree had changes) and the
    machine."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    status = git("status", "--porcelain")
    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
        "machine": platform.node(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


COLUMNS = (
    "gpu",
    "mix",
    "load",
    "seed",
    "policy",
    "requests",
    "output_tokens",
    "j_per_token",
    "vs_max",
    "vs_best_fixed",
    "bound_j_per_token",
    "ttft_p99_ms",
    "tpot_p99_ms",
    "meets_slos",
    "ttft_attainment",
    "tpot_attainment",
    "output_tokens_per_s",
    "mean_clock_mhz",
    "clock_changes",
    "fixed_mhz",
)


def compare_cells(
    cells: Sequence[GenConfig],
    policies: Sequence[str] = ("max", "default", BEST_FIXED, "tokens"),
    *,
    jobs: int = 1,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Every policy on every cell (same arrivals per cell), with ratios to ``max`` and
    ``best-fixed`` and the cell's lower bound."""
    configs = [replace(c, policy=p) for c in cells for p in policies]
    rows = parallel_map(run_one, configs, jobs, progress)

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return r["gpu"], r["mix"], r["load"], r["seed"]

    by = {(key(r), r["policy"]): r["j_per_token"] for r in rows}
    for r in rows:
        r["vs_max"] = r["j_per_token"] / by.get((key(r), "max"), math.nan)
        r["vs_best_fixed"] = r["j_per_token"] / by.get((key(r), BEST_FIXED), math.nan)
    return rows


def verdicts(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell, the targets: the policy meets both p99 SLOs wherever ``max`` does, spends at
    least 25% less energy per output token than ``max``, and no more than ``best-fixed``."""
    out = []
    cells = dict.fromkeys((r["gpu"], r["mix"], r["load"], r["seed"]) for r in rows)
    for cell in cells:
        mine = {r["policy"]: r for r in rows if (r["gpu"], r["mix"], r["load"], r["seed"]) == cell}
        pol, mx, bf = mine.get("tokens"), mine.get("max"), mine.get(BEST_FIXED)
        if pol is None or mx is None:
            continue
        out.append(
            {
                "gpu": cell[0],
                "mix": cell[1],
                "load": cell[2],
                "seed": cell[3],
                "meets_where_max_does": bool(pol["meets_slos"] or not mx["meets_slos"]),
                "saving_vs_max": 1.0 - pol["vs_max"],
                "at_most_best_fixed": bool(bf is not None and pol["vs_best_fixed"] <= 1.0),
            }
        )
    return out


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The comparison as a Markdown table (one line per cell and policy, then the bound)."""
    head = (
        "| mix | load | policy | J/token | vs max | vs best-fixed | p99 TTFT ms | "
        "p99 TPOT ms | SLOs met | mean MHz | clock changes |"
    )
    lines = [head, "|" + "---|" * 11]
    cells = dict.fromkeys((r["gpu"], r["mix"], r["load"], r["seed"]) for r in rows)
    for cell in cells:
        mine = [r for r in rows if (r["gpu"], r["mix"], r["load"], r["seed"]) == cell]
        for r in mine:
            policy = r["policy"] + (f" ({r['fixed_mhz']} MHz)" if r["fixed_mhz"] else "")
            lines.append(
                f"| {r['mix']} | {r['load']} | {policy} | {r['j_per_token']:.4f} | "
                f"{r['vs_max']:.3f} | {r['vs_best_fixed']:.3f} | {r['ttft_p99_ms']:.0f} | "
                f"{r['tpot_p99_ms']:.1f} | {'yes' if r['meets_slos'] else 'no'} | "
                f"{r['mean_clock_mhz']:.0f} | {r['clock_changes']} |"
            )
        bound = mine[0]["bound_j_per_token"]
        mx = next((r for r in mine if r["policy"] == "max"), None)
        vs = bound / mx["j_per_token"] if mx else math.nan
        lines.append(
            f"| {cell[1]} | {cell[2]} | lower bound | {bound:.4f} | {vs:.3f} | | | | | | |"
        )
    return "\n".join(lines)


def write_results(
    rows: Sequence[dict[str, Any]],
    out_dir: Path,
    meta: dict[str, Any],
    prov: dict[str, Any] | None = None,
) -> list[Path]:
    """``generative.csv``, ``generative.json`` (rows, verdicts, provenance, settings) and
    ``generative.md`` in ``out_dir``; ``prov``: :func:`provenance` as of the start of the runs
    (default: now)."""
    import csv

    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "generative.csv"
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: r.get(k) for k in COLUMNS})
    payload = {
        "provenance": prov or provenance(),
        **meta,
        "rows": list(rows),
        "verdicts": verdicts(rows),
    }
    json_path = out_dir / "generative.json"
    json_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    md_path = out_dir / "generative.md"
    prov = payload["provenance"]
    changed = meta.get("tokens")
    settings = f"token policy parameters changed: {', '.join(changed)}\n\n" if changed else ""
    md_path.write_text(
        f"commit {prov['commit']}{' (with changes)' if prov['dirty'] else ''}, "
        f"machine {prov['machine']} ({prov['platform']})\n\n{settings}{markdown_table(rows)}\n"
    )
    return [csv_path, json_path, md_path]


# -- the command -----------------------------------------------------------------------------


def _loads(text: str) -> tuple[float | str, ...]:
    out: list[float | str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == VARYING:
            out.append(part)
            continue
        try:
            out.append(float(part))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"loads are shares of capacity or {VARYING!r}, got {part!r}"
            ) from None
    return tuple(out)


# The token policy's parameters that a run sets from the simulated engine it drives.
ENGINE_SET = frozenset({"max_seqs", "batched_tokens", "change_latency_s"})


def parse_tokens(items: Sequence[str]) -> TokenPolicyParams:
    """The token policy's parameters with ``name=value`` items applied, named as the fields of
    :class:`scheduler.tokens.TokenPolicyParams` (``tpot_share=0.94``) or of one of its loops
    (``tpot_feedback.setpoint=0.95``), each value of its default's type
    (:func:`scheduler.config.token_params` builds them, as for the sidecar's ``--tokens-*``).
    ValueError names a bad item; the three a run takes from the simulated engine
    (:data:`ENGINE_SET`; ``--clock-change-ms`` sets the clock change's latency) are refused,
    not silently replaced."""
    values: dict[tuple[str, ...], Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip().replace("-", "_")
        path = tuple(name.split("."))
        try:
            default = token_default(path)
        except KeyError:
            sep = ""  # no such parameter: the same answer as no value
        if not sep:
            raise ValueError(
                f"--tokens {item!r}: give NAME=VALUE, NAME a parameter of the token policy "
                f"({', '.join(f.name for f in fields(TokenPolicyParams))}, or LOOP.NAME)"
            )
        if path[0] in ENGINE_SET:
            raise ValueError(
                f"--tokens {item!r}: {name} is the simulated engine's own (its max_seqs and "
                "batched tokens; --clock-change-ms for the clock change)"
            )
        kind = type(default)
        try:
            values[path] = kind(text.strip())
        except ValueError:
            what = {int: "a whole number", float: "a number"}.get(kind, kind.__name__)
            raise ValueError(f"--tokens {item!r}: {name} must be {what}") from None
    try:
        return token_params(values)
    except ValueError as err:
        raise ValueError(f"--tokens: {err}") from None


def add_parser(sub: Any) -> None:
    """The ``generative`` subcommand of ``python -m scheduler``."""
    p = sub.add_parser(
        "generative",
        help="LLM workloads: max, default, best-fixed, the token policy and a lower bound",
    )
    p.add_argument("--gpu", default="h100", choices=LLM_GPUS)
    p.add_argument("--mixes", default="conversation", help=", ".join(LENGTH_MIXES))
    p.add_argument(
        "--loads", type=_loads, default=(0.3, 0.6, VARYING), help="shares of capacity, or varying"
    )
    p.add_argument(
        "--policies",
        default="max,default,best-fixed,tokens",
        help=f"any of {', '.join(GEN_POLICIES)}, fixed:MHZ, {BEST_FIXED}",
    )
    p.add_argument("--ttft-ms", type=float, default=INTERACTIVE_SLO.ttft_ms)
    p.add_argument("--tpot-ms", type=float, default=INTERACTIVE_SLO.tpot_ms)
    p.add_argument("--duration-s", type=float, default=180.0)
    p.add_argument("--seeds", default="0", help="e.g. 0,1,2")
    p.add_argument("--clock-change-ms", type=float, default=50.0)
    p.add_argument(
        "--tokens",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a parameter of the token policy (tpot_share=0.94, tpot_feedback.setpoint=0.95; "
        "the sidecar's --tokens-* flags); repeatable",
    )
    p.add_argument("--jobs", type=int, default=1, help="processes (default: 1; 0: all cores)")
    p.add_argument("-o", "--out-dir", default="out/generative")
    p.set_defaults(run=_cmd_generative)


def _cmd_generative(args: argparse.Namespace, console: Any) -> int:
    from rich.table import Table

    slo = TokenSlo(ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms)
    if args.duration_s <= 0 or args.clock_change_ms < 0:
        raise ValueError("--duration-s must be > 0 and --clock-change-ms >= 0")
    mixes = [m.strip() for m in args.mixes.split(",") if m.strip()]
    for mix in mixes:
        if mix not in LENGTH_MIXES:
            raise ValueError(f"unknown length mix {mix!r}; known: {', '.join(LENGTH_MIXES)}")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    params = parse_tokens(args.tokens)
    cells = [
        GenConfig(
            gpu=args.gpu,
            mix=mix,
            load=load,
            seed=seed,
            duration_s=args.duration_s,
            slo=slo,
            clock_change_s=args.clock_change_ms / 1000.0,
            params=params,
        )
        for mix in mixes
        for load in args.loads
        for seed in seeds
    ]
    prov = provenance()  # the code the runs ran, before anything can change it
    rows = compare_cells(cells, policies, jobs=args.jobs)
    view = Table(title=f"generative on {args.gpu}: SLOs p99 TTFT {slo.ttft_ms:g} ms, "
                       f"p99 TPOT {slo.tpot_ms:g} ms, {args.duration_s:g} s per run")  # fmt: skip
    for col in ("mix", "load", "seed", "policy", "J/token", "vs max", "vs best-fixed",
                "p99 TTFT", "p99 TPOT", "SLOs", "MHz", "changes"):  # fmt: skip
        view.add_column(col, justify="right")
    for r in rows:
        view.add_row(
            r["mix"], r["load"], str(r["seed"]),
            r["policy"] + (f" {r['fixed_mhz']}" if r["fixed_mhz"] else ""),
            f"{r['j_per_token']:.4f}", f"{r['vs_max']:.3f}", f"{r['vs_best_fixed']:.3f}",
            f"{r['ttft_p99_ms']:.0f}", f"{r['tpot_p99_ms']:.1f}",
            "met" if r["meets_slos"] else "[red]missed[/red]",
            f"{r['mean_clock_mhz']:.0f}", str(r["clock_changes"]),
        )  # fmt: skip
    console.print(view)
    bounds = {(r["mix"], r["load"], r["seed"]): r["bound_j_per_token"] for r in rows}
    for (mix, load, seed), b in bounds.items():
        console.print(f"lower bound {mix} load {load} seed {seed}: {b:.4f} J/token")
    meta = {
        "command": " ".join(["python -m scheduler", *sys.argv[1:]]),
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
        "duration_s": args.duration_s,
        "clock_change_ms": args.clock_change_ms,
        "tokens": list(args.tokens),
    }
    for path in write_results(rows, Path(args.out_dir), meta, prov):
        console.print(f"wrote {path}")
    return 0
