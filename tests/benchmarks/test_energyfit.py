"""The energy fit's record (windows, fits, tables) written and read back, and the power per
band of clocks measured from windows against a known power (seeded data)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.energyfit import (
    FITS,
    SAMPLES,
    TABLES,
    WINDOWS,
    explain,
    main,
    power_by_band,
    read_samples,
    read_windows,
    write_record,
    write_samples,
)
from benchmarks.recovery import wrong_energy
from dvfs.profiles import CNN, get_profile
from tests.time2clock.test_online import V100_CLOCKS
from tests.time2clock.test_online_energy import IDLE, TOP, busy_law, cnn_table, synthetic_windows
from time2clock.online import ExecutionSample
from time2clock.online_energy import EnergyWindow, OnlineEnergy
from time2clock.table import TableSet


def recorded(
    tmp_path: Path, host_ms: float = 0.0, gpu_busy_noise_s: float | None = None
) -> tuple[OnlineEnergy, list[EnergyWindow]]:
    """Two refits of synthetic windows (the truth of the simulated V100; the host part and the
    GPU's busy time as :func:`synthetic_windows` has them) from a wrong table, recorded to
    ``tmp_path``."""
    wrong = wrong_energy(TableSet([cnn_table()]))
    windows = synthetic_windows(
        [1200, 1530],
        150,
        start_s=100.0,
        host_ms=host_ms,
        gpu_busy_noise_s=gpu_busy_noise_s,
    )
    energy = OnlineEnergy(V100_CLOCKS)
    energy.fit_log = []
    tables = wrong
    for half in (windows[:150], windows[150:]):
        for w in half:
            energy.add(w)
        changed = energy.refit(tables, tables, half[-1].end_s)
        tables = TableSet([*tables, *changed.values()])
    write_record(tmp_path, energy, tables)
    return energy, windows


def test_the_record_keeps_every_window_and_every_fit_adopted(tmp_path: Path) -> None:
    energy, windows = recorded(tmp_path)
    assert energy.fit_log is not None and len(energy.fit_log) == 2
    back = read_windows(tmp_path / WINDOWS)
    assert len(back) == len(windows)
    for original, read in zip(windows, back, strict=True):
        assert read.start_s == pytest.approx(original.start_s - 100.0)
        assert read.span_s == pytest.approx(original.span_s)
        assert read.energy_j == original.energy_j
        assert read.spans == original.spans
        assert read.gpu_busy_s is None
    fits = (tmp_path / FITS).read_text().splitlines()
    assert len(fits) == 2
    assert TableSet.load(tmp_path / TABLES).get(CNN) is not None


def test_the_record_keeps_the_gpus_busy_time_and_the_host_part_measured(
    tmp_path: Path,
) -> None:
    """Windows with the GPU's busy time, each execution 4 ms at the host: the record keeps
    each window's busy seconds, and the fits' host part is read back with the laws."""
    _, windows = recorded(tmp_path, host_ms=4.0, gpu_busy_noise_s=0.005)
    back = read_windows(tmp_path / WINDOWS)
    assert [w.gpu_busy_s for w in back] == [w.gpu_busy_s for w in windows]
    assert all(w.gpu_busy_s is not None for w in back)
    text = explain(tmp_path, "v100")
    lines = [line for line in text.splitlines() if "host " in line and " ms (" in line]
    assert len(lines) == 2
    for line in lines:
        host_ms = float(line.split("host ")[1].split(" ms")[0])
        assert host_ms == pytest.approx(4.0, abs=0.3)
    gpu_line = next(line for line in text.splitlines() if line.startswith("GPU busy "))
    share = float(gpu_line.rsplit("count: ", 1)[1].split(" of it")[0])
    assert 0.5 < share < 0.9  # 4 ms of executions of 7-11 ms at the host


def test_the_power_per_band_is_what_each_batch_drew_there_whatever_its_shape() -> None:
    """Batch 1 draws a power that no ``a + c·x³`` law gives (it falls between two clocks): each
    band gets its own, and the idle law is found beside them."""
    rng = np.random.default_rng(3)
    drawn = {900: 70.0, 1100: 68.0, 1500: 95.0}
    windows = []
    t = 0.0
    for clock, watts in drawn.items():
        for _ in range(200):
            busy = float(rng.uniform(0.01, 0.09))
            rest = 0.1 - busy
            energy = watts * busy + IDLE.power_w(clock) * rest + float(rng.normal(0, 0.05))
            windows.append(
                EnergyWindow.at_clock(t, t + 0.1, clock, energy, rest, (((CNN, 1), busy),))
            )
            t += 0.1
    idle, bands = power_by_band(windows, {CNN: [1, 2]}, 100, TOP)
    assert [(b.batch, b.clock_mhz) for b in bands] == [(1, 900), (1, 1100), (1, 1500)]
    for band in bands:
        assert band.power_w == pytest.approx(drawn[band.clock_mhz], abs=0.5)
        assert band.busy_s == pytest.approx(
            sum(w.busy_s() for w in windows if w.clocks_mhz == [band.clock_mhz])
        )
    assert idle.power_w(1200) == pytest.approx(IDLE.power_w(1200), abs=0.5)


def test_explain_sets_each_bands_power_beside_the_simulated_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Synthetic windows drawn from the simulated V100's own laws: the measured power above
    idle is all of the simulated one (a share of 1.00) at both clocks."""
    recorded(tmp_path)
    text = explain(tmp_path, "v100")
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith(f"{CNN} | ")]
    assert {(r[1], r[2]) for r in rows} == {(b, c) for b in "12" for c in ("1200", "1530")}
    for row in rows:
        assert float(row[-2]) == pytest.approx(1.0, abs=0.05)  # the GPU ran all the time
        assert float(row[-1]) == pytest.approx(0.0, abs=0.6)  # no host part, in ms
    assert text.count("idle ") >= 2  # the two fits, each with its idle law
    assert main([str(tmp_path)]) == 0
    assert "energy-optimal clocks" in capsys.readouterr().out


