"""The sidecar's priority level, carried to Triton as the request's own ``priority``.

Where a model's config has ``dynamic_batching.priority_levels``, Triton's batcher keeps one queue
per level and forms each batch from the highest level first; what the sidecar has released
then reaches the GPU in its order too. The level sent is the one the sidecar decided (after
tenants' rights, with ``priority`` 0 mapped to the sidecar's default level), not whatever the
client wrote, so a client cannot claim at Triton a level it was refused at the sidecar.

Bodies are otherwise forwarded untouched: over HTTP only the JSON header (the binary tensors
after it are not read), over gRPC one map entry appended to the serialized message (the last
entry of a key wins when protobuf parses a map), so nothing is decoded or re-encoded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from api.dispatcher import Send, post
from api.hints import HEADER_LENGTH, json_header

PARAMETERS_FIELD = 4  # ModelInferRequest.parameters (map<string, InferParameter>)
UINT64_PARAM_FIELD = 5  # InferParameter.uint64_param, what tritonclient sends for priority


def http_with_priority(
    body: bytes, headers: Mapping[str, str], priority: int
) -> tuple[bytes, dict[str, str]]:
    """``body`` (a KServe v2 JSON body, or a binary-tensor one with its JSON header) with
    ``parameters.priority`` set to ``priority``, and the headers that go with it."""
    request = json_header(body, headers)
    parameters = request.get("parameters")
    if not isinstance(parameters, dict):
        parameters = request["parameters"] = {}
    parameters["priority"] = priority
    header = json.dumps(request, separators=(",", ":")).encode()
    out = dict(headers)
    length = headers.get(HEADER_LENGTH)
    if length is None:
        return header, out
    out[HEADER_LENGTH] = str(len(header))
    return header + body[int(length) :], out


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def grpc_with_priority(raw: bytes, priority: int) -> bytes:
    """A serialized ``ModelInferRequest`` whose ``parameters["priority"]`` is ``priority``."""
    value = _varint(UINT64_PARAM_FIELD << 3) + _varint(priority)
    entry = _field(1, b"priority") + _field(2, value)
    return raw + _field(PARAMETERS_FIELD, entry)


def post_at_level(path: str, body: bytes, headers: dict[str, str]) -> Callable[[int], Send]:
    """``Job.at_level`` for an HTTP request: it POSTs the body with the priority given."""

    def at_level(priority: int) -> Send:
        return post(path, *http_with_priority(body, headers, priority))

    return at_level
