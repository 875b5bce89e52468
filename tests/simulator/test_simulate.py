from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from dvfs.profiles import get_profile
from scheduler.__main__ import main
from scheduler.clients import ClientSpec, parse_clients
from simulator.compare import DEFAULT_MIX, plot, slo_models
from simulator.simulate import SimConfig, simulate
from simulator.workload import bursty_arrivals, trace_arrivals

NICE_MIX = parse_clients("a:nice=-5,share=0.34;b:nice=0,share=0.33;c:nice=5,share=0.33")


def test_a_seeded_simulation_is_exactly_reproducible() -> None:
    cfg = SimConfig(gpu="rtx3090", policy="slack", load=0.5, slo_ms=30.0, duration_s=5.0, seed=7)
    first, again = simulate(cfg).to_json(), simulate(cfg).to_json()
    assert first == again
    other = simulate(SimConfig(**{**cfg.__dict__, "seed": 8})).to_json()
    assert other["energy_j"] != first["energy_j"]


def test_json_has_every_documented_field() -> None:
    out = simulate(SimConfig(duration_s=2.0)).to_json()
    for key in (
        "policy",
        "gpu",
        "requests",
        "completed",
        "rejected",
        "throughput_rps",
        "energy_j",
        "energy_per_inference_j",
        "oracle_energy_j",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "slo_attainment",
        "p99_over_slo",
        "misses_past_p99",
        "mean_batch",
        "clock_changes",
        "mean_clock_mhz",
        "models",
        "clients",
    ):
        assert key in out
    for key in ("completed", "p99_ms", "slo_attainment", "service_ms"):
        assert key in out["clients"]["default"]


def test_misses_past_the_p99_count_the_requests_that_decided_it() -> None:
    """Over the SLO by some requests, or under it with room: counted from the latencies, and
    on the side of the SLO the p99 is."""
    past = []
    for slo_ms, rate_rps in ((8.0, 100.0), (60.0, 60.0)):
        res = simulate(
            SimConfig(
                gpu="v100", policy="max", load=None, rate_rps=rate_rps, slo_ms=slo_ms,
                duration_s=5.0,
            )
        )  # fmt: skip
        latencies = np.asarray(res.latencies_ms)
        over = int((latencies > slo_ms).sum())
        assert res.misses_past_p99() == pytest.approx(over - 0.01 * len(latencies))
        # More than 1% over the SLO exactly when the p99 is over it (up to the one request
        # the percentile interpolates across).
        assert (res.misses_past_p99() > 1) <= (res.p99_over_slo() > 1)
        assert (res.misses_past_p99() < -1) <= (res.p99_over_slo() <= 1)
        assert res.to_json()["misses_past_p99"] == res.misses_past_p99()
        past.append(res.misses_past_p99())
    assert past[0] > 1 and past[1] < -1  # too tight an SLO, and one with room


def test_saturated_clients_get_gpu_time_in_the_ratio_of_their_weights() -> None:
    out = simulate(
        SimConfig(
            gpu="v100",
            policy="slack",
            load=3.0,
            slo_ms=200.0,
            duration_s=20.0,
            clients=tuple(NICE_MIX),
        )
    ).to_json()
    service = {k: v["service_ms"] for k, v in out["clients"].items()}
    total = sum(service.values())
    weights = {"a": 3121, "b": 1024, "c": 335}
    # Within 6%: a batch (up to 32 requests, several flows' among them) is the unit of GPU
    # time, and every request in it is charged the batch's whole time.
    for name, w in weights.items():
        assert service[name] / total == pytest.approx(w / sum(weights.values()), rel=0.06)
        assert out["clients"][name]["completed"] > 0  # nobody starves


def test_a_priority_client_keeps_its_tail_while_another_floods() -> None:
    """At 3× capacity the flood is refused in part; the priority client's requests overtake
    it in the queue and wait at most for the batches already at Triton."""
    clients = parse_clients("vip:priority=1,share=0.05;flood:share=0.95")
    out = simulate(
        SimConfig(
            gpu="v100",
            policy="slack",
            load=3.0,
            slo_ms=150.0,
            duration_s=10.0,
            clients=tuple(clients),
        )
    ).to_json()
    vip, flood = out["clients"]["vip"], out["clients"]["flood"]
    assert vip["rejected"] == 0
    assert vip["p99_ms"] <= 150.0 and vip["slo_attainment"] >= 0.99
    assert flood["completed"] > 0 and flood["rejected"] > 0


