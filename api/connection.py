"""The sidecar's HTTP/1.1 connections: uvicorn's httptools protocol, bounded, with inference
served straight from the protocol.

Limits uvicorn's httptools protocol does not enforce itself: uvicorn bounds open connections
(``limit_concurrency``) and idle keep-alive time, but with httptools it accepts request headers
of any size and waits for them forever: one client sending a 64 MB header, or 200 sending a byte
a second, held the sidecar. This protocol answers 431 once the request line and headers pass
``max_header_bytes``, and 408 when they have not arrived within ``header_timeout_s`` of the
connection opening (or of the request's first byte); then closes, once the client has stopped
sending (within ``linger_s``), so that no reset overtakes the reply.

Inference (``POST /v2/models/<m>[/versions/<v>]/infer``) does not go through ASGI: the protocol
collects the body (bounded by ``--max-body-bytes``, each chunk due within ``--read-timeout-s``),
runs :func:`api.http_infer.infer` in one task, and writes the reply in one write; the
request's clock (its deadline, its latency) starts at its first byte read. A client
that goes away cancels that task, which takes its request out of the queue. The ASGI layer, with
its scope, message dicts and three tasks per request, had cost more CPU than the scheduling
itself. Everything else, and an inference request pipelined behind another on its connection,
takes uvicorn's ASGI path (:class:`api.routes.inference.InferenceFastPath` serves the latter).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from api.errors import error_body
from api.http_infer import Reply, infer, infer_target, too_large

if TYPE_CHECKING:
    from api.runtime import Runtime

log = logging.getLogger(__name__)
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _reply(status: str, message: str) -> bytes:
    body = ('{"error": "' + message + '"}').encode()
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class _InferCycle:
    """One inference request on a connection, from its headers to its reply. It has the
    attributes through which uvicorn's protocol looks at its own request cycles."""

    __slots__ = (
        "arrival_s",
        "chunks",
        "disconnected",
        "headers",
        "keep_alive",
        "model",
        "response_complete",
        "size",
        "task",
        "timer",
        "version",
    )

    def __init__(
        self,
        model: str,
        version: str | None,
        headers: dict[str, str],
        keep_alive: bool,
        arrival_s: float,
    ) -> None:
        self.model, self.version, self.headers = model, version, headers
        self.keep_alive = keep_alive
        self.arrival_s = arrival_s  # when its first byte was read
        self.response_complete = False
        self.disconnected = False
        self.chunks: list[bytes] = []
        self.size = 0
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header size bound, a header deadline, and inference
    served without ASGI when ``runtime`` is set (see the module docstring)."""

    linger_s = 2.0  # after a refusal, how long the rest of the request is read and dropped

    def __init__(
        self,
        *args: Any,
        max_header_bytes: int = 64 * 1024,
        header_timeout_s: float = 10.0,
        runtime: Runtime | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.max_header_bytes = max_header_bytes
        self.header_timeout_s = header_timeout_s
        self.runtime = runtime
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._rejected = False
        self._in_headers = False
        self._infer: _InferCycle | None = None
        self._begin_s = 0.0  # when the current request's first byte was read

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        cycle = self._infer
        if cycle is not None:
            self._infer = None
            cycle.disarm()
            if not cycle.response_complete:
                cycle.disconnected = True
                if cycle.task is not None:  # the client is gone: so is its request
                    cycle.task.cancel()
        current: object = self.cycle
        if isinstance(current, _InferCycle):  # uvicorn's own handling is for its own cycles
            self.cycle = None  # type: ignore[assignment]
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        super().data_received(data)
        if self._in_headers and not self._rejected:  # this chunk ended inside the headers
            self._arm()
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self._reject(
                    "431 Request Header Fields Too Large",
                    f"request line and headers exceed {self.max_header_bytes} bytes",
                )
        cycle = self._infer
        if cycle is not None and cycle.task is None and cycle.timer is None:
            if cycle.response_complete:
                return
            # The body is still coming: each chunk is due within the timeout.
            cycle.timer = self.loop.call_later(self.header_timeout_s, self._body_too_slow)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _reject(self, status: str, message: str) -> None:
        """Answer ``status`` and end the connection. It is closed once the client stops sending
        (or after ``linger_s``), what it still sends read and dropped: a socket closed with
        bytes unread is reset by the kernel, and the reset can reach the client before it has
        read the reply (a 431 behind a header still arriving was lost so)."""
        self._rejected = True
        self._disarm()
        if self.transport.is_closing():
            return
        self.transport.write(_reply(status, message))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._header_timer = self.loop.call_later(self.linger_s, self.transport.close)

    def _too_slow(self) -> None:
        self._header_timer = None
        if self.cycle is None or self.cycle.response_complete:  # no request being served
            self._reject("408 Request Timeout", "request headers not received in time")

    def send_400_response(self, msg: str) -> None:
        """A request httptools cannot parse: 400 in the protocol's JSON shape, then close."""
        self._reject("400 Bad Request", msg.replace('"', "'"))

    def on_message_begin(self) -> None:
        # The request's clock starts at its first byte read: its parse, body and admission are
        # the sidecar's time too, and count against its deadline and in its latency.
        self._begin_s = time.monotonic()
        self._header_bytes = 0
        self._in_headers = True  # the deadline is armed if this chunk ends inside them
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._disarm()
        if not self._start_infer():
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        cycle = self._infer
        if cycle is None or not self._serving(cycle):
            super().on_body(body)
            return
        if cycle.response_complete:
            return
        cycle.size += len(body)
        assert self.runtime is not None
        limit = self.runtime.config.max_body_bytes
        if cycle.size > limit:  # a chunked body with no Content-Length, past the bound
            self._finish(cycle, too_large(limit), close=True)
            return
        cycle.chunks.append(body)
        if cycle.timer is not None:
            cycle.timer.cancel()
            cycle.timer = None

    def on_message_complete(self) -> None:
        cycle = self._infer
        if cycle is None or not self._serving(cycle):
            super().on_message_complete()
            return
        cycle.disarm()
        if cycle.response_complete:
            return
        body = cycle.chunks[0] if len(cycle.chunks) == 1 else b"".join(cycle.chunks)
        cycle.chunks = []
        task = self.loop.create_task(self._serve(cycle, body))
        cycle.task = task
        assert self.runtime is not None
        # Counted against uvicorn's limit, and cancelled by a shutdown past its grace period.
        self.tasks.add(task)
        self.runtime.pending.add(task)
        task.add_done_callback(self._served)

    # -- inference without ASGI ----------------------------------------------------------

    def _serving(self, cycle: _InferCycle) -> bool:
        """Whether ``cycle`` is the connection's current request (not one behind it)."""
        current: object = self.cycle
        return current is cycle

    def _start_infer(self) -> bool:
        """Take this request on the inference path if it is one (and nothing is ahead of it
        on the connection, and the server has room); False leaves it to uvicorn."""
        rt = self.runtime
        if rt is None or self.parser.get_method() != b"POST":
            return False
        if self.cycle is not None and not self.cycle.response_complete:
            return False  # pipelined behind another request: uvicorn queues it
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            return False  # uvicorn answers 503
        try:
            path = httptools.parse_url(self.url).path.decode("ascii")
        except (httptools.HttpParserInvalidURLError, UnicodeDecodeError):
            return False
        target = infer_target(unquote(path) if "%" in path else path)
        if target is None:
            return False
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in self.headers}
        keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        cycle = _InferCycle(*target, headers, keep_alive, self._begin_s)
        self.cycle = cycle  # type: ignore[assignment]
        self._infer = cycle
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > rt.config.max_body_bytes:
            self._finish(cycle, too_large(rt.config.max_body_bytes), close=True)
        elif self.expect_100_continue:
            self.transport.write(CONTINUE)
        return True

    async def _serve(self, cycle: _InferCycle, body: bytes) -> None:
        assert self.runtime is not None
        try:
            reply = await infer(
                self.runtime, cycle.model, cycle.version, body, cycle.headers, cycle.arrival_s
            )
        except asyncio.CancelledError:
            if cycle.disconnected:
                return  # nobody to answer
            reply = error_body(503, "the sidecar is shutting down")  # past the grace period
        except Exception:
            log.exception("inference request failed in the sidecar")
            reply = error_body(500, "internal error in the sidecar")
        self._finish(cycle, reply, close=False)

    def _served(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if self.runtime is not None:
            self.runtime.pending.discard(task)

    def _body_too_slow(self) -> None:
        cycle = self._infer
        if cycle is not None:
            cycle.timer = None
            self._finish(cycle, error_body(408, "the request body came too slowly"), close=True)

    def _finish(self, cycle: _InferCycle, reply: Reply, *, close: bool) -> None:
        """Write ``reply`` in one write; close after it when asked or when the request did."""
        cycle.disarm()
        if cycle.response_complete:
            return
        cycle.response_complete = True
        if self._infer is cycle:
            self._infer = None
        if cycle.disconnected or self.transport.is_closing():
            return
        status, headers, content = reply
        keep_alive = cycle.keep_alive and not close
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += (name, b": ", value, b"\r\n")
        for key, text in headers.items():
            head += (key.encode("latin-1"), b": ", text.encode("latin-1"), b"\r\n")
        head += (b"content-length: ", str(len(content)).encode(), b"\r\n")
        if not keep_alive:
            head.append(b"connection: close\r\n")
        head += (b"\r\n", content)
        self.transport.write(b"".join(head))
        if not keep_alive:
            self.transport.close()
            return
        self.on_response_complete()


def bounded_protocol(
    max_header_bytes: int, header_timeout_s: float, runtime: Runtime | None = None
) -> type[HttpToolsProtocol]:
    """The protocol for ``uvicorn.Config(http=...)`` with these bounds; with ``runtime``,
    inference is served without ASGI (bounded by its ``max_body_bytes`` and the same
    ``header_timeout_s`` per body chunk). A factory, not a subclass (a compiled class takes
    none from Python): uvicorn calls it with its own arguments, as it calls a class."""
    factory = functools.partial(
        BoundedHttpToolsProtocol,
        max_header_bytes=max_header_bytes,
        header_timeout_s=header_timeout_s,
        runtime=runtime,
    )
    return cast("type[HttpToolsProtocol]", factory)
