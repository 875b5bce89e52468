from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from loadgen.__main__ import parse_range
from loadgen.engine import Sample
from loadgen.inputs import InputError, build_inputs, parse_shapes
from loadgen.measure import MeasureOptions, Window, stable
from loadgen.report import header

EXPECTED_HEADER = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
    "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
    "p50 latency,p90 latency,p95 latency,p99 latency"
)


def test_csv_header_is_perf_analyzers_then_ours() -> None:
    assert ",".join(header("concurrency", False)).startswith(EXPECTED_HEADER + ",")
    assert header("concurrency", False)[13:] == [
        "Energy per Inference (J)",
        "Avg GPU Clock (MHz)",
        "SLO Attainment",
        "Rejected Requests",
    ]
    verbose = header("rate", True)
    assert verbose[0] == "Request Rate"
    assert verbose[13:16] == ["Avg latency", "request/response", "response wait"]


def test_ranges() -> None:
    assert parse_range("1:4:1", int) == [1, 2, 3, 4]
    assert parse_range("2", int) == [2]
    assert parse_range("10:30:10") == [10, 20, 30]
    for bad in ("0:2", "3:1", "a:b", "1:2:3:4"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_range(bad)


def window(throughput: float, latency_s: float) -> Window:
    n = int(throughput)
    samples = [Sample(0.0, latency_s, 0, 200) for _ in range(n)]
    return Window(0.0, 1.0, samples, {}, None, [], n)


def test_stability_needs_three_windows_within_the_percentage() -> None:
    opts = MeasureOptions(stability_percentage=10.0)
    assert not stable([window(100, 0.01)] * 2, opts)
    assert stable([window(100, 0.010), window(105, 0.0105), window(96, 0.0098)], opts)
    assert not stable([window(100, 0.010), window(130, 0.010), window(100, 0.010)], opts)
    assert not stable([window(100, 0.010), window(100, 0.014), window(100, 0.010)], opts)


META = {
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
        {"name": "IDS", "datatype": "INT64", "shape": [-1, -1]},
    ]
}


def test_inputs_from_metadata_shape_and_data(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    shapes = parse_shapes(["IDS:4"])
    tensors = build_inputs(
        META, {"max_batch_size": 8}, batch_size=2, shapes=shapes, input_data="random", rng=rng
    )
    assert [(t.name, t.data.shape) for t in tensors] == [("INPUT0", (2, 16)), ("IDS", (2, 4))]
    assert tensors[0].data.dtype == np.dtype(np.float32)
    assert tensors[1].data.dtype == np.dtype(np.int64)
    zero = build_inputs(
        META, {"max_batch_size": 8}, batch_size=1, shapes=shapes, input_data="zero", rng=rng
    )
    assert not zero[0].data.any()
    data = tmp_path / "in.json"
    data.write_text(
        json.dumps({"data": [{"INPUT0": list(range(16)), "IDS": {"content": [1, 2, 3, 4]}}]})
    )
    from_file = build_inputs(
        META, {"max_batch_size": 8}, batch_size=3, shapes=shapes, input_data=str(data), rng=rng
    )
    assert from_file[0].data.shape == (3, 16) and from_file[0].data[2, 5] == 5
    assert from_file[1].data.tolist() == [[1, 2, 3, 4]] * 3


def test_input_errors(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(InputError, match="variable shape"):
        build_inputs(
            META, {"max_batch_size": 8}, batch_size=1, shapes={}, input_data="zero", rng=rng
        )
    with pytest.raises(InputError, match="does not batch"):
        build_inputs(
            META,
            {"max_batch_size": 0},
            batch_size=4,
            shapes={"IDS": [2]},
            input_data="zero",
            rng=rng,
        )
    with pytest.raises(InputError, match="no such file"):
        build_inputs(META, {}, batch_size=1, shapes={"IDS": [2]}, input_data="nope.json", rng=rng)
    with pytest.raises(InputError, match="NAME:DIM"):
        parse_shapes(["INPUT0"])
