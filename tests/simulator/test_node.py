"""A node of several simulated GPUs: the same run as one GPU's when it has one, shares counted
over the node, placement under load, and the command line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dvfs.profiles import get_profile
from scheduler.__main__ import main
from scheduler.clients import parse_clients
from scheduler.placement import PlacementParams
from simulator.compare import slo_models
from simulator.node import NodeResult, simulate_node
from simulator.simulate import SimConfig, mix_capacity_rps, simulate

# Each asks for more than its weight's share of the node at 1.5× its capacity.
NICE_MIX = parse_clients("a:nice=-5,share=0.6;b:nice=0,share=0.2;c:nice=5,share=0.2")
WEIGHTS = {"a": 3121, "b": 1024, "c": 335}


def test_one_gpu_node_is_the_single_gpu_simulation() -> None:
    cfg = SimConfig(
        gpu="rtx3090",
        load=0.6,
        slo_ms=60.0,
        duration_s=3.0,
        seed=3,
        clients=tuple(parse_clients("a:nice=-5;b:priority=1")),
    )
    single, node = simulate(cfg).to_json(), simulate_node(cfg).to_json()
    for key, value in single.items():
        if key != "clients":
            same = value == node[key] or (value != value and node[key] != node[key])  # nan
            assert same, key
    for name, client in single["clients"].items():
        assert {k: node["clients"][name][k] for k in client} == client


def test_nice_weights_hold_over_four_saturated_gpus() -> None:
    cfg = SimConfig(
        gpu="v100",
        load=1.5,
        slo_ms=200.0,
        duration_s=4.0,
        gpus=4,
        clients=tuple(NICE_MIX),
        with_oracle=False,
    )
    result = simulate_node(cfg)
    shares = result.shares()
    total_w = sum(WEIGHTS.values())
    for name, weight in WEIGHTS.items():
        assert shares[name] == pytest.approx(weight / total_w, rel=0.05)
    isolation = result.node_isolation()
    assert isolation["max_error"] <= 0.05  # seed 000's metric, within 5% of ideal
    assert set(isolation["pairs"]) == {"a/b", "a/c", "b/c"}
    assert all(g.completed > 0 for g in result.per_gpu)  # every GPU served


@pytest.mark.parametrize("placement", ["spread", "energy", "round-robin"])
def test_four_gpus_carry_nine_tenths_of_their_capacity_within_the_slo(placement: str) -> None:
    models = slo_models("v100", "resnet50:1", 3.0)
    cfg = SimConfig(
        gpu="v100",
        policy="max",
        load=0.9,
        models=models,
        duration_s=3.0,
        gpus=4,
        placement=PlacementParams(placement),
        with_oracle=False,
    )
    out = simulate_node(cfg).to_json()
    one_gpu = mix_capacity_rps(get_profile("v100"), models)
    assert out["rejected"] == 0 and out["p99_over_slo"] <= 1.0
    assert out["completed"] / cfg.duration_s >= 0.97 * 3.6 * one_gpu
    assert min(g["placed"] for g in out["per_gpu"]) > 0.2 * out["requests"]


def test_energy_placement_packs_at_low_load_and_spends_less_than_spread() -> None:
    base = SimConfig(
        gpu="v100",
        policy="max",
        load=0.1,
        models=slo_models("v100", "resnet50:1", 3.0),
        duration_s=4.0,
        gpus=4,
        with_oracle=False,
    )
    runs: dict[str, NodeResult] = {
        mode: simulate_node(replace(base, placement=PlacementParams(mode)))
        for mode in ("spread", "energy", "round-robin")
    }
    spread, energy, rr = (runs[m].to_json() for m in ("spread", "energy", "round-robin"))
    assert energy["gpus_used"] < spread["gpus_used"] == rr["gpus_used"] == 4
    assert energy["energy_per_inference_j"] < 0.9 * spread["energy_per_inference_j"]
    assert energy["energy_per_inference_j"] < 0.9 * rr["energy_per_inference_j"]
    assert energy["p99_over_slo"] <= 1.0 and energy["requests"] == spread["requests"]


def test_cli_simulate_and_compare_a_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--gpus", "2", "--placement", "energy", "--load", "0.2",
            "--duration-s", "2", "--clients", "a:nice=-5;b:nice=5"]  # fmt: skip
    assert main(argv) == 0
    shown = capsys.readouterr().out
    assert "per GPU (energy placement)" in shown and "isolation metric" in shown
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["gpus"] == 2 and out["placement"] == "energy" and len(out["per_gpu"]) == 2
    with pytest.raises(SystemExit):
        main(["simulate", "--gpus", "0"])
    assert "--gpus: expected at least 1, got 0" in capsys.readouterr().err
    argv = ["compare", "--gpus", "2", "--gpu", "v100", "--mixes", "resnet50:1", "--loads", "0.2",
            "--slo-multipliers", "3", "--policies", "max", "--duration-s", "2", "--jobs", "1",
            "-o", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    lines = (tmp_path / "compare.csv").read_text().splitlines()
    assert len(lines) == 1 + 3  # one row per placement
    assert {line.split(",")[-2] for line in lines[1:]} == {"spread", "energy", "round-robin"}
    assert "placements on the node" in capsys.readouterr().out
    # The older spelling: --gpus with profile names is still the list of GPUs.
    argv = ["compare", "--gpus", "v100", "--mixes", "resnet50:1", "--loads", "0.2",
            "--slo-multipliers", "3", "--policies", "max", "--duration-s", "1", "--jobs", "1",
            "-o", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    assert len((tmp_path / "compare.csv").read_text().splitlines()) == 2
