"""The gRPC front end: ``inference.GRPCInferenceService`` on the sidecar's own HTTP/2
(:mod:`.h2server`), in the sidecar's event loop.

Messages travel as bytes, so a passthrough RPC reaches Triton exactly as the client encoded it,
and every reply comes back exactly as Triton encoded it. Inference requests are decoded only to
read their model, parameters and tensor shapes; the bytes sent on are the client's own. Calls
go on to Triton over :class:`.channel.TritonChannel` (HTTP/2 of the sidecar's own, as the front
end); each request of a ``ModelStreamInfer`` stream on a stream of its own. ``ModelInfer``
itself is :class:`.unary.UnaryInfer`, compiled with the request path; this module keeps the
rest (the passthrough calls, the streaming call, starting and stopping).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from api.admission import Outcome
from api.dispatcher import Send
from api.grpc_frontend.channel import TritonChannel
from api.grpc_frontend.h2server import Call, GrpcServer
from api.grpc_frontend.messages import GrpcError, Status
from api.grpc_frontend.protocol import (
    STREAM_INFER,
    UNARY_METHODS,
    BadMessageError,
    Metadata,
    forwarded,
    method_path,
    parameter_values,
    parse_infer_request,
    stream_error,
    stream_reply,
)
from api.grpc_frontend.unary import (
    INFER_PATH,
    PROTOCOL,
    GrpcAnswer,
    UnaryInfer,
    admit_grpc,
    failed,
)
from api.runtime import Runtime
from api.streaming import TokenMeter, token_slos
from api.upstream import Upstream

log = logging.getLogger(__name__)
_STREAM_PATH = method_path(STREAM_INFER)


class GrpcFrontend:
    """Serves gRPC on ``host:grpc_port`` (0: a free port, read back as :attr:`port`) and talks
    to each GPU's Triton over connections of its own: an inference request goes to the Triton
    of the GPU it was placed on, anything else to GPU 0's."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.port = 0
        self._server: GrpcServer | None = None
        self._tritons: dict[int, TritonChannel] = {}  # by id() of the GPU's HTTP Upstream
        self._first: TritonChannel | None = None  # GPU 0's: every call that is not an inference
        # ModelInfer's handler (compiled); its ``loop`` is the one the front end serves in,
        # once started (asyncio's own lookup asks the OS for the process id at every call on
        # Python 3.11: a system call per request), and the streams' too.
        self._unary = UnaryInfer(runtime, self._to)
        self._infer = self._unary.infer

    def _to(self, upstream: Upstream) -> TritonChannel:
        """The gRPC channel of the GPU whose HTTP upstream is ``upstream``."""
        triton = self._tritons.get(id(upstream)) or self._first
        assert triton is not None, "the front end is started"
        return triton

    def open_channels(self) -> None:
        """A channel to each GPU's Triton (nothing connects before the first call)."""
        for gpu in self.runtime.gpus:
            if gpu.upstream is not None:
                self._tritons[id(gpu.upstream)] = TritonChannel(gpu.grpc_url)
        if not self._tritons:  # no GPU started (a runtime assembled by hand)
            self._tritons[0] = TritonChannel(self.runtime.triton_grpc_url)
        self._first = next(iter(self._tritons.values()))

    async def start(self) -> None:
        cfg = self.runtime.config
        self._unary.loop = asyncio.get_running_loop()
        self.open_channels()
        unary: dict[str, Any] = {
            method_path(name): self._passthrough(method_path(name)) for name in UNARY_METHODS
        }
        unary[INFER_PATH] = self._infer
        self._server = GrpcServer(
            unary,
            {method_path(STREAM_INFER): self._stream_infer},
            max_message_bytes=cfg.max_body_bytes,
        )
        try:
            self.port = await self._server.start(cfg.host, cfg.grpc_port)
        except OSError as err:
            raise OSError(f"cannot listen for gRPC on {cfg.host}:{cfg.grpc_port}: {err}") from err
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
        for triton in self._tritons.values():
            await triton.close()

    # -- passthrough -------------------------------------------------------------------

    def _passthrough(self, path: str) -> Callable[[bytes, Call], Awaitable[bytes]]:
        async def call(raw: bytes, context: Call) -> bytes:
            assert self._first is not None
            return await self._first.call(
                path, raw, forwarded(context.metadata), context.time_remaining()
            )

        return call

    # -- inference ---------------------------------------------------------------------

    async def _stream_infer(
        self, requests: AsyncIterator[bytes], context: Call
    ) -> AsyncIterator[bytes]:
        """Each request of the stream is scheduled on its own; replies (several per request
        for a decoupled model) go back in the order Triton sends them, errors as Triton's
        in-stream ``error_message``."""
        metadata = forwarded(context.metadata)
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

            admission = await admit_grpc(
                self.runtime, self._unary.loop, request, metadata, arrival_s, streamed, raw, meter
            )
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
        triton: TritonChannel,
    ) -> GrpcAnswer:
        """One request on its own stream to ``triton``, which ends the stream after its last
        reply."""
        ok = True
        try:
            async with contextlib.aclosing(triton.stream(_STREAM_PATH, raw, metadata)) as replies:
                async for reply in replies:
                    out.put_nowait(reply)
                    bad, tokens = stream_reply(reply)
                    ok = ok and not bad
                    if tokens:
                        meter.on_token(time.monotonic())
        except GrpcError as err:
            answer = failed(err)
            out.put_nowait(stream_error(answer.details, parse_infer_request(raw)))
            return answer
        if ok:
            meter.finish()
        return GrpcAnswer(Status.OK if ok else Status.UNKNOWN)