def test_slack_saves_energy_against_max_and_meets_the_slo() -> None:
    models = slo_models("titanrtx", DEFAULT_MIX, 3.0)
    base = dict(gpu="titanrtx", load=0.3, models=models, duration_s=20.0)
    slack = simulate(SimConfig(policy="slack", **base)).to_json()  # type: ignore[arg-type]
    top = simulate(SimConfig(policy="max", **base)).to_json()  # type: ignore[arg-type]
    assert slack["p99_over_slo"] <= 1.0 and top["p99_over_slo"] <= 1.0
    assert slack["energy_per_inference_j"] < 0.85 * top["energy_per_inference_j"]
    assert slack["oracle_energy_j"] < slack["energy_j"]


def test_adaptive_uses_the_room_slack_leaves_and_keeps_the_tail() -> None:
    models = slo_models("rtx3090", DEFAULT_MIX, 3.0)
    base = dict(gpu="rtx3090", load=0.3, models=models, duration_s=20.0, with_oracle=False)
    slack = simulate(SimConfig(policy="slack", **base)).to_json()  # type: ignore[arg-type]
    adaptive = simulate(SimConfig(policy="adaptive", **base)).to_json()  # type: ignore[arg-type]
    assert slack["p99_over_slo"] < 0.8  # slack's fixed margins leave a fifth of the SLO unused
    assert slack["p99_over_slo"] < adaptive["p99_over_slo"] <= 1.0
    assert adaptive["mean_clock_mhz"] < slack["mean_clock_mhz"]
    assert adaptive["energy_per_inference_j"] < 0.9 * slack["energy_per_inference_j"]


def test_arrival_processes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    bursty = bursty_arrivals(100.0, 60.0, rng)
    assert len(bursty) == pytest.approx(6000, rel=0.15)
    counts = np.histogram(bursty, bins=600)[0]
    assert counts.var() > 3 * counts.mean()  # burstier than Poisson (variance = mean)
    trace = tmp_path / "trace.txt"
    trace.write_text("# seconds\n0.5\n0.1\n\n0.2\n")
    assert list(trace_arrivals(trace)) == [0.1, 0.2, 0.5]
    out = simulate(SimConfig(arrival="trace", trace=trace, duration_s=1.0, with_oracle=False))
    assert out.requests == out.completed == 3
    trace.write_text("0.1\nsoon\n")
    with pytest.raises(ValueError, match=r"trace.txt:2: not a number of seconds"):
        trace_arrivals(trace)


