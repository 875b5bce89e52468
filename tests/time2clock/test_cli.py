from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dvfs.profiles import CNN, TRANSFORMER, get_profile
from dvfs.simulated import SimulatedDevice
from dvfs.timesource import VirtualTime
from time2clock.__main__ import main
from time2clock.fit import fit_model_table, fit_table, read_measurements, write_measurements
from time2clock.profile import SimulatedMeasurer, select_clocks, sweep
from time2clock.table import TableSet

M1, B1 = 6e-5, 0.0085  # batch 1
M4, B4 = 2.4e-5, 0.0035  # batch 4


def law(m: float, b: float, clock: float) -> float:
    return 1.0 / (m * clock + b)


def test_fit_then_clock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clocks = range(300, 2101, 300)
    samples = {
        "inception": {
            1: {c: [law(M1, B1, c)] * 5 for c in clocks},
            4: {c: [law(M4, B4, c)] * 5 for c in clocks},
        }
    }
    write_measurements(tmp_path / "m.csv", samples)
    fit = ["fit", str(tmp_path / "m.csv"), "-o", str(tmp_path / "t.json"), "--gpu", "titanrtx"]
    assert main(fit) == 0
    data = json.loads((tmp_path / "t.json").read_text())
    assert (data["version"], data["gpu"], list(data["models"])) == (2, "titanrtx", ["inception"])
    curves = data["models"]["inception"]["curves"]
    assert curves["1"]["concurrency"] == 1 and curves["4"]["batch"] == 4
    assert curves["1"]["m"] == pytest.approx(M1) and curves["4"]["b"] == pytest.approx(B4)
    table = TableSet.load(tmp_path / "t.json").get("inception")
    assert table is not None
    capsys.readouterr()

    def clock(*extra: str) -> tuple[str, str]:
        assert main(["clock", str(tmp_path / "t.json"), *extra]) == 0
        out = capsys.readouterr()
        return out.out.strip().splitlines()[-1], out.err

    # SLO 30 ms with 3 ahead, one at a time: 4 executions of batch 1 -> 7.5 ms each.
    expected = min(c for c in table.clocks_mhz if 4 * law(M1, B1, c) <= 30.0)
    assert clock("--slo-ms", "30", "--queue", "3")[0] == str(expected)
    # Same queue in batches of 4: one execution of 4.
    expected = min(c for c in table.clocks_mhz if law(M4, B4, c) <= 30.0)
    assert clock("--slo-ms", "30", "--queue", "3", "--batch", "4")[0] == str(expected)
    # 6 ahead in batches of 4: one execution of 4, then one of 3 (interpolated between 1 and 4).
    for c in table.clocks_mhz:
        t3 = law(M1, B1, c) + (law(M4, B4, c) - law(M1, B1, c)) * 2 / 3
        if law(M4, B4, c) + t3 <= 50.0:
            break
    assert clock("--slo-ms", "50", "--queue", "6", "--batch", "4", "--model", "inception")[0] == (
        str(c)
    )
    last, err = clock("--slo-ms", "1", "--batch", "4")
    assert last == "2100" and "no clock meets 1.0 ms with 0 queued in batches of 4" in err
    assert main(["clock", str(tmp_path / "t.json"), "--slo-ms", "-1"]) == 2
    assert main(["clock", str(tmp_path / "t.json"), "--slo-ms", "9", "--batch", "0"]) == 2
    assert main(["clock", str(tmp_path / "t.json"), "--slo-ms", "9", "--model", "x"]) == 2
    assert "has no table of 'x'; it has: inception" in capsys.readouterr().err
    assert (
        main(["fit", str(tmp_path / "m.csv"), "-o", str(tmp_path / "x.json"), "--trim", "0.6"]) == 2
    )
    assert "trim must be in [0, 0.5)" in capsys.readouterr().err
    assert main([*fit, "--model", "resnet"]) == 2
    assert "no measurements of 'resnet'; it has: inception" in capsys.readouterr().err


