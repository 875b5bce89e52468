"""gRPC's ``ModelInfer``: one inference request from its message to its reply, through
admission, compiled with the rest of the request path (``setup.py``).

The front end (:mod:`.server`) serves it and the streaming call, whose requests go through
the same :func:`admit_grpc`; what an async generator is made of stays there, uncompiled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from api.admission import Admission, Inbound, Outcome, admit
from api.dispatcher import Job, Send
from api.grpc_frontend.h2server import Call
from api.grpc_frontend.messages import GrpcError, Status
from api.grpc_frontend.protocol import (
    MODEL_INFER,
    BadMessageError,
    Metadata,
    check_infer_request,
    forwarded,
    method_path,
    parameter_values,
    parse_infer_request,
    text_metadata,
)
from api.runtime import Runtime
from api.streaming import TokenMeter
from api.tensors import ModelLimits
from api.triton_priority import grpc_with_priority
from api.upstream import Upstream
from api.upstream_errors import UpstreamUnavailableError

PROTOCOL = "grpc"
GPU_METADATA = "x-sidecar-gpu"  # trailing metadata of a unary reply: which GPU served it
STATUS = {
    Outcome.BAD_REQUEST: Status.INVALID_ARGUMENT,
    Outcome.UNAUTHORIZED: Status.UNAUTHENTICATED,
    Outcome.UNKNOWN_MODEL: Status.NOT_FOUND,
    Outcome.REJECTED: Status.RESOURCE_EXHAUSTED,
    Outcome.UNAVAILABLE: Status.UNAVAILABLE,
}
INFER_PATH = method_path(MODEL_INFER)


class Channel(Protocol):
    """What :class:`UnaryInfer` sends on: a :class:`.channel.TritonChannel` (or a test's, or a
    benchmark's, stand-in for one)."""

    def call(
        self, path: str, message: bytes, metadata: Metadata, timeout_s: float | None
    ) -> Awaitable[bytes]: ...


class GrpcAnswer:
    """Triton's answer to one request: its status, and for a unary call the reply's bytes."""

    def __init__(
        self, code: int, details: str = "", body: bytes = b"", trailing: Metadata = ()
    ) -> None:
        self.code = code
        self.details = details
        self.body = body
        self.trailing = trailing

    @property
    def ok(self) -> bool:
        return self.code == Status.OK


class GrpcBody:
    """A ``ModelInferRequest`` as admission reads it (decoded once, for its parameters and
    tensor shapes; the bytes sent on are the client's own)."""

    def __init__(self, request: Any) -> None:
        self.request = request

    def parameters(self) -> Any:
        return parameter_values(self.request.parameters)

    def check(self, *, max_elements: int, model: ModelLimits | None) -> None:
        check_infer_request(self.request, max_elements=max_elements, model=model)


async def admit_grpc(
    rt: Runtime,
    loop: asyncio.AbstractEventLoop | None,
    request: Any,
    metadata: Metadata,
    arrival_s: float,
    sender: Callable[[bytes], Send],
    raw: bytes,
    tokens: TokenMeter | None = None,
) -> Admission:
    """One decoded request through :func:`api.admission.admit` (``sender(raw)`` sends it;
    with the sidecar's level as Triton's priority, a map entry appended); a shutdown past its
    grace cancels it, as it cancels HTTP's. ``loop``: the one it runs in, where known (asyncio's
    own lookup asks the OS for the process id on Python 3.11)."""
    task = asyncio.current_task(loop)
    if task is not None:
        rt.pending.add(task)
    try:
        return await admit(
            rt,
            Inbound(
                protocol=PROTOCOL,
                model=request.model_name,
                body=GrpcBody(request),
                headers=text_metadata(metadata),
                arrival_s=arrival_s,
                job=Job(
                    send=sender(raw),
                    stream=tokens is not None,
                    tokens=tokens,
                    at_level=lambda level: sender(grpc_with_priority(raw, level)),
                ),
            ),
        )
    finally:
        if task is not None:
            rt.pending.discard(task)


class UnaryInfer:
    """``ModelInfer``'s handler: decode, admit, and answer with Triton's reply (or the
    status admission or Triton gave). ``to``: the gRPC channel of the GPU whose HTTP upstream
    the request was placed on."""

    def __init__(self, runtime: Runtime, to: Callable[[Upstream], Channel]) -> None:
        self.runtime = runtime
        self.to = to
        self.loop: asyncio.AbstractEventLoop | None = None  # set once serving

    async def infer(self, raw: bytes, context: Call) -> bytes:
        arrival_s = time.monotonic()
        metadata = forwarded(context.metadata)
        deadline_s = context.deadline_s  # the client's deadline, if it set one
        try:
            request = parse_infer_request(raw)
        except BadMessageError as err:
            self.runtime.metrics.count("unknown", "", "", Outcome.BAD_REQUEST, PROTOCOL)
            raise GrpcError(Status.INVALID_ARGUMENT, str(err)) from None

        def unary(message: bytes) -> Send:
            return lambda upstream: self.send(message, metadata, deadline_s, self.to(upstream))

        admission = await admit_grpc(
            self.runtime, self.loop, request, metadata, arrival_s, unary, raw
        )
        answer: GrpcAnswer | None = admission.answer
        if answer is None:
            raise GrpcError(STATUS[admission.outcome], admission.message)
        if not answer.ok:
            raise GrpcError(answer.code, answer.details, answer.trailing)
        if admission.gpu is not None:
            context.trailing = ((GPU_METADATA, admission.gpu),)
        return answer.body

    def send(
        self, raw: bytes, metadata: Metadata, deadline_s: float | None, triton: Channel
    ) -> Awaitable[GrpcAnswer]:
        """Send to ``triton`` with what is left of the client's deadline after the queue: the
        call is written now, in the dispatch pass, and its answer is awaited after."""
        timeout_s = None if deadline_s is None else max(0.0, deadline_s - time.monotonic())
        return answer_of(triton.call(INFER_PATH, raw, metadata, timeout_s))


async def answer_of(call: Awaitable[bytes]) -> GrpcAnswer:
    """A unary call's reply, or Triton's error, as an answer."""
    try:
        body = await call
    except GrpcError as err:
        return failed(err)
    return GrpcAnswer(Status.OK, body=body)


def failed(err: GrpcError) -> GrpcAnswer:
    """Triton's error as an answer; Triton out of reach is the dispatcher's unavailable."""
    if err.code == Status.UNAVAILABLE:
        raise UpstreamUnavailableError(err.details or "Triton's gRPC is unavailable") from None
    return GrpcAnswer(err.code, err.details, trailing=err.trailing)
