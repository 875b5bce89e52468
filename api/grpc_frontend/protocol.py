"""The KServe v2 gRPC service as ``tritonclient`` ships it: method names, parameters, metadata."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tritonclient.grpc import service_pb2

SERVICE = "inference.GRPCInferenceService"
MODEL_INFER = "ModelInfer"
STREAM_INFER = "ModelStreamInfer"
_METHODS = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
UNARY_METHODS: tuple[str, ...] = tuple(
    m.name for m in _METHODS if not (m.client_streaming or m.server_streaming)
)
# Triton's own limit (INT32_MAX) on both sides, so a request Triton takes, the sidecar takes.
MAX_MESSAGE_BYTES = 2**31 - 1
OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
# Transport-level keys that the gRPC library sets itself on the next hop.
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


def stream_has_error(raw: bytes) -> bool:
    """Whether a ``ModelStreamInferResponse`` from Triton carries an error."""
    return bool(service_pb2.ModelStreamInferResponse.FromString(raw).error_message)