def test_client_specs() -> None:
    assert NICE_MIX[0] == ClientSpec("a", 0.34, 0, -5, None)
    assert parse_clients("x:slo_ms=80,priority=1")[0].slo_ms == 80.0
    for bad, msg in [
        ("a:nice=30", "nice must be in"),
        ("a:speed=1", "is not one of"),
        ("a:share=0", "share must be > 0"),
        (":nice=1", "a name comes before"),
        ("a:nice=x", "must be a number"),
        ("a:;a:", "unique"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_clients(bad)


def test_cli_simulate_json_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "simulate",
                "--gpu",
                "v100",
                "--policy",
                "seed",
                "--load",
                "0.3",
                "--slo-ms",
                "30",
                "--duration-s",
                "3",
                "--seed",
                "1",
                "--json",
            ]
        )
        == 0
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    out = json.loads(last)
    assert (out["policy"], out["gpu"], out["seed"]) == ("seed", "v100", 1)
    assert main(["simulate", "--policy", "fast"]) == 2
    assert "--policy must be one of" in capsys.readouterr().err
    assert main(["simulate", "--clients", "a:nice=99"]) == 2


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--loads", "-1"), ("--loads", "0.3,0"), ("--loads", "inf"), ("--slo-multipliers", "nan")],
)
def test_cli_compare_refuses_a_load_or_slo_not_above_zero(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused by the argument parser, before any cell runs."""
    with pytest.raises(SystemExit):
        main(["compare", flag, value])
    err = capsys.readouterr().err
    assert f"argument {flag}: expected comma-separated finite numbers > 0, got {value!r}" in err


def test_cli_simulate_best_fixed_names_its_clock(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--policy", "best-fixed", "--load", "0.3", "--duration-s", "3", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["policy"] == "best-fixed" and out["fixed_mhz"] in get_profile("v100").clocks_mhz
    assert out["p99_over_slo"] <= 1.0


def test_cli_compare_writes_table_csv_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "compare",
                "--gpus",
                "v100",
                "--loads",
                "0.3",
                "--slo-multipliers",
                "4",
                "--seeds",
                "0,1",
                "--policies",
                "max,slack,adaptive,best-fixed",
                "--duration-s",
                "3",
                "--jobs",
                "1",
                "-o",
                str(tmp_path),
            ]
        )
        == 0
    )
    lines = (tmp_path / "compare.csv").read_text().splitlines()
    assert lines[0].startswith("gpu,mix,arrival,load,slo_mult,seed,policy,")
    assert len(lines) == 1 + 2 * 5  # 2 seeds × 4 policies, and one clock for both seeds
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"
    out = capsys.readouterr().out
    assert "adaptive" in out and "where the best single clock (best-fixed) meets p99" in out
    # The results file: every run, the summary, where and from what code they came.
    written = json.loads((tmp_path / "compare.json").read_text())
    results, provenance = written["results"], written["provenance"]
    assert len(results["rows"]) == 10 and provenance["commit"] and provenance["machine"]
    summary = {(s["baseline"], s["policy"]) for s in results["summary"]}
    assert summary == {
        (baseline, policy)
        for baseline in ("best-fixed", "best-fixed-cell")
        for policy in ("max", "slack", "adaptive")
    } | {("best-fixed", "best-fixed-cell")}
    # One clock for both seeds, against each seed's own: it meets the p99 on every seed.
    cell_row = next(s for s in results["summary"] if s["policy"] == "best-fixed-cell")
    assert cell_row["cells"] == 2 and cell_row["meets"] == 2
    # One clock for both seeds, meeting the tail on each; every run is measured against it.
    per_cell = [r for r in results["rows"] if r["policy"] == "best-fixed-cell"]
    assert len({r["fixed_mhz"] for r in per_cell}) == 1
    assert all(r["p99_over_slo"] <= 1.0 for r in per_cell)
    for r in results["rows"]:
        same = next(c for c in per_cell if c["seed"] == r["seed"])
        assert r["vs_best_fixed_cell"] == pytest.approx(
            r["energy_per_inference_j"] / same["energy_per_inference_j"]
        )
    assert "where one clock per cell (best-fixed-cell) meets p99" in out
    page = (tmp_path / "compare.md").read_text()
    assert "- commit: " in page and "- machine: " in page
    assert "## Summary over cells" in page and "## adaptive, per cell" in page
    assert "## Against one clock per cell" in page and "## best-fixed-cell" not in page
    assert "vs best-fixed" in page and "closed" in page
    # By how many requests each cell's p99 was decided, the policy's and best-fixed's.
    assert "past the p99 (worst; best-fixed)" in page
    row = next(line for line in page.splitlines() if line.startswith("| v100 |"))
    assert re.search(r"\| ([+-]\d+|0); ([+-]\d+|0) \|$", row)


def test_cli_compare_takes_the_policy_parameters_of_a_sidecar_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--config``: a sidecar's TOML file tunes ``adaptive`` as it does live; the page names
    what it set; a wrong key or value is a clear error, exit 2."""
    argv = [
        "compare", "--matrix", "steady", "--gpu", "v100", "--loads", "0.3",
        "--slo-multipliers", "2", "--seeds", "0", "--policies", "adaptive",
        "--duration-s", "5", "--jobs", "1",
    ]  # fmt: skip
    rows = []
    for name, text in (("default", ""), ("tuned", "[policy.feedback]\nsetpoint = 0.5\n")):
        config = tmp_path / f"{name}.toml"
        config.write_text(f'triton_url = "localhost:8000"\n{text}')
        out = tmp_path / name
        assert main([*argv, "--config", str(config), "-o", str(out)]) == 0
        rows += json.loads((out / "compare.json").read_text())["results"]["rows"]
    tuned_page = (tmp_path / "tuned/compare.md").read_text()
    assert "apart from the defaults: `--feedback-setpoint=0.5`." in tuned_page
    assert "apart from the defaults" not in (tmp_path / "default/compare.md").read_text()
    # A setpoint at half the SLO runs faster clocks: more energy, a shorter tail.
    default, tuned = rows
    assert tuned["mean_clock_mhz"] > default["mean_clock_mhz"]
    assert tuned["p99_ms"] < default["p99_ms"]
    capsys.readouterr()
    for text, says in (
        ("[policy.feedback]\nsetpiont = 0.9\n", "unknown key 'policy.feedback.setpiont'"),
        ("[policy.feedback]\nsetpoint = 1.5\n", "setpoint must be in (0, 1], got 1.5"),
    ):
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        assert main([*argv, "--config", str(bad), "-o", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert f"--config {bad}" in err and says in err


def test_cli_compare_sets_the_gpus_clock_change_delay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--clock-change-ms`` reaches the simulated GPU, and the policy plans with it (unless a
    ``--config`` sets its own): a raise that lands 40 ms late, past the 14 ms SLO, costs the
    tail of the requests that arrive to a GPU below the clock they need (at load 0.5, once the
    class, started at the top clock, walks below what the load needs); the page says both. A
    policy configured with less learns the GPU's delay from its own raises."""
    argv = [
        "compare", "--matrix", "steady", "--gpu", "v100", "--loads", "0.5",
        "--slo-multipliers", "2", "--seeds", "0", "--policies", "adaptive",
        "--duration-s", "5", "--jobs", "1",
    ]  # fmt: skip
    rows = {}
    for ms in ("0", "40"):
        out = tmp_path / ms
        assert main([*argv, "--clock-change-ms", ms, "-o", str(out)]) == 0
        (rows[ms],) = json.loads((out / "compare.json").read_text())["results"]["rows"]
    assert rows["40"]["p99_ms"] > 1.5 * rows["0"]["p99_ms"]
    page = (tmp_path / "40/compare.md").read_text()
    assert "land a clock change 40 ms after" in page
    assert "apart from the defaults: `--slack-change-delay-ms=40.0`." in page
    config = tmp_path / "plans-5.toml"
    config.write_text("[policy.slack]\nchange_delay_ms = 5\n")
    out = tmp_path / "own"
    assert main([*argv, "--clock-change-ms", "40", "--config", str(config), "-o", str(out)]) == 0
    page = (out / "compare.md").read_text()
    assert "land a clock change 40 ms after" in page and "apart from the defaults" not in page
    # Planning with 5 ms on a GPU that takes 20, the policy times its raises and plans with
    # what they take; told not to learn, it keeps 5 ms: at a low load nearly every request
    # arrives to a GPU below the clock it needs, and the tail pays for it. A minute of
    # arrivals: in the first seconds the class is still settling, and a few requests decide
    # a shorter run's p99 either way.
    rows = {}
    for learn in ("true", "false"):
        config.write_text(f"[policy.slack]\nchange_delay_ms = 5\nlearn_change_delay = {learn}\n")
        out = tmp_path / f"learn-{learn}"
        low = [
            *argv[:6],
            "0.1",
            "--slo-multipliers",
            "3",
            *argv[9:13],
            "--duration-s",
            "60",
            "--jobs",
            "1",
        ]
        assert main([*low, "--clock-change-ms", "20", "--config", str(config), "-o", str(out)]) == 0
        (rows[learn],) = json.loads((out / "compare.json").read_text())["results"]["rows"]
    assert rows["true"]["p99_over_slo"] <= 1.0 < rows["false"]["p99_over_slo"]
    assert rows["true"]["energy_per_inference_j"] < rows["false"]["energy_per_inference_j"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--clock-change-ms", "-1", "-o", str(tmp_path / "bad")])
    assert refused.value.code == 2 and "finite milliseconds >= 0" in capsys.readouterr().err
    assert SimConfig(gpu="v100").gpu_profile == get_profile("v100")
    assert SimConfig(gpu="v100", clock_change_ms=12).gpu_profile.clock_change_delay_s == 0.012


def test_cli_tune_sweeps_an_adaptive_parameter_against_best_fixed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tune --policy adaptive``: each value of one ``[policy.feedback]`` parameter runs on the
    same arrivals as ``max`` and ``best-fixed`` (run once); the table and the page give, per
    value, the pairs where ``best-fixed`` meets the p99 and the policy's figures against it,
    over the matrix and per cell."""
    out = tmp_path / "tune"
    argv = [
        "tune", "--policy", "adaptive", "--param", "setpoint", "--values", "0.5,0.97",
        "--matrix", "steady", "--gpu", "v100", "--loads", "0.3", "--slo-multipliers", "3,6",
        "--seeds", "0", "--duration-s", "5", "--jobs", "1", "-o", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    assert "adaptive setpoint over the steady matrix" in capsys.readouterr().out
    rows = json.loads((out / "tune-adaptive-setpoint.json").read_text())["results"]["rows"]
    whole = {r["value"]: r for r in rows if r["cell"] is None}
    cells = [r for r in rows if r["cell"] is not None]
    assert set(whole) == {0.5, 0.97} and len(cells) == 4  # two cells × two values
    assert all(r["policy"] == "adaptive" and r["cells"] == 2 for r in whole.values())
    assert {tuple(r["cell"][:5]) for r in cells} == {
        ("v100", "resnet50:1", "poisson", 0.3, 3.0),
        ("v100", "resnet50:1", "poisson", 0.3, 6.0),
    }
    # The value reaches the policy: a setpoint at half the SLO runs faster, spending more.
    assert whole[0.5]["mean_vs_best_fixed"] > whole[0.97]["mean_vs_best_fixed"]
    page = (out / "tune-adaptive-setpoint.md").read_text()
    assert "- commit: " in page and "`adaptive` with `setpoint` at each value" in page
    assert "Per cell, seeds together:" in page and "policies max, best-fixed." in page
    assert "| 0.97 | 2 |" in page and "| v100 | resnet50:1 | 0.3 | 6 | 0.5 | 1 |" in page


def test_cli_tune_full_runs_five_seeds_and_three_without(tmp_path: Path) -> None:
    """``--full`` is five seeds for ``tune`` as for ``compare``; with neither it nor
    ``--seeds``, three."""
    argv = [
        "tune", "--param", "arrival_quantile", "--values", "0.05", "--matrix", "steady",
        "--gpu", "v100", "--loads", "0.3", "--slo-multipliers", "6", "--duration-s", "2",
        "--jobs", "1",
    ]  # fmt: skip
    for extra, seeds in ((["--full"], "seeds 0, 1, 2, 3, 4;"), ([], "seeds 0, 1, 2;")):
        out = tmp_path / str(len(extra))
        assert main([*argv, *extra, "-o", str(out)]) == 0
        assert seeds in (out / "tune-slack-arrival_quantile.md").read_text()


@pytest.mark.parametrize(
    ("policy", "param", "values", "says"),
    [
        ("adaptive", "setpiont", "0.9", "unknown parameter 'setpiont'; known: target, setpoint"),
        ("adaptive", "min_samples", "2.5", "min_samples takes whole numbers, got 2.5"),
        ("adaptive", "raise_quantile", "0.9", "raise_quantile is a str, not a number"),
        ("adaptive", "setpoint", "0.9,1.5", "setpoint must be in (0, 1], got 1.5"),
        ("slack", "setpoint", "0.9", "unknown parameter 'setpoint'; known: batch_hold"),
    ],
)
def test_cli_tune_refuses_a_parameter_or_value_before_it_runs(
    policy: str,
    param: str,
    values: str,
    says: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """An unknown parameter, one that is not a number, a fraction for a whole number or a value
    the policy refuses: exit 2 with the reason, before any run (nothing written)."""
    argv = [
        "tune", "--policy", policy, "--param", param, "--values", values, "--gpu", "v100",
        "--loads", "0.3", "--slo-multipliers", "3", "--seeds", "0", "-o", str(tmp_path / "o"),
    ]  # fmt: skip
    assert main(argv) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_compare_plot_leaves_out_a_policy_with_no_run_in_a_cell(tmp_path: Path) -> None:
    """``best-fixed-cell`` has no run where no clock meets the p99 on every seed: its bar is
    left out there (no mean of nothing, no warning)."""

    def row(load: float, policy: str, vs_max: float) -> dict[str, object]:
        return {
            "gpu": "v100", "load": load, "slo_mult": 2.0, "policy": policy, "vs_max": vs_max,
            "p99_over_slo": 0.9, "energy_per_inference_j": vs_max,
            "oracle_energy_per_inference_j": 0.5,
        }  # fmt: skip

    rows = [row(0.1, "max", 1.0), row(0.3, "max", 1.0), row(0.3, "best-fixed-cell", 0.8)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = plot(rows, tmp_path / "compare.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_cli_compare_varying_matrix_reports_the_distance_to_the_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "compare", "--matrix", "varying", "--gpu", "v100", "--loads", "0.9",
        "--slo-multipliers", "3", "--policies", "max,adaptive,best-fixed",
        "--duration-s", "20", "--jobs", "1", "-o", str(tmp_path),
    ]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads((tmp_path / "compare.json").read_text())["results"]["rows"]
    assert {r["arrival"] for r in rows} == {"day:diurnal"}
    fixed = next(r for r in rows if r["policy"] == "best-fixed")
    mine = next(r for r in rows if r["policy"] == "adaptive")
    # The bound is the cell's: below every run, and closed is measured against it.
    bound = fixed["oracle_energy_per_inference_j"]
    assert bound < mine["energy_per_inference_j"] and bound < fixed["energy_per_inference_j"]
    expected = (fixed["energy_per_inference_j"] - mine["energy_per_inference_j"]) / (
        fixed["energy_per_inference_j"] - mine["oracle_energy_per_inference_j"]
    )
    assert mine["closed"] == pytest.approx(expected)
    assert "varying matrix" in capsys.readouterr().out
