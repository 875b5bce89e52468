"""The LLM engine's laws: they reproduce the published measurements they were solved from, and
behave as the physics says (decode memory-bound, prefill compute-bound, power by phase)."""

from __future__ import annotations

import pytest

from dvfs.llm_profiles import (
    DECODE_BEST_SAVING,
    DECODE_POWER_OF_TDP,
    LLM_GPUS,
    IterationWork,
    energy_optimal_clock_mhz,
    get_llm_profile,
    published_run,
    slowdown,
)
from dvfs.profiles import get_profile


def decode(seqs: int, context: int = 1024) -> IterationWork:
    return IterationWork(decode_seqs=seqs, decode_context_tokens=seqs * context)


def prefill(tokens: int) -> IterationWork:
    return IterationWork(prefill_tokens=tokens, prefill_sq_tokens=float(tokens * tokens))


@pytest.mark.parametrize("gpu", LLM_GPUS)
def test_the_fitted_first_token_latency_is_the_published_one(gpu: str) -> None:
    p, run = get_llm_profile(gpu), published_run(gpu)
    assert p.prefill_ms(p.max_clock_mhz, 2048) == pytest.approx(run.first_token_2048_ms, rel=1e-6)


@pytest.mark.parametrize("gpu", LLM_GPUS)
def test_the_published_throughput_run_is_reproduced(gpu: str) -> None:
    """112 (H100) / 60 (A100) sequences, 128-token prompts, 2,048 output tokens each."""
    p, run = get_llm_profile(gpu), published_run(gpu)
    f = p.max_clock_mhz
    total_ms = p.cost(
        IterationWork(
            prefill_tokens=run.batch * run.prompt_tokens,
            prefill_sq_tokens=float(run.batch * run.prompt_tokens**2),
        ),
        f,
    ).time_ms
    for k in range(1, run.output_tokens):
        total_ms += p.cost(decode(run.batch, run.prompt_tokens + k), f).time_ms
    throughput = run.batch * run.output_tokens / (total_ms / 1000.0)
    assert throughput == pytest.approx(run.output_tokens_per_s, rel=1e-6)


@pytest.mark.parametrize("gpu", LLM_GPUS)
def test_the_unfitted_short_prompt_latency_is_within_a_third(gpu: str) -> None:
    """The 128-token first-token latency of the same table is a check, not a fit input."""
    p, run = get_llm_profile(gpu), published_run(gpu)
    model = p.prefill_ms(p.max_clock_mhz, 128)
    assert abs(model - run.first_token_128_ms) / run.first_token_128_ms < 0.33


@pytest.mark.parametrize("gpu", LLM_GPUS)
def test_decode_barely_slows_with_the_clock_and_prefill_about_as_one_over_f(gpu: str) -> None:
    p = get_llm_profile(gpu)
    half = p.max_clock_mhz / 2
    assert slowdown(p, decode(1), half) < 1.02  # batch 1: memory and host time only
    assert slowdown(p, decode(256), half) < 1.25  # a big batch computes more, still < 2x
    assert slowdown(p, decode(256), half) > slowdown(p, decode(16), half)
    assert 1.8 < slowdown(p, prefill(2048), half) <= 2.0  # compute-bound: about 1/f


@pytest.mark.parametrize("gpu", LLM_GPUS)
def test_power_by_phase_and_the_decode_anchors(gpu: str) -> None:
    p = get_llm_profile(gpu)
    gpu_profile = get_profile(gpu)
    top = p.max_clock_mhz
    anchor = decode(256, 1152)
    assert p.cost(anchor, top).power_w == pytest.approx(
        DECODE_POWER_OF_TDP * gpu_profile.tdp_w, rel=1e-6
    )
    best = min(p.cost(anchor, f).energy_j for f in p.clocks_mhz)
    assert 1 - best / p.cost(anchor, top).energy_j == pytest.approx(DECODE_BEST_SAVING, abs=1e-4)
    # Prefill runs near the power cap; decode well below it; both above the busy floor.
    assert p.cost(prefill(2048), top).power_w > 0.85 * gpu_profile.tdp_w
    assert gpu_profile.busy_floor_w < p.cost(decode(1), top).power_w < p.cost(anchor, top).power_w
    # Power falls with the clock in every phase; idle costs least.
    for work in (decode(1), anchor, prefill(1024)):
        assert p.cost(work, p.min_clock_mhz).power_w < p.cost(work, top).power_w
    assert p.idle_power_w(p.min_clock_mhz) < p.cost(decode(1), p.min_clock_mhz).power_w


@pytest.mark.parametrize("gpu", LLM_GPUS)
def test_energy_is_u_shaped_in_the_clock(gpu: str) -> None:
    """The least energy is neither at the top nor at the bottom of the ladder."""
    p = get_llm_profile(gpu)
    for work in (decode(64), prefill(1024)):
        f = energy_optimal_clock_mhz(p, work)
        assert p.min_clock_mhz < f < p.max_clock_mhz


def test_step_time_grows_with_the_batch_and_the_context() -> None:
    p = get_llm_profile("h100")
    f = p.max_clock_mhz
    assert p.decode_step_ms(f, 64) > p.decode_step_ms(f, 8) > p.decode_step_ms(f, 1)
    assert p.decode_step_ms(f, 64, 4096) > p.decode_step_ms(f, 64, 512)
    # Per sequence, a bigger batch is cheaper: the weights are read once per step.
    assert p.decode_step_ms(f, 64) / 64 < p.decode_step_ms(f, 8) / 8


def test_h100_is_faster_than_a100_and_holds_more_kv() -> None:
    h, a = get_llm_profile("h100"), get_llm_profile("a100")
    assert h.prefill_ms(h.max_clock_mhz, 1024) < a.prefill_ms(a.max_clock_mhz, 1024)
    assert h.decode_step_ms(h.max_clock_mhz, 32) < a.decode_step_ms(a.max_clock_mhz, 32)
    assert h.kv_capacity_tokens > a.kv_capacity_tokens > 0


def test_unknown_gpu_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="h100"):
        get_llm_profile("v100")
