"""Laws of an LLM serving engine on a simulated GPU: time and power of one engine iteration.

An engine that batches continuously (vLLM, TensorRT-LLM's in-flight batching) runs iterations:
each one computes the prompts of newly admitted requests (*prefill*) and one output token for
every running sequence (*decode*). What an iteration costs follows from how much it reads from
memory and how much it computes, as a roofline model does, with the GPU's clock scaling only the
compute:

* ``t = t_host + t_mem + t_cmp · f_max / f`` (ms), where
  ``t_mem = (weights + KV read + KV written) / (η_m · bandwidth)`` does not depend on the SM
  clock (HBM has its own clock), and ``t_cmp = FLOPs / (η_c · peak FLOPS)`` is the compute at
  the top clock. A decode step reads the weights once for the whole batch and each sequence's
  KV cache, and computes ``2·params`` FLOPs per sequence: mostly memory, so it barely slows
  when the clock drops (a large ``b`` in seed 003's ``1/(m·f + b)``). A prefill computes
  ``2·params`` FLOPs per prompt token plus causal attention: mostly compute, so its time goes
  about as ``1/f``.
* Power: ``P = P_floor + P_mem · s_mem + P_sm · (f/f_max)³ · (s_cmp + a · s_mem)``, with
  ``s_mem``, ``s_cmp`` the shares of the iteration spent in memory- and compute-bound work (the
  host share draws only the floor). The SM clock domain's power goes as ``C·V²·f`` with voltage
  rising with clock (exponent 3, as in :mod:`dvfs.profiles`); while it waits on memory it
  still draws a fraction ``a`` of it.

Where every number comes from:

* The model is Llama-2-7B (6.74e9 parameters, 32 layers, hidden size 4096, 32 KV heads), the
  model NVIDIA's TensorRT-LLM performance tables measured (``docs/source/performance.md`` of
  NVIDIA/TensorRT-LLM, v0.5/v0.6.1): FP8 weights and KV cache on the H100, FP16 on the A100.
* Peak dense tensor throughput and memory bandwidth: NVIDIA's data sheets (H100 SXM5: 1,979
  TFLOPS FP8, 3.35 TB/s HBM3, 700 W; A100 SXM4 80GB: 312 TFLOPS FP16, 2.039 TB/s HBM2e, 400 W).
* ``η_m = 0.90``, the share of the nominal bandwidth a memory-bound kernel reaches: a GH200's
  measured coalesced read of 3,614.6 GB/s against its 4.0 TB/s (OpenCL-Benchmark output
  published in mredenti/PowerCapping, ``configuration/OpenCL_benchmark.md``).
* ``η_c`` and ``t_host`` per GPU are solved from two published measurements each
  (:func:`calibrate`), TensorRT-LLM's tables: the first-token latency of one 2,048-token prompt
  (H100 FP8: 36 ms; A100 FP16: 133 ms) and the throughput of 112 (H100) / 60 (A100) sequences
  generating 2,048 tokens from 128-token prompts (6,818 and 1,928 output tokens/s). The
  128-token first-token latencies of the same tables (7 ms, 16 ms) are left out of the fit and
  checked in the tests.
* ``t_host`` does not scale with the clock: it is host-side work (scheduling, launches).
  Published measurements find small-batch decode nearly insensitive to the SM clock
  (Maliakel et al., arXiv 2501.08219: 1-6% more latency from 2,842 MHz down to 180 MHz) and HBM
  bandwidth unaffected by it; a clock-scaled ``t_host`` would contradict both.
* ``P_floor``, idle power and the clock ladder are the GPU's in :mod:`dvfs.profiles`;
  ``P_floor + P_sm`` is the board TDP: compute-bound prefill runs at the power cap (Splitwise,
  Patel et al., ISCA 2024, §III). ``P_mem`` and ``a`` are solved so that a large decode batch
  (256 sequences, 1,152 tokens of context) draws 300/700 of the TDP at the top clock and the
  best clock on the ladder saves 32% of its energy: on an H200 (same die and TDP as the H100),
  decode drew 137-300 W and locking the SM clock recovered up to 32% of decode energy (Ma et
  al., "The Illusion of Power Capping in LLM Decode", arXiv 2605.11999). The A100 uses the same
  relative anchors (an assumption: no such measurement of an A100 was found). The model gives a
  batch-1 decode more than their 137 W (its floor is the profile's busy floor).
* KV-cache capacity: 90% of the 80 GB (vLLM's default ``gpu_memory_utilization``) less the
  weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from dvfs.profiles import GpuProfile, get_profile

LLAMA2_7B = "llama-2-7b"
BANDWIDTH_EFFICIENCY = 0.90  # η_m: measured read bandwidth over nominal (module docstring)
MEMORY_UTILIZATION = 0.90  # share of GPU memory the engine may use (vLLM's default)
DECODE_POWER_OF_TDP = 300.0 / 700.0  # large decode batch at the top clock (Ma et al., H200)
DECODE_BEST_SAVING = 0.32  # best decode energy saving over the clock ladder (Ma et al., H200)
ANCHOR_BATCH = 256  # the large decode batch those anchors describe
ANCHOR_CONTEXT = 1152  # tokens of context per sequence in it (the TensorRT-LLM run's mean)
LONG_PROMPT = 2048  # the prompt of the published first-token latency that is fitted


@dataclass(frozen=True)
class TransformerSpec:
    """A decoder-only transformer's size, in what memory and compute it costs per token."""

    name: str
    params: float
    layers: int
    hidden: int
    kv_hidden: int  # KV heads × head size
    weight_bytes: float  # bytes per parameter
    kv_bytes: float  # bytes per cached K or V element

    @property
    def weights_bytes(self) -> float:
        return self.params * self.weight_bytes

    @property
    def kv_bytes_per_token(self) -> float:
        """KV cache of one token: K and V in every layer."""
        return 2.0 * self.layers * self.kv_hidden * self.kv_bytes


