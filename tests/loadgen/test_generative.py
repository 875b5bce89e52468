"""Generative metrics as aiperf/genai-perf compute them, on hand-made streams."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from loadgen.generative import (
    STAT_COLUMNS,
    StreamRecord,
    TokenSloSpec,
    csv_rows,
    per_request,
    slo_attainment,
    stats,
    summarize,
    write_csv,
    write_json,
)

RECORDS = [
    # start, first token, last token, tokens in, tokens out
    StreamRecord(0.0, 0.1, 1.1, 100, 11),  # TTFT 100 ms, ITL 100 ms
    StreamRecord(0.5, 0.8, 1.3, 200, 6),  # TTFT 300 ms, ITL 100 ms
    StreamRecord(1.0, 1.05, 1.05, 50, 1),  # one token: no ITL
    StreamRecord(2.0, 2.2, 3.0, 80, 5),  # TTFT 200 ms, ITL 200 ms
]


def test_per_request_metrics() -> None:
    values = per_request(RECORDS)
    assert values["time_to_first_token"] == pytest.approx([100, 300, 50, 200])
    assert values["request_latency"] == pytest.approx([1100, 800, 50, 1000])
    assert values["inter_token_latency"] == pytest.approx([100, 100, 200])
    assert values["output_token_throughput_per_user"] == pytest.approx([10, 10, 5])
    assert RECORDS[2].itl_ms is None


def test_run_metrics_and_our_additions() -> None:
    report = summarize(RECORDS, energy_j=46.0, slo=TokenSloSpec(ttft_ms=250, tpot_ms=150))
    assert report["benchmark_duration"]["avg"] == pytest.approx(3.0)  # 0.0 -> 3.0 s
    assert report["request_throughput"]["avg"] == pytest.approx(4 / 3)
    assert report["output_token_throughput"]["avg"] == pytest.approx(23 / 3)
    assert report["total_osl"]["avg"] == 23 and report["total_isl"]["avg"] == 430
    assert report["energy_per_output_token"]["avg"] == pytest.approx(2.0)
    att = report["slo_attainment"]
    assert att["ttft"] == pytest.approx(0.75)  # 300 ms misses 250
    assert att["tpot"] == pytest.approx(0.75)  # 200 ms misses 150; one token counts as met
    assert att["both"] == pytest.approx(0.5)
    ttft = report["time_to_first_token"]
    assert ttft["unit"] == "ms" and ttft["avg"] == pytest.approx(162.5)
    assert ttft["p50"] == pytest.approx(150.0) and ttft["max"] == pytest.approx(300.0)


def test_statistics_use_linear_percentiles_and_skip_non_finite() -> None:
    s = stats([1.0, 2.0, 3.0, 4.0, math.nan])
    assert s["p50"] == pytest.approx(2.5) and s["p25"] == pytest.approx(1.75)
    assert s["std"] == pytest.approx(1.118, abs=1e-3)
    assert set(s) == set(STAT_COLUMNS)
    assert all(math.isnan(v) for v in stats([]).values())
    assert slo_attainment([], TokenSloSpec(100, 10)) == {}


def test_exports_use_aiperf_names(tmp_path: Path) -> None:
    report = summarize(RECORDS, energy_j=46.0, slo=TokenSloSpec(ttft_ms=250, tpot_ms=150))
    data = json.loads(write_json(report, tmp_path / "profile_export_aiperf.json").read_text())
    for key in ("request_latency", "time_to_first_token", "inter_token_latency"):
        assert data[key]["unit"] == "ms" and "p99" in data[key]
    assert data["request_throughput"]["unit"] == "requests/sec"
    rows = list(csv.reader(write_csv(report, tmp_path / "x.csv").open()))
    assert rows[0] == ["Metric", *STAT_COLUMNS]
    names = [r[0] for r in rows if r]
    assert "Time to First Token (ms)" in names and "Inter Token Latency (ms)" in names
    assert "Request Throughput (requests/sec)" in names and "Request Count" in names
    assert "Output Token Throughput (tokens/sec)" in names
    assert "Energy Per Output Token (J/token)" in names
    assert ["Metric", "Value"] in [list(r) for r in csv_rows(report)]


def test_a_record_must_be_in_order() -> None:
    with pytest.raises(ValueError, match="first token"):
        StreamRecord(1.0, 0.5, 2.0, 10, 3)
