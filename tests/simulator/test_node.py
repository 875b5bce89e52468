"""A node of several simulated GPUs: the same run as one GPU's when it has one, shares counted
over the node, placement under load, and the command line."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from dvfs.profiles import get_profile
from scheduler.__main__ import main
from scheduler.clients import parse_clients
from scheduler.placement import PlacementParams
from simulator.compare import against_one_gpu, slo_models
from simulator.node import NodeResult, simulate_node
from simulator.simulate import SimConfig, mix_capacity_rps

# Each asks for more than its weight's share of the node at 1.5× its capacity.
NICE_MIX = parse_clients("a:nice=-5,share=0.6;b:nice=0,share=0.2;c:nice=5,share=0.2")
WEIGHTS = {"a": 3121, "b": 1024, "c": 335}


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
    served = {name: result.clients[name].served_work_ms for name in WEIGHTS}
    total_w = sum(WEIGHTS.values())
    for name, weight in WEIGHTS.items():
        assert served[name] / sum(served.values()) == pytest.approx(weight / total_w, rel=0.05)
    isolation = result.isolation()
    assert isolation.deviation <= 0.05  # seed 000's metric, within 5% of ideal
    assert {c.name for c in isolation.clients} == set(WEIGHTS)
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
    assert "per GPU (energy placement)" in shown
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["gpus"] == 2 and out["placement"] == "energy" and len(out["per_gpu"]) == 2
    with pytest.raises(SystemExit):
        main(["simulate", "--gpus", "0"])
    assert "--gpus: expected at least 1, got 0" in capsys.readouterr().err
    argv = ["compare", "--gpus", "2", "--gpu", "v100", "--mixes", "resnet50:1", "--loads", "0.2",
            "--slo-multipliers", "3", "--policies", "max", "--duration-s", "2", "--jobs", "1",
            "--one-gpu-loads", "0.4", "--clients", "a:nice=-5;b:nice=5",
            "-o", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    lines = (tmp_path / "compare.csv").read_text().splitlines()
    assert len(lines) == 1 + 3 + 1  # one row per placement, and one GPU's
    assert [line.split(",")[-3:-1] for line in lines[1:]] == [
        ["2", "spread"], ["2", "energy"], ["2", "round-robin"], ["1", "spread"]
    ]  # fmt: skip
    assert "placements on the node" in capsys.readouterr().out
    results = (tmp_path / "placements.md").read_text()
    assert "- commit: " in results and "| round-robin |" in results
    data = json.loads((tmp_path / "placements.json").read_text())["results"]
    (alone,) = data["one_gpu"]
    assert alone["gpus"] == 1 and alone["load"] == 0.4
    for row in data["rows"]:  # the node at 0.2 of two GPUs' capacity, one GPU at 0.4 of its own
        assert row["vs_one_gpu"] == pytest.approx(
            row["throughput_rps"] / alone["throughput_rps"]
        ) and row["vs_one_gpu"] == pytest.approx(1.0, abs=0.1)
        shares = row["clients"]
        assert {c["nice"] for c in shares.values()} == {-5, 5}
        served = sum(c["served_work_ms"] for c in shares.values())
        assert sum(c["ideal_work_ms"] for c in shares.values()) == pytest.approx(served)
    assert "| ideal CFS share |" in results and "| a | -5 |" in results
    # The older spelling: --gpus with profile names is still the list of GPUs.
    argv = ["compare", "--gpus", "v100", "--mixes", "resnet50:1", "--loads", "0.2",
            "--slo-multipliers", "3", "--policies", "max", "--duration-s", "1", "--jobs", "1",
            "-o", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    assert len((tmp_path / "compare.csv").read_text().splitlines()) == 2


def test_a_node_is_compared_with_the_most_one_gpu_carried() -> None:
    def row(gpus: int, load: float, rps: float, policy: str = "max") -> dict[str, object]:
        return {"gpu": "v100", "mix": "resnet50:1", "slo_mult": 3.0, "seed": 0, "gpus": gpus,
                "policy": policy, "load": load, "throughput_rps": rps}  # fmt: skip

    rows = [row(1, 0.9, 700.0), row(1, 1.5, 800.0), row(1, 1.0, 780.0), row(4, 0.9, 2900.0),
            row(4, 0.9, 2000.0, "adaptive")]  # fmt: skip
    node, best = against_one_gpu(rows)
    assert [r["load"] for r in best] == [1.5]  # the largest throughput, whatever its load
    assert node[0]["vs_one_gpu"] == pytest.approx(2900.0 / 800.0)
    assert math.isnan(node[1]["vs_one_gpu"])  # no one-GPU run under that policy
