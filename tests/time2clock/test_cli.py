from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dvfs.simulated import SimulatedDevice
from dvfs.timesource import VirtualTime
from time2clock.__main__ import main
from time2clock.fit import write_measurements
from time2clock.profile import SimulatedMeasurer, select_clocks, sweep
from time2clock.table import Time2ClockTable


def test_fit_then_clock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = {c: [1.0 / (6e-5 * c + 0.0085)] * 5 for c in range(300, 2101, 300)}
    write_measurements(tmp_path / "m.csv", samples)
    assert (
        main(
            [
                "fit",
                str(tmp_path / "m.csv"),
                "-o",
                str(tmp_path / "t.json"),
                "--gpu",
                "titanrtx",
                "--model",
                "inception",
                "--trim",
                "0.2",
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "t.json").read_text())
    assert (data["gpu"], data["model"], data["concurrency"]) == ("titanrtx", "inception", 2)
    assert data["m"] == pytest.approx(6e-5) and data["b"] == pytest.approx(0.0085)
    capsys.readouterr()
    # SLO 30 ms with 3 ahead at concurrency 2 -> 2 rounds -> 15 ms budget.
    assert main(["clock", str(tmp_path / "t.json"), "--slo-ms", "30", "--queue", "3"]) == 0
    out = capsys.readouterr()
    expected = Time2ClockTable.load(tmp_path / "t.json").lowest_clock_mhz(15.0)[0]
    assert out.out.strip().splitlines()[-1] == str(expected)
    assert main(["clock", str(tmp_path / "t.json"), "--slo-ms", "1"]) == 0
    out = capsys.readouterr()
    assert out.out.strip().splitlines()[-1] == "2100"
    assert "no clock meets" in out.err
    assert main(["clock", str(tmp_path / "t.json"), "--slo-ms", "-1"]) == 2
    assert (
        main(["fit", str(tmp_path / "m.csv"), "-o", str(tmp_path / "x.json"), "--trim", "0.6"]) == 2
    )
    assert "trim must be in [0, 0.5)" in capsys.readouterr().err


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
    table = Time2ClockTable.load(out / "table.json")
    assert len(table.clocks_mhz) == 12 and table.concurrency == 2
    # Energy per inference was measured at every clock; its minimum lies inside the ladder.
    best = table.energy_optimal_clock_mhz()
    assert best is not None and table.clocks_mhz[0] < best < table.clocks_mhz[-1]
    assert (out / "fit.png").read_bytes()[:4] == b"\x89PNG"
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


def test_simulated_sweep_is_seeded_and_recovers_the_profile() -> None:
    def run(seed: int) -> dict[int, list[float]]:
        sim = SimulatedMeasurer.for_profile("titanrtx", seed=seed)
        return sweep(
            sim.device,
            sim,
            select_clocks(sim.device.supported_clocks_mhz(), 25),
            requests_per_clock=20,
        ).samples

    assert run(1) == run(1)
    assert run(1) != run(2)
    sim = SimulatedMeasurer.for_profile("titanrtx", seed=1)
    from time2clock.fit import fit_table

    table = fit_table(run(1))
    p = sim.device.profile
    for clock in (300, 1200, 2100):
        assert table.predict_ms(clock) == pytest.approx(p.mean_latency_ms(clock), rel=0.05)


def test_sweep_gives_the_clock_back_even_when_measuring_fails() -> None:
    vt = VirtualTime()
    dev = SimulatedDevice("v100", time_source=vt, rng=np.random.default_rng(0))

    class Broken:
        def measure(self, requests: int, concurrency: int) -> list[float]:
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