@dataclass(frozen=True)
class PublishedRun:
    """The measurements a GPU's constants are solved from (TensorRT-LLM's tables)."""

    first_token_2048_ms: float  # one 2,048-token prompt, batch 1
    first_token_128_ms: float  # one 128-token prompt, batch 1 (a check, not fitted)
    batch: int  # sequences generating together
    prompt_tokens: int
    output_tokens: int
    output_tokens_per_s: float
    source: str


@dataclass(frozen=True)
class IterationWork:
    """What one engine iteration computes: prompt tokens being prefilled and sequences decoding.

    A prompt may be prefilled in chunks: a chunk of ``c`` tokens after ``o`` already done
    attends to ``o + c/2`` tokens on average. ``prefill_sq_tokens`` sums ``c² + 2·c·o`` over the
    chunks (causal attention's work; a whole prompt of ``p`` tokens in one chunk: ``p²``, and
    the chunks of one prompt add up to ``p²`` however it is cut); ``prefill_prefix_tokens`` sums
    the ``o`` (the KV each chunk reads back); ``decode_context_tokens`` sums the decoding
    sequences' contexts (the KV they read).
    """

    prefill_tokens: int = 0
    prefill_sq_tokens: float = 0.0
    decode_seqs: int = 0
    decode_context_tokens: int = 0
    prefill_prefix_tokens: int = 0

    @property
    def empty(self) -> bool:
        return self.prefill_tokens == 0 and self.decode_seqs == 0


@dataclass(frozen=True)
class IterationCost:
    """One iteration's time split (ms at the top clock for ``compute_ms``) and its power."""

    host_ms: float
    memory_ms: float
    compute_ms: float  # at the top clock
    time_ms: float  # at the clock asked for
    power_w: float

    @property
    def energy_j(self) -> float:
        return self.power_w * self.time_ms / 1000.0


