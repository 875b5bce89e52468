"""Per-batch curves: fits per batch size, prediction between and beyond them, table files."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from time2clock.fit import fit_model_table, fit_table, read_measurements, write_measurements
from time2clock.table import (
    TABLE_FORMAT_VERSION,
    ClockPoint,
    InverseLinearFit,
    ModelTable,
    TableError,
    TableSet,
    Time2ClockTable,
)

CLOCKS = list(range(300, 2101, 100))
# A known law per batch: bigger batches take longer per execution, less per request.
LAWS = {1: (6.0e-5, 0.0085), 2: (4.0e-5, 0.0060), 4: (2.4e-5, 0.0035), 8: (1.3e-5, 0.0020)}


def law_ms(batch: int, clock_mhz: float) -> float:
    m, b = LAWS[batch]
    return 1.0 / (m * clock_mhz + b)


def noisy_samples(seed: int, n: int = 50) -> dict[int, dict[int, list[float]]]:
    """Executions from the known laws, with 3% spread and 10% slow outliers (3x-5x)."""
    rng = np.random.default_rng(seed)
    out: dict[int, dict[int, list[float]]] = {}
    for batch in LAWS:
        out[batch] = {}
        for clock in CLOCKS:
            mean = law_ms(batch, clock)
            vals = mean + rng.normal(0, 0.03 * mean, n)
            hit = rng.random(n) < 0.10
            vals[hit] += rng.uniform(2.0, 4.0, hit.sum()) * mean
            out[batch][clock] = list(vals)
    return out


def exact_curve(batch: int, *, model: str = "net", energy: bool = False) -> Time2ClockTable:
    m, b = LAWS[batch]
    fit = InverseLinearFit(m, b, 1.0)
    points = tuple(
        ClockPoint(
            c,
            10,
            fit.predict_ms(c),
            0,
            0,
            0,
            0,
            0,
            0,
            energy_per_inference_j=(1.0 + abs(c - 900) / 1000.0) / batch if energy else None,
        )
        for c in CLOCKS
    )
    return Time2ClockTable(
        "v100",
        model,
        0.2,
        1,
        fit,
        points,
        tail_fits={"p99": InverseLinearFit(m * 0.9, b * 0.9, 1.0)},
        residual_quantiles_ms={"p90": 0.5 * batch, "p99": 1.0 * batch},
        batch=batch,
    )


def exact_table(batches: tuple[int, ...] = (1, 2, 4, 8), **kw: object) -> ModelTable:
    return ModelTable("v100", "net", {b: exact_curve(b, **kw) for b in batches})  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(3))
def test_each_batch_fit_recovers_its_law(seed: int) -> None:
    table = fit_model_table(noisy_samples(seed), gpu="v100", model="net")
    assert table.batches == [1, 2, 4, 8] and table.max_batch == 8
    for batch, (m, _b) in LAWS.items():
        curve = table.curve(batch)
        assert curve.batch == batch and curve.concurrency == 1
        # b, the intercept at 0 MHz, is extrapolated and loose; what the scheduler uses, the
        # predicted time on the ladder, is tight.
        assert curve.m == pytest.approx(m, rel=0.05)
        for clock in CLOCKS:
            assert table.predict_ms(clock, batch) == pytest.approx(law_ms(batch, clock), rel=0.04)
    # Each curve is fitted on its own samples: batch 8 is slower per execution than batch 1 ...
    assert table.predict_ms(1200, 8) > 3 * table.predict_ms(1200, 1)
    # ... and the untrimmed fit of the same data is far off, as for one curve.
    untrimmed = fit_model_table(noisy_samples(seed), trim=0.0, gpu="v100", model="net")
    assert abs(untrimmed.curve(4).m - LAWS[4][0]) / LAWS[4][0] > 0.10


def test_energy_per_inference_is_kept_per_batch() -> None:
    energy = {1: {300: 2.0, 2100: 3.0}, 4: {300: 0.7, 2100: 0.9}}
    samples = {1: {300: [37.0], 2100: [7.5]}, 4: {300: [70.0], 2100: [15.0]}}
    table = fit_model_table(samples, gpu="g", model="m", energy_j=energy)
    assert table.energy_per_inference_j(300, 1) == 2.0
    assert table.energy_per_inference_j(2000, 4) == 0.9  # nearest measured clock
    assert table.energy_per_inference_j(1000, 3) == 0.7  # curve(3) is batch 4's
    assert table.energy_optimal_clock_mhz(4) == 300
    assert fit_model_table(samples, gpu="g", model="m").energy_per_inference_j(300) is None
    with pytest.raises(TableError, match="m, batch 0: batch must be >= 1"):
        fit_model_table({0: {300: [1.0], 900: [0.5]}}, gpu="g", model="m")
    with pytest.raises(TableError, match="no measurements of m"):
        fit_model_table({}, gpu="g", model="m")


def test_prediction_interpolates_and_extrapolates_in_batch() -> None:
    table = exact_table((1, 2, 4, 8))
    for clock in (300, 1100, 2100):
        t = {b: law_ms(b, clock) for b in LAWS}
        assert table.predict_ms(clock, 4) == pytest.approx(t[4])
        # Batch 3 lies halfway between the curves of 2 and 4; 6 halfway between 4 and 8.
        assert table.predict_ms(clock, 3) == pytest.approx((t[2] + t[4]) / 2)
        assert table.predict_ms(clock, 6) == pytest.approx((t[4] + t[8]) / 2)
        # Above 8: the line through the last two curves.
        assert table.predict_ms(clock, 12) == pytest.approx(t[8] + 4 * (t[8] - t[4]) / 4)
    # One curve: proportional to the batch.
    single = exact_table((2,))
    assert single.predict_ms(900, 6) == pytest.approx(3 * law_ms(2, 900))
    # Below the smallest profiled batch: the smallest curve (never a promise of less).
    assert single.predict_ms(900, 1) == pytest.approx(law_ms(2, 900))
    # The tail fit interpolates the same way.
    p99 = {b: exact_curve(b).predict_ms(900, "p99") for b in (2, 4)}
    assert table.predict_ms(900, 3, "p99") == pytest.approx((p99[2] + p99[4]) / 2)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        table.predict_ms(900, 0)


@pytest.mark.parametrize("batches", [(1,), (1, 2, 4, 8), (2, 8), (1, 2, 8)])
def test_the_grid_is_predict_ms_value_for_value(batches: tuple[int, ...]) -> None:
    """A plan's grid of times (every batch to past the largest, every clock) is exactly what
    predict_ms gives one value at a time, where a fit runs out of speed (infinite) included."""
    table = exact_table(batches)
    slow = dict(table.curves)
    low = slow[batches[-1]]  # the largest batch: no speed below 500 MHz (1/(m·f + b), b < 0)
    slow[batches[-1]] = replace(low, mean_fit=InverseLinearFit(1.3e-5, -0.0065, 1.0))
    clocks = [135.0, 300.0, 499.0, 500.0, 501.0, *CLOCKS, 1530.0]
    hosted = {b: replace(c, mean_fit=replace(c.mean_fit, host_ms=2.5)) for b, c in slow.items()}
    for t in (
        table,
        ModelTable(gpu=table.gpu, model=table.model, curves=slow),
        ModelTable(gpu=table.gpu, model=table.model, curves=hosted),
    ):
        grid = t.predict_grid_ms(clocks, 40)
        one_by_one = np.array([[t.predict_ms(c, b) for c in clocks] for b in range(1, 41)])
        assert np.array_equal(grid, one_by_one)
        assert np.isinf(grid).any() == (t is not table)


def test_a_host_part_adds_the_same_time_at_every_clock(tmp_path: Path) -> None:
    """``host_ms + 1/(m·x + b)``: the host part is in every prediction and in the clock a
    budget needs (none below it), and a table file keeps it, for the mean and the tails."""
    law = InverseLinearFit(6e-5, 0.0085, 1.0)
    hosted = replace(law, host_ms=4.0)
    for c in CLOCKS:
        assert hosted.predict_ms(c) == law.predict_ms(c) + 4.0
    assert hosted.clock_for_budget_mhz(4.0, CLOCKS) == (CLOCKS[-1], False)
    assert hosted.clock_for_budget_mhz(1000.0, CLOCKS) == (CLOCKS[0], True)
    for c in CLOCKS:
        # the budget this clock just meets; law alone, it is met 4 ms earlier on the ladder
        need = hosted.predict_ms(c) + 1e-9
        assert hosted.clock_for_budget_mhz(need, CLOCKS) == (c, True)
        assert law.clock_for_budget_mhz(need, CLOCKS)[0] <= c
    curve = replace(
        exact_curve(1),
        mean_fit=hosted,
        tail_fits={"p99": replace(hosted, host_ms=5.5)},
    )
    table = TableSet([ModelTable("v100", "net", {1: curve, 2: exact_curve(2)})])
    path = tmp_path / "t.json"
    table.save(path)
    data = json.loads(path.read_text())["models"]["net"]["curves"]
    assert data["1"]["host_ms"] == 4.0 and data["1"]["tail_fits"]["p99"]["host_ms"] == 5.5
    assert "host_ms" not in data["2"] and "host_ms" not in data["2"]["tail_fits"]["p99"]
    loaded = TableSet.load(path)
    assert loaded == table
    net = loaded.get("net")
    assert net is not None and net.predict_ms(900, 1, "p99") == law.predict_ms(900) + 5.5
    data["1"]["host_ms"] = -1.0
    path.write_text(
        json.dumps(
            {
                "version": 2,
                "gpu": "v100",
                "models": {"net": {"gpu": "v100", "model": "net", "curves": data}},
            }
        )
    )
    with pytest.raises(TableError, match="host_ms"):
        TableSet.load(path)


def test_curve_lookup_margins_and_clocks() -> None:
    table = exact_table((1, 4, 8), energy=True)
    assert [table.curve(b).batch for b in (1, 2, 3, 4, 5, 8, 9, 64)] == [1, 4, 4, 4, 8, 8, 8, 8]
    assert table.clocks_mhz == CLOCKS
    assert table.tail_margin_ms("p99", 3) == pytest.approx(4.0)  # curve(3) = batch 4's
    assert table.energy_optimal_clock_mhz(8) == 900
    assert table.energy_per_inference_j(905, 8) == pytest.approx(1.0 / 8)


def test_model_table_rejects_inconsistent_curves() -> None:
    with pytest.raises(TableError, match="has no curves"):
        ModelTable("v100", "net", {})
    with pytest.raises(TableError, match="filed under batch 2 was measured at batch 4"):
        ModelTable("v100", "net", {2: exact_curve(4)})
    with pytest.raises(TableError, match="holds a curve of other on v100"):
        ModelTable("v100", "net", {1: exact_curve(1, model="other")})


def brute_force_completion(
    table: ModelTable, clock: int, queue: int, batch: int, concurrency: int
) -> float:
    """Execute the queue: executions of `batch` (last one smaller), `concurrency` at a time."""
    left, sizes = queue + 1, []
    while left > 0:
        sizes.append(min(batch, left))
        left -= batch
    rounds = [sizes[i : i + concurrency] for i in range(0, len(sizes), concurrency)]
    return sum(max(table.predict_ms(clock, b) for b in r) for r in rounds)


def test_clock_for_queue_runs_the_queue_in_batches() -> None:
    table = exact_table((1, 2, 4, 8))
    for queue in range(0, 30, 3):
        for batch in (1, 2, 3, 4, 8):
            for concurrency in (1, 2):
                for slo in (15.0, 40.0, 120.0):
                    ok = [
                        c
                        for c in CLOCKS
                        if brute_force_completion(table, c, queue, batch, concurrency) <= slo
                    ]
                    expected = (min(ok), True) if ok else (CLOCKS[-1], False)
                    assert table.clock_for_queue(slo, queue, batch, concurrency) == expected
    # 9 requests (8 ahead) in batches of 4: two executions of 4, then one of 1.
    clock = 1500
    assert table.completion_ms(clock, 8, 4) == pytest.approx(
        2 * law_ms(4, clock) + law_ms(1, clock)
    )
    # A version-1 table (batch 1 at concurrency 2) keeps seed 003's ceil((Q+1)/C)·y(f).
    old = ModelTable.single(
        Time2ClockTable(
            "g", "m", 0.2, 2, InverseLinearFit(6e-5, 0.0085, 1.0), exact_curve(1).points
        )
    )
    for queue in range(6):
        rounds = math.ceil((queue + 1) / 2)
        assert old.completion_ms(900, queue) == pytest.approx(rounds * law_ms(1, 900))
    with pytest.raises(ValueError):
        table.completion_ms(900, -1)


def test_table_set_round_trips_two_models(tmp_path: Path) -> None:
    fast = fit_model_table(noisy_samples(1), gpu="v100", model="small-cnn")
    slow = fit_model_table(
        {
            b: {c: [v * 3 for v in vals] for c, vals in s.items()}
            for b, s in noisy_samples(2).items()
        },
        gpu="v100",
        model="big-net",
        energy_j={1: {300: 1.5}},
    )
    tables = TableSet([fast, slow])
    assert tables.models == ["big-net", "small-cnn"] and len(tables) == 2
    assert "small-cnn" in tables and "other" not in tables
    assert [t.model for t in tables] == ["big-net", "small-cnn"]
    path = tmp_path / "table.json"
    tables.save(path)
    data = json.loads(path.read_text())
    assert data["version"] == TABLE_FORMAT_VERSION == 2
    assert data["gpu"] == "v100" and set(data["models"]) == {"small-cnn", "big-net"}
    assert set(data["models"]["big-net"]["curves"]) == {"1", "2", "4", "8"}
    loaded = TableSet.load(path)
    assert loaded == tables
    big, small = loaded.get("big-net"), loaded.get("small-cnn")
    assert big is not None and small is not None
    assert big.predict_ms(900, 4) == pytest.approx(3 * small.predict_ms(900, 4), rel=0.1)
    assert big.energy_per_inference_j(300) == 1.5
    # add() replaces a model's table.
    loaded.add(fit_model_table(noisy_samples(3), gpu="v100", model="big-net"))
    assert len(loaded) == 2 and loaded != tables
    with pytest.raises(TableError, match="no models"):
        TableSet().save(tmp_path / "empty.json")


def test_load_many_merges_files_and_refuses_a_model_twice(tmp_path: Path) -> None:
    a = fit_model_table(noisy_samples(1), gpu="v100", model="a")
    b = fit_model_table(noisy_samples(2), gpu="v100", model="b")
    TableSet([a]).save(tmp_path / "a.json")
    TableSet([b]).save(tmp_path / "b.json")
    merged = TableSet.load_many([tmp_path / "a.json", tmp_path / "b.json"])
    assert merged == TableSet([a, b])
    TableSet([b, a]).save(tmp_path / "b.json")
    with pytest.raises(TableError, match=r"b.json and .*a.json both hold a table of 'a'"):
        TableSet.load_many([tmp_path / "a.json", tmp_path / "b.json"])


def test_a_version_1_file_loads_as_one_batch_1_curve_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rng = np.random.default_rng(0)
    samples = {c: list(law_ms(1, c) * (1 + rng.normal(0, 0.02, 20))) for c in CLOCKS}
    curve = fit_table(samples, gpu="titanrtx", model="inception", concurrency=2)
    path = tmp_path / "v1.json"
    curve.save(path)  # today's format: one curve, version 1
    data = json.loads(path.read_text())
    assert data["version"] == 1
    del data["batch"]  # as files written before batch sizes existed
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="time2clock.table"):
        tables = TableSet.load(path)
    assert tables.models == ["inception"]
    table = tables.get("inception")
    assert table is not None and table.batches == [1] and table.gpu == "titanrtx"
    assert table.curve(1) == curve
    assert table.predict_ms(900) == pytest.approx(curve.predict_ms(900))
    [record] = [r for r in caplog.records if "version-1" in r.getMessage()]
    assert str(path) in record.getMessage() and "re-profile" in record.getMessage().lower()
    assert "--batches" in record.getMessage()
    # The one-curve reader still reads it, and refuses a version-2 file with a pointer.
    assert Time2ClockTable.load(path) == curve
    TableSet([table]).save(tmp_path / "v2.json")
    with pytest.raises(TableError, match=r"found version 2: load it with TableSet\.load"):
        Time2ClockTable.load(tmp_path / "v2.json")


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (
            '{"version": 3, "models": {}}',
            r"v.json: .*format version 3 is not supported "
            r"\(supported: 1, 2\)",
        ),
        ('{"models": {}}', r"format version None is not supported \(supported: 1, 2\)"),
        ('{"version": true}', "format version True is not supported"),
        ("[1, 2]", "v.json: a time2clock table is a JSON object"),
        ("{not json", "v.json is not JSON"),
        ('{"version": 2, "models": {}}', r"v.json \(version 2\): no models"),
        ('{"version": 2, "models": {"a": {"curves": []}}}', "model 'a': a model's table is"),
        (
            '{"version": 2, "models": {"a": {"gpu": "g", "model": "a", "curves": {"x": {}}}}}',
            "model 'a': a: curves are keyed by batch size, got 'x'",
        ),
        (
            '{"version": 2, "models": {"a": {"gpu": "g", "model": "a", "curves": {"1": {}}}}}',
            "v.json: model 'a': a, batch 1: not a time2clock table",
        ),
        ('{"version": 1, "gpu": "x"}', r"v.json \(version 1\): not a time2clock table"),
    ],
)
def test_unknown_versions_and_malformed_files_fail_clearly(
    tmp_path: Path, content: str, match: str
) -> None:
    path = tmp_path / "v.json"
    path.write_text(content)
    with pytest.raises(TableError, match=match):
        TableSet.load(path)


def test_a_table_filed_under_another_models_name_is_refused(tmp_path: Path) -> None:
    data = TableSet([exact_table((1,))]).to_json()
    data["models"] = {"other": data["models"]["net"]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TableError, match="filed as 'other' is of 'net'"):
        TableSet.load(path)
    with pytest.raises(TableError, match="no time2clock table at"):
        TableSet.load(tmp_path / "missing.json")


def test_measurements_csv_carries_model_and_batch(tmp_path: Path) -> None:
    samples = {"a": {1: {300: [30.0, 31.0], 2100: [7.0]}, 4: {300: [90.0]}}, "b": {2: {900: [5.0]}}}
    path = tmp_path / "m.csv"
    write_measurements(path, samples)
    assert path.read_text().splitlines()[0] == "model,batch,clock_mhz,latency_ms"
    assert read_measurements(path) == samples
    # Files without the optional columns: batch 1, the caller's model name.
    path.write_text("clock_mhz,latency_ms\n300,30\n300,31\n2100,7\n")
    assert read_measurements(path, default_model="x") == {
        "x": {1: {300: [30.0, 31.0], 2100: [7.0]}}
    }
    path.write_text("batch,clock_mhz,latency_ms\n2,300,30\n")
    assert read_measurements(path) == {"unknown": {2: {300: [30.0]}}}
    path.write_text("batch,clock_mhz,latency_ms\nzero,300,30\n")
    with pytest.raises(TableError, match=r"m.csv:2: batch must be an integer >= 1, got 'zero'"):
        read_measurements(path)


def test_the_energy_grid_is_the_nearest_measured_clock_value_for_value() -> None:
    """``energy_per_inference_grid_j`` (bisection) gives what a scan of every measured point
    per clock gives: the nearest measured clock, the lower of two as near, the first of two
    points at one clock; points without energy are not candidates."""
    rng = np.random.default_rng(7)
    base = exact_curve(4)

    def point(clock: int, energy: float | None) -> ClockPoint:
        return replace(base.points[0], clock_mhz=clock, energy_per_inference_j=energy)

    points = [point(900, 0.5), point(300, 0.9), point(700, None), point(1100, 0.4)]
    points += [point(900, 0.6), point(500, 0.7)]  # a second point at 900: the first counts
    points += [
        point(int(c), float(e))
        for c, e in zip(rng.integers(300, 2000, 40), rng.uniform(0.1, 1.0, 40), strict=True)
    ]
    curve = replace(base, points=tuple(points))
    table = ModelTable(gpu=base.gpu, model=base.model, curves={4: curve})
    clocks = [100.0, 300.0, 400.0, 600.0, 700.0, 800.0, 1000.0, 2000.0, 2500.0]
    clocks += [float(c) for c in rng.uniform(100, 2600, 200)]

    def scan(clock: float) -> float | None:
        measured = [p for p in points if p.energy_per_inference_j is not None]
        nearest = min(measured, key=lambda p: (abs(p.clock_mhz - clock), p.clock_mhz))
        return nearest.energy_per_inference_j

    assert table.energy_per_inference_grid_j(clocks, 4) == [scan(c) for c in clocks]
    fixed = replace(base, points=tuple(points[:6]))
    few = ModelTable(gpu=base.gpu, model=base.model, curves={4: fixed})
    assert few.energy_per_inference_j(400.0, 4) == 0.9  # 300 and 500 as near: the lower
    assert few.energy_per_inference_j(850.0, 4) == 0.5  # 900: its first point
    assert few.energy_per_inference_j(700.0, 4) == 0.7  # 700 has no energy: 500 (as near as 900)
    bare = replace(base, points=tuple(point(c, None) for c in (300, 900)))
    none = ModelTable(gpu=base.gpu, model=base.model, curves={4: bare})
    assert none.energy_per_inference_grid_j([300.0, 500.0], 4) == [None, None]