def test_explain_needs_a_record(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path)])


def test_explain_finds_a_host_part_that_is_the_same_at_every_clock(tmp_path: Path) -> None:
    """Each batch-1 execution is at Triton 3 ms longer than the GPU runs it (at idle power
    then): the share the GPU ran falls as the clock rises, and the host part read back is 3 ms
    at every clock."""
    table = cnn_table()
    rng = np.random.default_rng(5)
    energy = OnlineEnergy(V100_CLOCKS)
    t = 0.0
    for clock in (900, 1200, 1530):
        gpu_share = 1.0 - 3.0 / table.curve(1).predict_ms(clock)
        for _ in range(200):
            busy = float(rng.uniform(0.01, 0.09))
            rest = 0.1 - busy
            drawn = gpu_share * busy_law(1).power_w(clock) + (1 - gpu_share) * IDLE.power_w(clock)
            joules = drawn * busy + IDLE.power_w(clock) * rest
            energy.add(EnergyWindow.at_clock(t, t + 0.1, clock, joules, rest, (((CNN, 1), busy),)))
            t += 0.1
    write_record(tmp_path, energy, TableSet([table]))
    rows = [line.split(" | ") for line in explain(tmp_path, "v100").splitlines()]
    found = {int(r[2]): (float(r[-2]), float(r[-1])) for r in rows if r[0] == CNN and r[1] == "1"}
    assert sorted(found) == [900, 1200, 1530]
    shares = [found[c][0] for c in sorted(found)]
    assert shares == sorted(shares, reverse=True) and shares[0] - shares[-1] > 0.05
    for _share, host_ms in found.values():
        assert host_ms == pytest.approx(3.0, abs=0.15)


def test_the_isolated_executions_are_set_beside_the_table_and_the_simulated_gpu(
    tmp_path: Path,
) -> None:
    """Executions 4 ms longer than the simulated GPU's time at two clocks, written with the
    record: read back as written, and per band their median beside the table's time and the
    GPU's."""
    recorded(tmp_path)
    gpu = get_profile("v100").model(CNN)
    samples = [
        ExecutionSample(CNN, clock, 1, gpu.mean_latency_ms(clock, 1) + 4.0 + jitter, 10.0 + i)
        for i, (clock, jitter) in enumerate(
            [(900, -0.1), (900, 0.0), (900, 0.3), (1530, 0.0), (1530, 0.2)]
        )
    ]
    write_samples(samples, tmp_path / SAMPLES)
    back = read_samples(tmp_path / SAMPLES)
    assert [(s.clock_mhz, s.batch) for s in back] == [(s.clock_mhz, s.batch) for s in samples]
    assert [s.ms for s in back] == pytest.approx([s.ms for s in samples], abs=1e-4)
    assert back[0].at_s == 0.0 and back[-1].at_s == pytest.approx(4.0)
    table = TableSet.load(tmp_path / TABLES).get(CNN)
    assert table is not None
    rows = {
        int(r[2]): r
        for line in explain(tmp_path, "v100").splitlines()
        if (r := line.split(" | "))[0] == CNN and len(r) == 7
    }
    assert sorted(rows) == [900, 1530]
    for clock, count in ((900, 3), (1530, 2)):
        _, batch, _, executions, median_ms, table_ms, gpu_ms = rows[clock]
        assert (batch, int(executions)) == ("1", count)
        assert float(gpu_ms) == pytest.approx(gpu.mean_latency_ms(clock, 1), abs=0.01)
        assert float(median_ms) - float(gpu_ms) == pytest.approx(4.0, abs=0.11)
        assert float(table_ms) == pytest.approx(table.predict_ms(clock, 1), abs=0.01)