@dataclass(frozen=True)
class LlmProfile:
    """One transformer served by a continuously batching engine on one GPU (module docstring)."""

    gpu: GpuProfile
    model: TransformerSpec
    peak_flops: float
    bandwidth_bps: float
    memory_bytes: float
    compute_efficiency: float  # η_c
    host_ms: float  # t_host
    memory_power_w: float  # P_mem
    sm_wait_activity: float  # a
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY

    @property
    def name(self) -> str:
        return f"{self.model.name}@{self.gpu.name}"

    @property
    def clocks_mhz(self) -> tuple[int, ...]:
        return self.gpu.clocks_mhz

    @property
    def max_clock_mhz(self) -> int:
        return self.gpu.max_clock_mhz

    @property
    def min_clock_mhz(self) -> int:
        return self.gpu.min_clock_mhz

    @property
    def floor_w(self) -> float:
        return self.gpu.busy_floor_w

    @property
    def sm_power_w(self) -> float:
        """The SM clock domain's power at the top clock, fully busy: TDP less the floor."""
        return self.gpu.tdp_w - self.gpu.busy_floor_w

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache that fit beside the weights."""
        free = self.memory_bytes * MEMORY_UTILIZATION - self.model.weights_bytes
        return int(free // self.model.kv_bytes_per_token)

    def split_ms(self, work: IterationWork) -> tuple[float, float, float]:
        """``(host, memory, compute at the top clock)`` of an iteration, in ms."""
        if work.empty:
            return 0.0, 0.0, 0.0
        m = self.model
        read_bytes = (
            m.weights_bytes
            + work.decode_context_tokens * m.kv_bytes_per_token
            + work.prefill_tokens * m.kv_bytes_per_token  # the prompts' KV, written
            + work.prefill_prefix_tokens * m.kv_bytes_per_token  # earlier chunks' KV, read
        )
        flops = (
            2.0 * m.params * (work.prefill_tokens + work.decode_seqs)
            + 2.0 * m.layers * m.hidden * work.prefill_sq_tokens  # causal attention
            + 4.0 * m.layers * m.hidden * work.decode_context_tokens
        )
        memory_ms = read_bytes / (self.bandwidth_efficiency * self.bandwidth_bps) * 1000.0
        compute_ms = flops / (self.compute_efficiency * self.peak_flops) * 1000.0
        return self.host_ms, memory_ms, compute_ms

    def cost(self, work: IterationWork, clock_mhz: float) -> IterationCost:
        """Time and power of one iteration at ``clock_mhz``."""
        host, memory, compute = self.split_ms(work)
        x = clock_mhz / self.max_clock_mhz
        time_ms = host + memory + compute / x
        if time_ms <= 0:
            return IterationCost(0.0, 0.0, 0.0, 0.0, self.idle_power_w(clock_mhz))
        s_mem, s_cmp = memory / time_ms, compute / x / time_ms
        power = (
            self.floor_w
            + self.memory_power_w * s_mem
            + self.sm_power_w * x**3 * (s_cmp + self.sm_wait_activity * s_mem)
        )
        return IterationCost(host, memory, compute, time_ms, float(min(power, self.gpu.tdp_w)))

    def idle_power_w(self, clock_mhz: float) -> float:
        """Board power with nothing to run (a clock locked high costs a little)."""
        return self.gpu.idle_power_w(clock_mhz)

    def decode_step_ms(self, clock_mhz: float, seqs: int, context_tokens: int = 1024) -> float:
        """One decode step of ``seqs`` sequences with ``context_tokens`` each."""
        work = IterationWork(decode_seqs=seqs, decode_context_tokens=seqs * context_tokens)
        return self.cost(work, clock_mhz).time_ms

    def prefill_ms(self, clock_mhz: float, prompt_tokens: int) -> float:
        """An iteration that prefills one prompt and nothing else (its time to first token)."""
        work = IterationWork(prefill_tokens=prompt_tokens, prefill_sq_tokens=prompt_tokens**2)
        return self.cost(work, clock_mhz).time_ms

    def capacity_rps(self, mean_prompt: float, mean_output: float, max_seqs: int = 256) -> float:
        """Requests per second the engine sustains at the top clock, saturated.

        A saturated engine runs ``B`` sequences (the engine's cap, or what the KV cache holds
        at the mix's mean sequence length); each iteration decodes all of them and admits
        ``B / mean_output`` new ones, whose prompts it prefills in the same iteration.
        """
        per_seq = mean_prompt + mean_output
        seqs = max(1, min(max_seqs, int(self.kv_capacity_tokens // max(per_seq, 1.0))))
        admitted = seqs / max(mean_output, 1.0)
        work = IterationWork(
            prefill_tokens=round(admitted * mean_prompt),
            prefill_sq_tokens=admitted * mean_prompt**2,
            decode_seqs=seqs,
            decode_context_tokens=round(seqs * (mean_prompt + mean_output / 2.0)),
        )
        step_s = self.cost(work, self.max_clock_mhz).time_ms / 1000.0
        return admitted / step_s


@dataclass(frozen=True)
class GpuSheet:
    """A GPU's data-sheet numbers for the precision the published runs used."""

    peak_flops: float
    bandwidth_bps: float
    memory_bytes: float


# NVIDIA data sheets (module docstring); dense tensor throughput at the run's precision.
_SHEETS = {
    "h100": GpuSheet(peak_flops=1979e12, bandwidth_bps=3.35e12, memory_bytes=80e9),
    "a100": GpuSheet(peak_flops=312e12, bandwidth_bps=2.039e12, memory_bytes=80e9),
}
_TRTLLM = "NVIDIA/TensorRT-LLM docs/source/performance.md (v0.5 first-token, v0.6.1 throughput)"
_RUNS = {
    "h100": PublishedRun(36.0, 7.0, 112, 128, 2048, 6818.0, _TRTLLM + ", H100 FP8"),
    "a100": PublishedRun(133.0, 16.0, 60, 128, 2048, 1928.0, _TRTLLM + ", A100 FP16"),
}
_MODELS = {
    "h100": TransformerSpec(LLAMA2_7B, 6.74e9, 32, 4096, 4096, weight_bytes=1.0, kv_bytes=1.0),
    "a100": TransformerSpec(LLAMA2_7B, 6.74e9, 32, 4096, 4096, weight_bytes=2.0, kv_bytes=2.0),
}


def _bisect(fn: Callable[[float], float], lo: float, hi: float, iters: int = 80) -> float:
    """A root of the increasing ``fn`` in ``[lo, hi]``."""
    for _ in range(iters):
        mid = (lo + hi) / 2.0
        if fn(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def calibrate(
    gpu: GpuProfile, model: TransformerSpec, sheet: GpuSheet, run: PublishedRun
) -> LlmProfile:
    """Solve ``η_c`` and ``t_host`` from the published run, then ``P_mem`` and ``a`` from the
    decode-power anchors (see the module docstring for each)."""
    base = LlmProfile(gpu, model, sheet.peak_flops, sheet.bandwidth_bps, sheet.memory_bytes,
                      compute_efficiency=1.0, host_ms=0.0, memory_power_w=0.0,
                      sm_wait_activity=0.0)  # fmt: skip
    # Both measurements are linear in t_host and 1/η_c: t = t_host·n + memory + compute/η_c.
    p = LONG_PROMPT
    _, mem1, cmp1 = base.split_ms(IterationWork(prefill_tokens=p, prefill_sq_tokens=p * p))
    n_steps = run.output_tokens - 1
    prompt_work = IterationWork(
        prefill_tokens=run.batch * run.prompt_tokens,
        prefill_sq_tokens=run.batch * run.prompt_tokens**2,
    )
    _, mem2, cmp2 = base.split_ms(prompt_work)
    for k in range(1, run.output_tokens):
        ctx = run.prompt_tokens + k
        _, mem, cmp_ = base.split_ms(
            IterationWork(decode_seqs=run.batch, decode_context_tokens=run.batch * ctx)
        )
        mem2, cmp2 = mem2 + mem, cmp2 + cmp_
    total_ms = run.batch * run.output_tokens / run.output_tokens_per_s * 1000.0
    # [1, cmp1; n+1, cmp2] · [t_host, 1/η_c] = [ttft − mem1, total − mem2]
    y1, y2 = run.first_token_2048_ms - mem1, total_ms - mem2
    det = cmp2 - (n_steps + 1) * cmp1
    inv_eta = (y2 - (n_steps + 1) * y1) / det
    host_ms = y1 - cmp1 * inv_eta
    timed = LlmProfile(gpu, model, sheet.peak_flops, sheet.bandwidth_bps, sheet.memory_bytes,
                       compute_efficiency=1.0 / inv_eta, host_ms=host_ms, memory_power_w=0.0,
                       sm_wait_activity=0.0)  # fmt: skip
    anchor = IterationWork(
        decode_seqs=ANCHOR_BATCH, decode_context_tokens=ANCHOR_BATCH * ANCHOR_CONTEXT
    )
    host, memory, compute = timed.split_ms(anchor)
    t_top = host + memory + compute
    target_w = DECODE_POWER_OF_TDP * gpu.tdp_w

    def with_activity(a: float) -> LlmProfile:
        # P_mem such that the anchor batch draws target_w at the top clock.
        p_mem = (
            (target_w - gpu.busy_floor_w) * t_top - timed.sm_power_w * (compute + a * memory)
        ) / memory
        return LlmProfile(gpu, model, sheet.peak_flops, sheet.bandwidth_bps, sheet.memory_bytes,
                          compute_efficiency=timed.compute_efficiency, host_ms=host_ms,
                          memory_power_w=p_mem, sm_wait_activity=a)  # fmt: skip

    def saving_gap(a: float) -> float:
        prof = with_activity(a)
        top = prof.cost(anchor, gpu.max_clock_mhz).energy_j
        best = min(prof.cost(anchor, f).energy_j for f in gpu.clocks_mhz)
        return (1.0 - best / top) - DECODE_BEST_SAVING

    return with_activity(_bisect(saving_gap, 0.0, 1.0))


@lru_cache(maxsize=8)
def get_llm_profile(gpu: str) -> LlmProfile:
    """The LLM engine's laws on a simulated GPU (``h100``, ``a100``); KeyError lists them."""
    key = gpu.lower()
    if key not in _SHEETS:
        raise KeyError(f"no LLM profile for GPU {gpu!r}; known: {', '.join(sorted(_SHEETS))}")
    return calibrate(get_profile(key), _MODELS[key], _SHEETS[key], _RUNS[key])


def published_run(gpu: str) -> PublishedRun:
    """The measurements ``gpu``'s LLM profile was solved from."""
    return _RUNS[gpu.lower()]


LLM_GPUS = tuple(sorted(_SHEETS))


def energy_optimal_clock_mhz(profile: LlmProfile, work: IterationWork) -> int:
    """The ladder clock with the least energy for ``work`` (slower costs more, not less)."""
    return min(profile.clocks_mhz, key=lambda f: profile.cost(work, f).energy_j)


def slowdown(profile: LlmProfile, work: IterationWork, clock_mhz: float) -> float:
    """How much longer ``work`` takes at ``clock_mhz`` than at the top clock."""
    top = profile.cost(work, profile.max_clock_mhz).time_ms
    return profile.cost(work, clock_mhz).time_ms / top if top > 0 else math.nan
