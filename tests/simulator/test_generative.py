"""Generative runs in the simulator: determinism, the laws showing through, the baselines, the
lower bound and the command."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dvfs.llm_engine import EngineLimits
from dvfs.llm_profiles import get_llm_profile
from scheduler.tokens import TokenPolicyParams
from simulator.cli import main
from simulator.generative import (
    VARYING,
    GenConfig,
    best_fixed_generative,
    capacity_rps,
    energy_lower_bound,
    parse_tokens,
    sample_lengths,
    simulate_generative,
    varying_arrivals,
    workload,
)

CELL = GenConfig(gpu="h100", load=0.3, duration_s=30.0, seed=3)


def row(cfg: GenConfig) -> dict[str, Any]:
    return simulate_generative(cfg).row()


def test_a_run_is_deterministic_and_every_request_completes() -> None:
    a, b = simulate_generative(replace(CELL, policy="max")), row(replace(CELL, policy="max"))
    assert a.row() == b
    arrivals, _, outputs = workload(replace(CELL, policy="max"))
    assert len(a.records) == len(arrivals) > 50
    assert a.output_tokens == int(outputs.sum())
    assert all(r.first_token_s >= r.start_s for r in a.records)


def test_a_lower_clock_saves_energy_slows_prefill_more_than_decode() -> None:
    top = row(replace(CELL, policy="max"))
    low = row(replace(CELL, policy="fixed:990"))
    assert float(low["j_per_token"]) < 0.8 * float(top["j_per_token"])
    ttft_ratio = float(low["ttft_p99_ms"]) / float(top["ttft_p99_ms"])
    tpot_ratio = float(low["tpot_p99_ms"]) / float(top["tpot_p99_ms"])
    assert ttft_ratio > 1.4  # the prompts are compute-bound
    assert tpot_ratio < ttft_ratio  # decode steps are mostly memory-bound
    assert top["mean_clock_mhz"] == pytest.approx(1980.0)


def test_default_boost_idles_at_the_bottom_when_there_is_no_work() -> None:
    quiet = replace(CELL, load=0.02, duration_s=60.0)
    default, top = row(replace(quiet, policy="default")), row(replace(quiet, policy="max"))
    assert float(default["mean_clock_mhz"]) < 1980.0
    assert float(default["j_per_token"]) < float(top["j_per_token"])


def test_the_lower_bound_is_below_every_policy_on_the_same_arrivals() -> None:
    rows = [row(replace(CELL, policy=p)) for p in ("max", "default", "fixed:840", "tokens")]
    bounds = {r["bound_j_per_token"] for r in rows}
    assert len(bounds) == 1  # the cell's, whatever the policy
    bound = float(bounds.pop())
    assert 0 < bound < min(float(r["j_per_token"]) for r in rows)


def test_the_bound_counts_what_no_schedule_can_avoid() -> None:
    p = get_llm_profile("h100")
    limits = EngineLimits(kv_capacity_tokens=p.kv_capacity_tokens)
    idle_only = energy_lower_bound(p, [], [], 10.0, limits)
    assert idle_only == pytest.approx(p.idle_power_w(p.min_clock_mhz) * 10.0)
    one = energy_lower_bound(p, [1000], [100], 10.0, limits)
    more = energy_lower_bound(p, [1000, 1000], [100, 100], 10.0, limits)
    assert idle_only < one < more


def test_best_fixed_meets_the_slos_and_the_clock_below_it_misses_or_costs_more() -> None:
    cfg = replace(CELL, duration_s=20.0)
    best = best_fixed_generative(cfg)
    r = best.row()
    assert r["policy"] == "best-fixed" and r["meets_slos"]
    clocks = list(get_llm_profile("h100").clocks_mhz)
    assert best.fixed_mhz is not None
    below = row(replace(cfg, policy=f"fixed:{clocks[clocks.index(best.fixed_mhz) - 1]}"))
    assert not below["meets_slos"] or float(below["j_per_token"]) >= float(r["j_per_token"])


def test_the_token_policy_meets_the_slos_where_max_does_and_spends_less() -> None:
    cfg = replace(CELL, duration_s=90.0)
    top, tokens = row(replace(cfg, policy="max")), row(replace(cfg, policy="tokens"))
    assert top["meets_slos"] and tokens["meets_slos"]
    assert float(tokens["j_per_token"]) < float(top["j_per_token"])
    assert int(tokens["clock_changes"]) >= 1


def test_the_token_policy_meets_the_slos_when_clock_changes_take_200_ms() -> None:
    """Boosts for waiting prompts land late: the policy counts the latency (and what is left of
    a change it asked for) and still holds the TTFT tail."""
    cfg = replace(CELL, duration_s=90.0, clock_change_s=0.2)
    top, tokens = row(replace(cfg, policy="max")), row(replace(cfg, policy="tokens"))
    assert top["meets_slos"] and tokens["meets_slos"]
    assert float(tokens["j_per_token"]) < 0.75 * float(top["j_per_token"])


def test_workload_shapes() -> None:
    rng = np.random.default_rng(0)
    prompts, outputs = sample_lengths("conversation", 20_000, rng)
    assert np.median(prompts) == pytest.approx(1020, rel=0.05)
    assert np.median(outputs) == pytest.approx(129, rel=0.05)
    coding_prompts, coding_outputs = sample_lengths("coding", 20_000, rng)
    assert np.median(coding_outputs) < np.median(outputs)
    assert np.median(coding_prompts) > np.median(prompts)
    with pytest.raises(ValueError, match="known"):
        sample_lengths("poetry", 5, rng)
    cap = capacity_rps("h100", "conversation")
    assert cap > capacity_rps("a100", "conversation") > 0
    times = varying_arrivals(10.0, 100.0, rng, low=0.1, high=0.9, cycles=1.0)
    middle = ((times > 25) & (times < 75)).sum()  # the peak is mid-run
    assert middle > 2 * (len(times) - middle)
    arrivals, _, _ = workload(replace(CELL, load=VARYING, duration_s=60.0))
    assert len(arrivals) > 0


def test_the_command_writes_results_with_commit_and_machine(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    code = main(
        [
            "generative",
            "--loads",
            "0.3",
            "--duration-s",
            "15",
            "--policies",
            "max,default",
            "-o",
            str(out),
        ]
    )
    assert code == 0
    data = json.loads((out / "generative.json").read_text())
    assert data["provenance"]["machine"] and "commit" in data["provenance"]
    assert {r["policy"] for r in data["rows"]} == {"max", "default"}
    assert (out / "generative.csv").read_text().startswith("gpu,mix,load")
    assert "lower bound" in (out / "generative.md").read_text()
    assert main(["generative", "--mixes", "poetry", "-o", str(out)]) == 2


def test_token_parameters_are_set_by_name_and_reach_the_runs(tmp_path: Path) -> None:
    """``--tokens NAME=VALUE``: a field of the token policy or of one of its loops, of its own
    type; a loop keeps its own defaults for what is not named; a bad item is named."""
    default = TokenPolicyParams()
    params = parse_tokens(["tpot_share=0.9", "tpot_feedback.setpoint=0.95", "min-samples=10"])
    assert params.tpot_share == 0.9 and params.min_samples == 10
    assert isinstance(params.min_samples, int)
    assert params.tpot_feedback.setpoint == 0.95
    assert params.tpot_feedback.backoff == default.tpot_feedback.backoff
    assert params.ttft_feedback == default.ttft_feedback and parse_tokens([]) == default
    for bad, problem in (
        ("tpot_share", "NAME=VALUE"),
        ("nope=1", "NAME=VALUE"),
        ("tpot_feedback=1", "NAME=VALUE"),
        ("nope.setpoint=1", "NAME=VALUE"),
        ("__class__.tpot_share=1", "NAME=VALUE"),
        ("min_samples=1.5", "min_samples must be a whole number"),
        ("tpot_share=3", "tpot_share must be in"),
        ("ttft_feedback.setpoint=2", "setpoint must be in"),
        ("change_latency_s=0.2", "the simulated engine's own"),
        ("max_seqs=64", "the simulated engine's own"),
    ):
        with pytest.raises(ValueError, match=problem):
            parse_tokens([bad])
    # A run uses them: a tighter TPOT budget runs a faster clock on the same arrivals.
    base = row(replace(CELL, policy="tokens"))
    tight = row(replace(CELL, policy="tokens", params=parse_tokens(["tpot_share=0.5"])))
    assert tight["mean_clock_mhz"] > base["mean_clock_mhz"]
    out = tmp_path / "gen"
    argv = ["generative", "--loads", "0.3", "--duration-s", "15", "--policies", "tokens"]
    assert main([*argv, "--tokens", "tpot_share=0.5", "-o", str(out)]) == 0
    data = json.loads((out / "generative.json").read_text())
    assert data["tokens"] == ["tpot_share=0.5"]
    assert "tpot_share=0.5" in (out / "generative.md").read_text()
    assert main([*argv, "--tokens", "bogus=1", "-o", str(out)]) == 2