def test_clock_reads_a_version_1_table_and_asks_for_a_model_when_there_are_several(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    curve = fit_table({c: [law(M1, B1, c)] * 3 for c in range(300, 2101, 300)}, concurrency=2)
    curve.save(tmp_path / "v1.json")
    # Version 1, concurrency 2: seed 003's ceil((Q+1)/2) rounds of one request.
    assert main(["clock", str(tmp_path / "v1.json"), "--slo-ms", "30", "--queue", "3"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == str(curve.lowest_clock_mhz(15.0)[0])
    assert "is a version-1 time2clock table" in caplog.text
    two = TableSet(
        fit_model_table({1: {c: [k * law(M1, B1, c)] * 3 for c in (300, 2100)}}, gpu="g", model=n)
        for n, k in (("a", 1.0), ("b", 3.0))
    )
    two.save(tmp_path / "two.json")
    assert main(["clock", str(tmp_path / "two.json"), "--slo-ms", "30"]) == 2
    assert "holds tables of a, b: pick one with --model" in capsys.readouterr().err
    assert main(["clock", str(tmp_path / "two.json"), "--slo-ms", "30", "--model", "b"]) == 0
    assert int(capsys.readouterr().out) > 300


def test_profile_simulated_writes_csv_table_and_plot(tmp_path: Path) -> None:
    out = tmp_path / "prof"
    assert (
        main(
            [
                "profile",
                "--device",
                "sim:v100",
                "--clocks",
                "12",
                "--requests-per-clock",
                "10",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    tables = TableSet.load(out / "table.json")
    [table] = list(tables)
    # The profile's default model, at the default batch sizes, one execution at a time.
    assert table.model == get_profile("v100").default_model and table.batches == [1, 2, 4, 8]
    assert len(table.clocks_mhz) == 12 and table.curve(1).concurrency == 1
    # Energy per inference was measured at every clock; its minimum lies inside the ladder.
    best = table.energy_optimal_clock_mhz()
    assert best is not None and table.clocks_mhz[0] < best < table.clocks_mhz[-1]
    assert (out / "fit.png").read_bytes()[:4] == b"\x89PNG"
    measured = read_measurements(out / "measurements.csv")
    assert set(measured) == {table.model}
    assert {b: len(s) for b, s in measured[table.model].items()} == {b: 12 for b in table.batches}
    assert (
        main(
            [
                "plot",
                str(out / "table.json"),
                "-o",
                str(tmp_path / "p.png"),
                "--measurements",
                str(out / "measurements.csv"),
            ]
        )
        == 0
    )
    assert (tmp_path / "p.png").stat().st_size > 10_000
    assert main(["profile", "--device", "nvml:0", "-o", str(out)]) == 2


def test_profile_every_model_of_a_simulated_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prof"
    base = ["profile", "--device", "sim:v100", "--clocks", "10", "--requests-per-clock", "20"]
    assert main([*base, "--model", "all", "-o", str(out)]) == 0
    gpu = get_profile("v100")
    tables = TableSet.load(out / "table.json")
    assert tables.models == sorted(gpu.models) and len(tables) >= 2
    assert set(read_measurements(out / "measurements.csv")) == set(gpu.models)
    for table in tables:
        law = gpu.models[table.model]
        assert table.gpu == "v100"
        assert table.batches == [b for b in (1, 2, 4, 8) if b <= law.max_batch]
        for batch in table.batches:
            for clock in (table.clocks_mhz[0], table.clocks_mhz[-1]):
                # Each curve recovers its own model's law at its own batch size.
                assert table.predict_ms(clock, batch) == pytest.approx(
                    law.mean_latency_ms(clock, batch), rel=0.05
                )
    small, big = (tables.get(m) for m in (CNN, TRANSFORMER))
    assert small is not None and big is not None
    assert big.predict_ms(900, 4) > 2 * small.predict_ms(900, 4)
    capsys.readouterr()
    slo = ["clock", str(out / "table.json"), "--slo-ms", "60", "--queue", "7", "--batch", "4"]
    assert main([*slo, "--model", CNN]) == 0
    cnn_clock = int(capsys.readouterr().out)
    assert main([*slo, "--model", TRANSFORMER]) == 0
    assert int(capsys.readouterr().out) > cnn_clock
    # One named model; unknown models and batches past a model's largest are refused.
    assert (
        main([*base, "--model", TRANSFORMER, "--batches", "1,16", "-o", str(tmp_path / "b")]) == 0
    )
    assert TableSet.load(tmp_path / "b" / "table.json").get(TRANSFORMER) is not None
    assert main([*base, "--model", "nosuch", "-o", str(tmp_path / "x")]) == 2
    assert "sim:v100 has no model 'nosuch'" in capsys.readouterr().err
    assert main([*base, "--model", TRANSFORMER, "--batches", "64", "-o", str(tmp_path / "x")]) == 2
    assert f"exceeds {TRANSFORMER}'s largest batch" in capsys.readouterr().err


def test_simulated_executions_share_the_gpu_and_energy_is_per_request() -> None:
    gpu = get_profile("v100")
    clock = gpu.clocks_mhz[len(gpu.clocks_mhz) // 2]
    for batch in (1, 8):
        sim = SimulatedMeasurer.for_profile("v100", seed=3, model=TRANSFORMER)
        result = sweep(sim.device, sim, [clock], batches=(batch,), requests_per_clock=200)
        law = gpu.models[TRANSFORMER]
        alone_ms = law.mean_latency_ms(clock, batch)
        assert np.mean(result.samples[batch][clock]) == pytest.approx(alone_ms, rel=0.03)
        assert result.energy_per_inference_j[batch][clock] == pytest.approx(
            law.energy_per_inference_j(clock, batch), rel=0.05
        )
        # Two in flight share the GPU: each takes about twice as long as alone.
        sim = SimulatedMeasurer.for_profile("v100", seed=3, model=TRANSFORMER)
        shared = sweep(sim.device, sim, [clock], batches=(batch,), concurrency=2).samples
        assert np.mean(shared[batch][clock][1:-1]) == pytest.approx(2 * alone_ms, rel=0.05)


def test_simulated_sweep_is_seeded_and_recovers_the_profile() -> None:
    def run(seed: int) -> dict[int, list[float]]:
        sim = SimulatedMeasurer.for_profile("titanrtx", seed=seed)
        return sweep(
            sim.device,
            sim,
            select_clocks(sim.device.supported_clocks_mhz(), 25),
            requests_per_clock=20,
        ).samples[1]

    assert run(1) == run(1)
    assert run(1) != run(2)
    sim = SimulatedMeasurer.for_profile("titanrtx", seed=1)
    table = fit_table(run(1))
    p = sim.device.profile
    for clock in (300, 1200, 2100):
        assert table.predict_ms(clock) == pytest.approx(p.mean_latency_ms(clock), rel=0.05)


def test_sweep_counts_clock_batch_steps_and_energy_per_request() -> None:
    vt = VirtualTime()

    class Recorder:
        """Pretends each execution of `batch` takes `batch` ms of (virtual) device time."""

        def __init__(self, device: SimulatedDevice) -> None:
            self.device = device
            self.calls: list[tuple[int, int, int]] = []

        def settle(self) -> None:
            vt.advance_by(0.1)

        def measure(self, requests: int, concurrency: int, batch: int = 1) -> list[float]:
            self.calls.append((self.device.clock_mhz(), concurrency, batch))
            vt.advance_by(requests * batch / 1000.0)
            return [float(batch)] * requests

    dev = SimulatedDevice("v100", time_source=vt, rng=np.random.default_rng(0))
    clocks = dev.supported_clocks_mhz()[::40]
    rec = Recorder(dev)
    steps: list[tuple[int, int]] = []
    result = sweep(
        dev,
        rec,
        clocks,
        batches=(1, 4),
        requests_per_clock=5,
        progress=lambda done, total: steps.append((done, total)),
    )
    assert steps == [(i + 1, 2 * len(clocks)) for i in range(2 * len(clocks))]
    assert [(b, c) for c, _, b in rec.calls] == [(b, c) for c in clocks for b in (1, 4)]
    assert {conc for _, conc, _ in rec.calls} == {1}
    assert result.samples == {b: {c: [float(b)] * 5 for c in clocks} for b in (1, 4)}
    # Energy is per request: batch 4 ran 4x as long per execution, so per request it is the same.
    for c in clocks:
        per_request = result.energy_per_inference_j
        assert per_request[4][c] == pytest.approx(per_request[1][c], rel=1e-6)
        assert per_request[1][c] > 0
    # A locked idle GPU draws more at a higher clock.
    assert per_request[1][clocks[-1]] > per_request[1][clocks[0]]
    assert not dev.is_locked()
    with pytest.raises(ValueError, match="batch sizes must be >= 1"):
        sweep(dev, rec, clocks, batches=(0,))


def test_sweep_gives_the_clock_back_even_when_measuring_fails() -> None:
    vt = VirtualTime()
    dev = SimulatedDevice("v100", time_source=vt, rng=np.random.default_rng(0))

    class Broken:
        def measure(self, requests: int, concurrency: int, batch: int = 1) -> list[float]:
            raise RuntimeError("server went away")

    clocks = dev.supported_clocks_mhz()
    with pytest.raises(RuntimeError):
        sweep(dev, Broken(), [clocks[10], clocks[50]])
    assert not dev.is_locked()


def test_select_clocks_spreads_over_the_ladder() -> None:
    ladder = list(range(100, 1001, 10))
    assert select_clocks(ladder, None) == ladder
    picked = select_clocks(ladder, 5)
    assert picked[0] == 100 and picked[-1] == 1000 and len(picked) == 5
    with pytest.raises(ValueError):
        select_clocks(ladder, 1)


def test_batches_option_is_validated(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["profile", "--batches", "1,x"])
    assert "expected batch sizes like 1,2,4,8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["profile", "--batches", "0,2"])
    assert "batch sizes must be integers >= 1" in capsys.readouterr().err
