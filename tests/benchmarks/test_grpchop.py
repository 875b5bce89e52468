"""The second-hop benchmark: its translation to HTTP and back, and a small run end to end on
the embedded Triton with no front end left behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tritonclient.grpc import service_pb2

from benchmarks import grpchop
from benchmarks.sidecar import processes


def test_a_request_goes_over_as_the_binary_extension_and_its_reply_comes_back() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    request = service_pb2.ModelInferRequest(model_name="noop", id="r1")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 3])
    request.outputs.add(name="OUTPUT0")
    request.raw_input_contents.append(x.tobytes())
    path, body, headers = grpchop.http_request(request)
    length = int(headers["inference-header-content-length"])
    head = json.loads(body[:length])
    assert path == "/v2/models/noop/infer"
    assert head["id"] == "r1"
    assert head["inputs"] == [
        {"name": "INPUT0", "shape": [2, 3], "datatype": "FP32",
         "parameters": {"binary_data_size": x.nbytes}}
    ]  # fmt: skip
    assert head["outputs"] == [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    assert body[length:] == x.tobytes()

    y = 2 * x
    reply_head = json.dumps(
        {"model_name": "noop", "model_version": "1", "id": "r1", "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 3],
             "parameters": {"binary_data_size": y.nbytes}}]}
    ).encode()  # fmt: skip
    reply = service_pb2.ModelInferResponse.FromString(
        grpchop.grpc_reply(reply_head + y.tobytes(), len(reply_head))
    )
    assert (reply.model_name, reply.model_version, reply.id) == ("noop", "1", "r1")
    [out] = reply.outputs
    assert (out.name, out.datatype, list(out.shape)) == ("OUTPUT0", "FP32", [2, 3])
    got = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(got, y)


def test_every_hop_is_measured_and_written(tmp_path: Path) -> None:
    argv = ["--concurrency", "1", "--duration-s", "0.3", "--rounds", "1"]
    assert grpchop.main([*argv, "--results-dir", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "grpchop.json").read_text())["results"]["cost"]
    assert [(r["hop"], r["concurrency"]) for r in rows] == [("grpc", 1), ("h2", 1), ("http", 1)]
    for r in rows:
        assert r["calls_per_s"] > 0 and r["server_cpu_us"] > 0
    assert "| concurrency | front end CPU" in (tmp_path / "grpchop.md").read_text()
    left = [p.pid for p in processes().values() if b"benchmarks.grpchop\0--serve" in p.cmdline]
    assert left == []
