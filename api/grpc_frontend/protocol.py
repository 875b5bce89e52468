"""The KServe v2 gRPC service as ``tritonclient`` ships it: method names, parameters, metadata."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tritonclient.grpc import service_pb2

from api.hints import BadRequestError
from api.tensors import MAX_DIMS, ElementBudget, ModelLimits, check_binary_size

SERVICE = "inference.GRPCInferenceService"
MODEL_INFER = "ModelInfer"
STREAM_INFER = "ModelStreamInfer"
_METHODS = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
UNARY_METHODS: tuple[str, ...] = tuple(
    m.name for m in _METHODS if not (m.client_streaming or m.server_streaming)
)
# Transport-level keys that the channel to Triton sets itself on the next hop.
_NOT_FORWARDED = ("user-agent", "te", "content-type", "grpc-", ":")

Metadata = tuple[tuple[str, str | bytes], ...]


def method_path(name: str) -> str:
    return f"/{SERVICE}/{name}"


class BadMessageError(ValueError):
    """Bytes that are not the message the RPC expects."""


def parse_infer_request(raw: bytes) -> Any:
    """A ``ModelInferRequest`` from the wire (read for its model and parameters only)."""
    try:
        return service_pb2.ModelInferRequest.FromString(raw)
    except Exception as err:  # protobuf's DecodeError, whichever backend raised it
        raise BadMessageError(f"malformed ModelInferRequest: {err}") from None


_CONTENTS = (
    "bool_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "fp32_contents",
    "fp64_contents",
    "bytes_contents",
)


def check_infer_request(request: Any, *, max_elements: int, model: ModelLimits | None) -> None:
    """The checks HTTP's :func:`api.tensors.check_request` makes, on a ``ModelInferRequest``:
    shapes and datatypes, element bounds, and each input's data against its shape."""
    if not request.inputs:
        raise BadRequestError("inputs must be a non-empty list of tensors")
    raw = request.raw_input_contents
    with_data = [t for t in request.inputs if "shared_memory_region" not in t.parameters]
    if raw and len(raw) != len(with_data):  # one entry per input not in shared memory, in order
        raise BadRequestError(
            f"raw_input_contents has {len(raw)} entries for {len(with_data)} inputs with data"
        )
    sizes = iter(len(r) for r in raw)
    budget = ElementBudget(max_elements, model)
    for i, tensor in enumerate(request.inputs):
        name = tensor.name
        if not name:
            raise BadRequestError(f"inputs[{i}].name must be a non-empty string")
        shape = list(tensor.shape)
        if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
            raise BadRequestError(
                f"input {name!r}: shape must be at most {MAX_DIMS} dims, each >= 0, got {shape}"
            )
        elements = budget.take(name, tensor.datatype, shape)
        if "shared_memory_region" in tensor.parameters:
            continue
        if raw:
            check_binary_size(name, tensor.datatype, shape, elements, next(sizes))
            continue
        count = sum(len(getattr(tensor.contents, f)) for f in _CONTENTS)
        if count != elements:
            raise BadRequestError(
                f"input {name!r}: shape {shape} has {elements} elements, but contents has {count}"
            )


def parameter_values(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """``map<string, InferParameter>`` as plain values (the one field each parameter sets)."""
    values: dict[str, Any] = {}
    for key, param in parameters.items():
        choice = param.WhichOneof("parameter_choice")
        values[key] = None if choice is None else getattr(param, choice)
    return values


def forwarded(metadata: Iterable[tuple[str, str | bytes]] | None) -> Metadata:
    """The client's metadata, minus what the transport sets itself."""
    return tuple((k, v) for k, v in metadata or () if not k.startswith(_NOT_FORWARDED))


def text_metadata(metadata: Metadata) -> dict[str, str]:
    """Text metadata by (lower-case) key: where the hint fallbacks (``x-priority``…) are read."""
    return {k: v for k, v in metadata if isinstance(v, str)}


def stream_error(message: str, request: Any | None) -> bytes:
    """A ``ModelStreamInferResponse`` carrying an error, exactly as Triton sends one in a stream:
    the message, and the request's id (so that a client can tell which request failed)."""
    response = service_pb2.ModelStreamInferResponse(error_message=message)
    if request is not None:
        response.infer_response.id = request.id
    data: bytes = response.SerializeToString()
    return data


def stream_reply(raw: bytes) -> tuple[bool, bool]:
    """Whether a ``ModelStreamInferResponse`` from Triton carries an error, and whether it
    carries outputs (a token of a generative model; a decoupled model's final flag has none)."""
    reply = service_pb2.ModelStreamInferResponse.FromString(raw)
    return bool(reply.error_message), bool(reply.infer_response.outputs)
