"""``-i grpc``: the same load over KServe v2 gRPC, on one ``grpc.aio`` channel.

Requests are ``ModelInferRequest`` messages encoded once per client class and sent as bytes, so
the generator's cost per request stays as low as for HTTP. Statuses are recorded as the HTTP
code of the same meaning (OK 200, INVALID_ARGUMENT 400, NOT_FOUND 404, RESOURCE_EXHAUSTED 429,
UNAVAILABLE 503, anything else 500), so reports and CSVs read the same for both protocols.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from loadgen.classes import RequestClass
from loadgen.engine import InputTensor, Payload
from loadgen.inputs import InputError

SERVICE = "/inference.GRPCInferenceService/"
HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
}
_MAX_BYTES = 2**31 - 1
_OPTIONS = (
    ("grpc.max_send_message_length", _MAX_BYTES),
    ("grpc.max_receive_message_length", _MAX_BYTES),
)


def grpc_payloads(
    classes: Sequence[RequestClass],
    inputs: Sequence[InputTensor],
    model: str,
    version: str | None,
) -> list[Payload]:
    """One encoded ``ModelInferRequest`` per class, its hints in ``parameters`` (``priority``
    as tritonclient sends it, an unsigned integer)."""
    out = []
    for c in classes:
        request = service_pb2.ModelInferRequest(model_name=model, model_version=version or "")
        for spec in inputs:
            request.inputs.add(name=spec.name, datatype=spec.datatype, shape=list(spec.data.shape))
            if spec.datatype == "BYTES":
                request.raw_input_contents.append(serialize_byte_tensor(spec.data).tobytes())
            else:
                request.raw_input_contents.append(spec.data.tobytes())
        if c.priority:
            request.parameters["priority"].uint64_param = c.priority
        for key, value in c.parameters().items():
            if isinstance(value, str):
                request.parameters[key].string_param = value
            elif isinstance(value, int):
                request.parameters[key].int64_param = value
            else:
                request.parameters[key].double_param = float(value)  # type: ignore[arg-type]
        out.append(Payload(request.SerializeToString(), {}))
    return out


class GrpcClient:
    """A channel to ``host:port``; opened and closed in the event loop that uses it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._channel: Any = None
        self._infer: Any = None

    async def __aenter__(self) -> GrpcClient:
        self._channel = grpc.aio.insecure_channel(self.url, options=_OPTIONS)
        self._infer = self._channel.unary_unary(SERVICE + "ModelInfer")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._channel.close()

    async def infer(self, request: bytes) -> tuple[int, float, str | None]:
        """Send one request; its status (as HTTP's), when the reply arrived, and which GPU
        served it when the sidecar says (trailing metadata ``x-sidecar-gpu``)."""
        call = self._infer(request, timeout=120)
        gpu = None
        try:
            await call
            status = 200
        except grpc.aio.AioRpcError as err:
            status = HTTP_STATUS.get(err.code(), 500)
        end = time.monotonic()
        if status == 200:
            for key, value in await call.trailing_metadata() or ():
                if key == "x-sidecar-gpu":
                    gpu = str(value)
        return status, end, gpu

    async def _json(self, method: str, request: Any, reply: Any) -> dict[str, Any]:
        call = self._channel.unary_unary(
            SERVICE + method,
            request_serializer=request.__class__.SerializeToString,
            response_deserializer=reply.FromString,
        )
        try:
            message = await call(request, timeout=30)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                raise  # the server is not there: not the user's input
            raise InputError(
                f"{self.url} (gRPC {method}): {err.code().name}: {err.details()}"
            ) from None
        out: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
        return out

    async def metadata(self, model: str, version: str | None) -> dict[str, Any]:
        """The model's metadata, shaped as HTTP's (shapes as numbers)."""
        data = await self._json(
            "ModelMetadata",
            service_pb2.ModelMetadataRequest(name=model, version=version or ""),
            service_pb2.ModelMetadataResponse,
        )
        for spec in data.get("inputs", []):
            spec["shape"] = [int(d) for d in spec.get("shape", [])]
        return data

    async def config(self, model: str, version: str | None) -> dict[str, Any]:
        data = await self._json(
            "ModelConfig",
            service_pb2.ModelConfigRequest(name=model, version=version or ""),
            service_pb2.ModelConfigResponse,
        )
        config: dict[str, Any] = data.get("config", {})
        return config

    async def stats(self, model: str) -> dict[str, Any]:
        """Triton's statistics, shaped as HTTP's ``/v2/models/<m>/stats``."""
        return await self._json(
            "ModelStatistics",
            service_pb2.ModelStatisticsRequest(name=model),
            service_pb2.ModelStatisticsResponse,
        )
