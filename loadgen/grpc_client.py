"""``-i grpc``: the same load over KServe v2 gRPC, on one connection.

Requests are ``ModelInferRequest`` messages encoded once per client class and sent as bytes, so
the generator's cost per request stays as low as for HTTP. Statuses are recorded as the HTTP
code of the same meaning (OK 200, INVALID_ARGUMENT 400, NOT_FOUND 404, RESOURCE_EXHAUSTED 429,
UNAVAILABLE 503, anything else 500), so reports and CSVs read the same for both protocols.

Two clients (``--grpc-client``): ``h2``, the default, is the sidecar's own HTTP/2 channel
(:class:`api.grpc_frontend.channel.TritonChannel`), as HTTP load goes over the sidecar's own
HTTP/1.1 client: on a machine whose cores the client shares with what it measures, every
microsecond it spends is taken from them (``grpcio``'s runtime costs several times its CPU per
call, ``results/grpcfloor.md``). ``grpcio`` is the ``grpc.aio`` channel that tritonclient's
users have.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from api.grpc_frontend.channel import TritonChannel
from api.grpc_frontend.messages import GrpcError, Status
from loadgen.classes import RequestClass
from loadgen.engine import InputTensor, Payload
from loadgen.inputs import InputError

SERVICE = "/inference.GRPCInferenceService/"
CLIENTS = ("h2", "grpcio")  # --grpc-client: the sidecar's own HTTP/2 channel, or grpc.aio's
HTTP_STATUS: dict[int, int] = {
    Status.OK: 200,
    Status.INVALID_ARGUMENT: 400,
    Status.NOT_FOUND: 404,
    Status.RESOURCE_EXHAUSTED: 429,
    Status.UNAVAILABLE: 503,
}
GPU_METADATA = "x-sidecar-gpu"  # the sidecar's trailing metadata: which GPU served a request
CALL_TIMEOUT_S = 120.0
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


def _code_name(code: int) -> str:
    try:
        return Status(code).name
    except ValueError:
        return str(code)


class UnreachableError(Exception):
    """The server is not there (``UNAVAILABLE`` on a call that is not inference): not the
    user's input."""


class GrpcClient:
    """One connection to ``host:port`` over ``kind`` (:data:`CLIENTS`); opened and closed in
    the event loop that uses it."""

    def __init__(self, url: str, kind: str = CLIENTS[0]) -> None:
        if kind not in CLIENTS:
            raise ValueError(f"the gRPC client is one of {', '.join(CLIENTS)}, got {kind!r}")
        self.url = url
        self.kind = kind
        self._h2: TritonChannel | None = None
        self._channel: Any = None
        self._infer: Any = None

    async def __aenter__(self) -> GrpcClient:
        if self.kind == "h2":
            self._h2 = TritonChannel(self.url)
        else:
            self._channel = grpc.aio.insecure_channel(self.url, options=_OPTIONS)
            self._infer = self._channel.unary_unary(SERVICE + "ModelInfer")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._h2 is not None:
            await self._h2.close()
        if self._channel is not None:
            await self._channel.close()

    async def infer(self, request: bytes) -> tuple[int, float, str | None]:
        """Send one request; its status (as HTTP's), when the reply arrived, and which GPU
        served it when the sidecar says (trailing metadata ``x-sidecar-gpu``)."""
        if self._h2 is not None:
            trailing: list[tuple[str, str | bytes]] = []
            try:
                await self._h2.call(SERVICE + "ModelInfer", request, (), CALL_TIMEOUT_S, trailing)
                status = 200
            except GrpcError as err:
                status = HTTP_STATUS.get(err.code, 500)
            end = time.monotonic()
            gpu = next((str(v) for k, v in trailing if k == GPU_METADATA), None)
            return status, end, gpu
        call = self._infer(request, timeout=CALL_TIMEOUT_S)
        gpu = None
        try:
            await call
            status = 200
        except grpc.aio.AioRpcError as err:
            status = HTTP_STATUS.get(err.code().value[0], 500)
        end = time.monotonic()
        if status == 200:
            for key, value in await call.trailing_metadata() or ():
                if key == GPU_METADATA:
                    gpu = str(value)
        return status, end, gpu

    async def _unary(self, method: str, message: bytes) -> bytes:
        """One call that is not inference; its reply's bytes (``GrpcError`` on a status other
        than OK, whichever the client)."""
        if self._h2 is not None:
            return await self._h2.call(SERVICE + method, message, (), 30.0)
        try:
            reply: bytes = await self._channel.unary_unary(SERVICE + method)(message, timeout=30)
        except grpc.aio.AioRpcError as err:
            raise GrpcError(err.code().value[0], err.details() or "") from None
        return reply

    async def _json(self, method: str, request: Any, reply: Any) -> dict[str, Any]:
        try:
            message = reply.FromString(await self._unary(method, request.SerializeToString()))
        except GrpcError as err:
            said = f"{self.url} (gRPC {method}): {_code_name(err.code)}: {err.details}"
            if err.code == Status.UNAVAILABLE:  # the server is not there: not the user's input
                raise UnreachableError(said) from None
            raise InputError(said) from None
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
