"""The gRPC server: ``inference.GRPCInferenceService`` in the sidecar's event loop.

Messages travel as bytes (no (de)serializer on either side), so a passthrough RPC reaches Triton
exactly as the client encoded it, and every reply comes back exactly as Triton encoded it.
Inference requests are decoded only to read their model and parameters; the bytes sent on are
the client's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from api.admission import Inbound, Outcome, admit
from api.dispatcher import Job, Send
from api.grpc_frontend.protocol import (
    CHANNEL_OPTIONS,
    MODEL_INFER,
    SERVICE,
    STREAM_INFER,
    UNARY_METHODS,
    BadMessageError,
    Metadata,
    check_infer_request,
    forwarded,
    method_path,
    parameter_values,
    parse_infer_request,
    server_options,
    stream_error,
    stream_reply,
    text_metadata,
)
from api.runtime import Runtime
from api.streaming import TokenMeter, token_slos
from api.tensors import ModelLimits
from api.triton_priority import grpc_with_priority
from api.upstream import Upstream, UpstreamUnavailableError

log = logging.getLogger(__name__)
Context = Any  # grpc.aio.ServicerContext (grpc ships no type information)
PROTOCOL = "grpc"
GPU_METADATA = "x-sidecar-gpu"  # trailing metadata of a unary reply: which GPU served it
STATUS = {
    Outcome.BAD_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    Outcome.UNAUTHORIZED: grpc.StatusCode.UNAUTHENTICATED,
    Outcome.UNKNOWN_MODEL: grpc.StatusCode.NOT_FOUND,
    Outcome.REJECTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Outcome.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}


@dataclass(slots=True)  # not frozen: built per request, and cheaper so
class GrpcAnswer:
    """Triton's answer to one request: its status, and for a unary call the reply's bytes."""

    code: grpc.StatusCode
    details: str = ""
    body: bytes = b""
    trailing: tuple[tuple[str, str | bytes], ...] = ()

    @property
    def ok(self) -> bool:
        return bool(self.code == grpc.StatusCode.OK)


class GrpcBody:
    """A ``ModelInferRequest`` as admission reads it (decoded once, for its parameters and
    tensor shapes; the bytes sent on are the client's own)."""

    __slots__ = ("request",)

    def __init__(self, request: Any) -> None:
        self.request = request

    def parameters(self) -> Any:
        return parameter_values(self.request.parameters)

    def check(self, *, max_elements: int, model: ModelLimits | None) -> None:
        check_infer_request(self.request, max_elements=max_elements, model=model)


@dataclass(slots=True)
class _TritonChannel:
    """One GPU's Triton, over gRPC: its channel and the method stubs on it."""

    channel: Any
    unary: dict[str, Any]
    stream: Any

    @classmethod
    def open(cls, url: str) -> _TritonChannel:
        channel = grpc.aio.insecure_channel(url, options=CHANNEL_OPTIONS)
        unary = {name: channel.unary_unary(method_path(name)) for name in UNARY_METHODS}
        return cls(channel, unary, channel.stream_stream(method_path(STREAM_INFER)))


class GrpcFrontend:
    """Serves gRPC on ``host:grpc_port`` (0: a free port, read back as :attr:`port`) and talks
    to each GPU's Triton over a channel of its own: an inference request goes to the Triton of
    the GPU it was placed on, anything else to GPU 0's."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.port = 0
        self._server: Any = None
        self._channels: dict[int, _TritonChannel] = {}  # by id() of the GPU's HTTP Upstream
        self._unary: dict[str, Any] = {}  # GPU 0's: every call that is not an inference

    def _to(self, upstream: Upstream) -> _TritonChannel:
        """The gRPC channel of the GPU whose HTTP upstream is ``upstream``."""
        return self._channels.get(id(upstream)) or next(iter(self._channels.values()))

    async def start(self) -> None:
        cfg = self.runtime.config
        for gpu in self.runtime.gpus:
            if gpu.upstream is not None:
                self._channels[id(gpu.upstream)] = _TritonChannel.open(gpu.grpc_url)
        if not self._channels:  # no GPU started (a runtime assembled by hand)
            self._channels[0] = _TritonChannel.open(self.runtime.triton_grpc_url)
        self._unary = next(iter(self._channels.values())).unary
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(self._passthrough(name))
            for name in UNARY_METHODS
        }
        handlers[MODEL_INFER] = grpc.unary_unary_rpc_method_handler(self._infer)
        handlers[STREAM_INFER] = grpc.stream_stream_rpc_method_handler(self._stream_infer)
        self._server = grpc.aio.server(options=server_options(cfg.max_body_bytes))
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),)
        )
        try:
            self.port = self._server.add_insecure_port(f"{cfg.host}:{cfg.grpc_port}")
        except RuntimeError as err:
            raise OSError(f"cannot listen for gRPC on {cfg.host}:{cfg.grpc_port}: {err}") from err
        if self.port == 0:
            raise OSError(f"cannot listen for gRPC on {cfg.host}:{cfg.grpc_port}")
        await self._server.start()
        log.info(
            "gRPC on %s:%d, Triton's gRPC at %s",
            cfg.host,
            self.port,
            ", ".join(g.grpc_url for g in self.runtime.gpus) or self.runtime.triton_grpc_url,
        )

    async def stop(self, grace_s: float = 30.0) -> None:
        """Refuse new calls, let those under way finish (up to ``grace_s``), close the
        channels."""
        if self._server is not None:
            await self._server.stop(grace_s)
        for triton in self._channels.values():
            await triton.channel.close()

    # -- passthrough -------------------------------------------------------------------

    def _passthrough(self, name: str) -> Callable[[bytes, Context], Awaitable[bytes]]:
        async def call(raw: bytes, context: Context) -> bytes:
            try:
                reply: bytes = await self._unary[name](
                    raw,
                    metadata=forwarded(context.invocation_metadata()),
                    timeout=context.time_remaining(),
                )
            except grpc.aio.AioRpcError as err:
                await context.abort(
                    err.code(), err.details() or "", tuple(err.trailing_metadata() or ())
                )
                raise  # abort raised already; for the type checker
            return reply

        return call

    # -- inference ---------------------------------------------------------------------

    async def _infer(self, raw: bytes, context: Context) -> bytes:
        arrival_s = time.monotonic()
        metadata = forwarded(context.invocation_metadata())
        remaining_s = context.time_remaining()  # the client's deadline, if it set one
        deadline_s = None if remaining_s is None else arrival_s + remaining_s
        try:
            request = parse_infer_request(raw)
        except BadMessageError as err:
            self.runtime.metrics.count("unknown", "", "", Outcome.BAD_REQUEST, PROTOCOL)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            raise

        def unary(message: bytes) -> Send:
            return lambda upstream: self._upstream_infer(
                message, metadata, deadline_s, self._to(upstream)
            )

        admission = await self._admit(request, metadata, arrival_s, unary, raw)
        answer: GrpcAnswer | None = admission.answer
        if answer is None:
            await context.abort(STATUS[admission.outcome], admission.message)
            raise AssertionError("abort raises")  # for the type checker
        if not answer.ok:
            await context.abort(answer.code, answer.details, answer.trailing)
        if admission.gpu is not None:
            context.set_trailing_metadata(((GPU_METADATA, admission.gpu),))
        return answer.body

    async def _admit(
        self,
        request: Any,
        metadata: Metadata,
        arrival_s: float,
        sender: Callable[[bytes], Send],
        raw: bytes,
        *,
        tokens: TokenMeter | None = None,
    ) -> Any:
        """One request through :func:`api.admission.admit` (``sender(raw)`` sends it; with
        the sidecar's level as Triton's priority, a map entry appended); a shutdown past its
        grace cancels it, as it cancels HTTP's."""
        task = asyncio.current_task()
        rt = self.runtime
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

    def _upstream_infer(
        self, raw: bytes, metadata: Metadata, deadline_s: float | None, triton: _TritonChannel
    ) -> Awaitable[GrpcAnswer]:
        """Send to ``triton`` with what is left of the client's deadline after the queue: the
        call starts now, in the dispatch pass, and its answer is awaited after."""
        timeout_s = None if deadline_s is None else max(0.0, deadline_s - time.monotonic())
        return _answer(triton.unary[MODEL_INFER](raw, metadata=metadata, timeout=timeout_s))

    async def _stream_infer(
        self, requests: AsyncIterator[bytes], context: Context
    ) -> AsyncIterator[bytes]:
        """Each request of the stream is scheduled on its own; replies (several per request
        for a decoupled model) go back in the order Triton sends them, errors as Triton's
        in-stream ``error_message``."""
        metadata = forwarded(context.invocation_metadata())
        out: asyncio.Queue[bytes | None] = asyncio.Queue()
        pending: set[asyncio.Task[None]] = set()

        async def one(raw: bytes, arrival_s: float) -> None:
            try:
                request = parse_infer_request(raw)
            except BadMessageError as err:
                self.runtime.metrics.count("unknown", "", "", Outcome.BAD_REQUEST, PROTOCOL)
                out.put_nowait(stream_error(str(err), None))
                return
            meter = TokenMeter(
                arrival_s=arrival_s,
                metrics=self.runtime.metrics,
                model_label=self.runtime.models.label(request.model_name),
                slos=token_slos(parameter_values(request.parameters)),
            )

            def streamed(message: bytes) -> Send:
                return lambda upstream: self._upstream_stream(
                    message, metadata, out, meter, self._to(upstream)
                )

            admission = await self._admit(request, metadata, arrival_s, streamed, raw, tokens=meter)
            if admission.answer is None:
                out.put_nowait(stream_error(admission.message, request))

        async def read() -> None:
            try:
                async for raw in requests:
                    task = asyncio.create_task(one(raw, time.monotonic()))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                while pending:
                    await asyncio.wait(set(pending))
            finally:
                out.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (reply := await out.get()) is not None:
                yield reply
            await reader  # its error, if any, ends the call
        finally:
            for task in (reader, *pending):
                task.cancel()

    async def _upstream_stream(
        self,
        raw: bytes,
        metadata: Metadata,
        out: asyncio.Queue[bytes | None],
        meter: TokenMeter,
        triton: _TritonChannel,
    ) -> GrpcAnswer:
        """One request on its own stream to ``triton``, which ends the stream after its last
        reply."""
        call = triton.stream(metadata=metadata)
        ok = True
        try:
            await call.write(raw)
            await call.done_writing()
            async for reply in call:
                out.put_nowait(reply)
                failed, tokens = stream_reply(reply)
                ok = ok and not failed
                if tokens:
                    meter.on_token(time.monotonic())
        except grpc.aio.AioRpcError as err:
            answer = _failed(err)
            out.put_nowait(stream_error(answer.details, parse_infer_request(raw)))
            return answer
        finally:
            with contextlib.suppress(Exception):
                call.cancel()
        if ok:
            meter.finish()
        return GrpcAnswer(grpc.StatusCode.OK if ok else grpc.StatusCode.UNKNOWN)


async def _answer(call: Awaitable[bytes]) -> GrpcAnswer:
    """A unary call's reply, or Triton's error, as an answer."""
    try:
        body = await call
    except grpc.aio.AioRpcError as err:
        return _failed(err)
    return GrpcAnswer(grpc.StatusCode.OK, body=body)


def _failed(err: Any) -> GrpcAnswer:
    """Triton's error as an answer; Triton out of reach is the dispatcher's unavailable."""
    if err.code() == grpc.StatusCode.UNAVAILABLE:
        raise UpstreamUnavailableError(err.details() or "Triton's gRPC is unavailable")
    return GrpcAnswer(
        err.code(), err.details() or "", trailing=tuple(err.trailing_metadata() or ())
    )
