"""The sidecar's level sent as Triton's ``priority``: bodies rewritten only where it is, the
model's priority levels read from its config."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2

from api.hints import HEADER_LENGTH, json_header
from api.runtime import serving_from_config
from api.triton_priority import grpc_with_priority, http_with_priority
from scheduler.view import ModelServing


def binary_body(priority: int) -> tuple[bytes, dict[str, str]]:
    x = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    x.set_data_from_numpy(np.arange(16, dtype=np.float32).reshape(1, 16))
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        [x], priority=priority, parameters={"nice": -5}
    )
    assert json_size is not None
    return body, {"content-type": "application/octet-stream", HEADER_LENGTH: str(json_size)}


def test_binary_body_gets_the_level_and_keeps_its_tensors() -> None:
    body, headers = binary_body(0)
    out, out_headers = http_with_priority(body, headers, 2)
    request = json_header(out, out_headers)
    assert request["parameters"]["priority"] == 2 and request["parameters"]["nice"] == -5
    length = int(out_headers[HEADER_LENGTH])
    tensors = np.frombuffer(out[length:], dtype=np.float32)
    assert tensors.tolist() == list(range(16))
    assert out_headers["content-type"] == "application/octet-stream"


def test_json_body_gets_the_level() -> None:
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]})
    out, headers = http_with_priority(body.encode(), {}, 1)
    assert json.loads(out)["parameters"] == {"priority": 1}
    assert HEADER_LENGTH not in headers


def test_grpc_message_gets_the_level_whatever_it_said() -> None:
    request = service_pb2.ModelInferRequest(model_name="simnet")
    request.parameters["priority"].uint64_param = 1  # the client's claim, refused by a tenant
    request.parameters["nice"].int64_param = 3
    parsed = service_pb2.ModelInferRequest()
    parsed.ParseFromString(grpc_with_priority(request.SerializeToString(), 2))
    assert parsed.parameters["priority"].uint64_param == 2
    assert parsed.parameters["nice"].int64_param == 3
    assert parsed.model_name == "simnet"


@pytest.mark.parametrize(
    ("batcher", "levels", "default"),
    [
        ({}, 0, 0),
        ({"priority_levels": 2, "default_priority_level": 2}, 2, 2),
        ({"priority_levels": "3"}, 3, 0),
    ],
)
def test_priority_levels_read_from_the_model_config(
    batcher: dict[str, object], levels: int, default: int
) -> None:
    config = {"max_batch_size": 32, "dynamic_batching": batcher, "instance_group": [{"count": 2}]}
    serving = serving_from_config(config)
    assert (serving.max_batch, serving.instances) == (32, 2)
    assert (serving.priority_levels, serving.default_priority_level) == (levels, default)


def test_levels_map_onto_tritons() -> None:
    assert ModelServing(8).triton_priority(1) is None  # no levels: Triton would ignore it
    two = ModelServing(8, priority_levels=2, default_priority_level=2)
    assert [two.triton_priority(level) for level in (1, 2, 3)] == [1, 2, 2]
    with pytest.raises(ValueError, match="default_priority_level"):
        ModelServing(8, priority_levels=2, default_priority_level=3)
