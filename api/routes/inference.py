"""Inference: ``POST /v2/models/{model}[/versions/{version}]/infer``, through the scheduler.

:func:`api.http_infer.infer` does the work and is shared: by the sidecar's connection
(:mod:`api.connection`, without ASGI), by the FastAPI route (documented in the OpenAPI schema)
and by :class:`InferenceFastPath`, a thin ASGI layer that serves the same requests without
FastAPI's routing and middleware stack, which cost about half the sidecar's CPU per request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.errors import error_body
from api.http_infer import Reply, infer, too_large
from api.runtime import Runtime

router = APIRouter(tags=["inference"])


def _response(reply: Reply) -> Response:
    status, headers, content = reply
    return Response(content=content, status_code=status, headers=headers)


@router.post("/v2/models/{model}/infer")
async def infer_route(model: str, request: Request) -> Response:
    """Run ``model`` (KServe v2 body, JSON or binary tensors) through the scheduler."""
    return _response(
        await infer(request.app.state.runtime, model, None, await request.body(), request.headers)
    )


@router.post("/v2/models/{model}/versions/{version}/infer")
async def infer_version_route(model: str, version: str, request: Request) -> Response:
    """Run a version of ``model`` through the scheduler."""
    return _response(
        await infer(
            request.app.state.runtime, model, version, await request.body(), request.headers
        )
    )


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass(slots=True)
class Call:
    """One request on the fast path: what the handler needs, and how to answer in pieces."""

    model: str
    version: str | None
    body: bytes
    headers: dict[str, str]
    send: Send
    started: bool = False  # the reply's head is out: no other status can follow
    finished: bool = False  # the reply's last byte is out: a client leaving now cancels nothing

    async def start(self, status: int, headers: dict[str, str]) -> None:
        """Begin a reply whose body follows in :meth:`write` calls."""
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        await self.send({"type": "http.response.start", "status": status, "headers": raw})
        self.started = True

    async def write(self, data: bytes, *, more: bool = True) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": more})
        self.finished = not more


Handler = Callable[[Runtime, Call], Awaitable[Reply | None]]


async def _infer_call(rt: Runtime, call: Call) -> Reply:
    return await infer(rt, call.model, call.version, call.body, call.headers)


class InferenceFastPath:
    """ASGI: the inference routes (``POST /v2/models/<m>[/versions/<v>]/<verb>``, and whatever
    :meth:`add` registers) straight to their handlers, without FastAPI's routing and middleware;
    all else to the FastAPI app (lifespan included)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.verbs: dict[str, Handler] = {"infer": _infer_call}
        self.paths: dict[str, Handler] = {}

    def add_verb(self, verb: str, handler: Handler) -> None:
        """Serve ``POST /v2/models/<m>[/versions/<v>]/<verb>`` with ``handler``."""
        self.verbs[verb] = handler

    def add_path(self, path: str, handler: Handler) -> None:
        """Serve ``POST <path>`` with ``handler`` (its call has no model: the body names it)."""
        self.paths[path] = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            handler = self.paths.get(path)
            if handler is not None:
                await self._serve(scope, receive, send, handler, "", None)
                return
            parts = path.split("/")
            # ["", "v2", "models", m, verb] or ["", "v2", "models", m, "versions", v, verb]
            shaped = len(parts) == 5 or (len(parts) == 7 and parts[4] == "versions")
            if shaped and parts[1:3] == ["v2", "models"]:
                handler = self.verbs.get(parts[-1])
                if handler is not None:
                    version = parts[5] if len(parts) == 7 else None
                    await self._serve(scope, receive, send, handler, parts[3], version)
                    return
        await self.app(scope, receive, send)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        handler: Handler,
        model: str,
        version: str | None,
    ) -> None:
        rt: Runtime = self.app.state.runtime
        limit = rt.config.max_body_bytes
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await _send_reply(send, too_large(limit))
            return
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), rt.config.read_timeout_s)
            except TimeoutError:
                await _send_reply(send, error_body(408, "the request body came too slowly"))
                return
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:  # a chunked body with no Content-Length, past the bound
                await _send_reply(send, too_large(limit))
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        call = Call(model, version, b"".join(chunks), headers, send)
        work = asyncio.ensure_future(handler(rt, call))
        rt.pending.add(work)  # a shutdown past its grace period cancels what is left
        work.add_done_callback(rt.pending.discard)
        gone = asyncio.ensure_future(_disconnected(receive))
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        if call.finished and not work.done():  # answered in full: let its accounting finish
            await asyncio.wait((work,))
        if not work.done():  # the client went away: so does its request (queue slot included)
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            return
        gone.cancel()
        if work.cancelled():
            if call.started:
                await call.write(b"", more=False)
            else:
                await _send_reply(send, error_body(503, "the sidecar is shutting down"))
            return
        reply = work.result()
        if reply is not None:
            await _send_reply(send, reply)


async def _disconnected(receive: Receive) -> None:
    """Return once the client has disconnected (the body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _send_reply(send: Send, reply: Reply) -> None:
    status, out_headers, content = reply
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out_headers.items()]
    raw.append((b"content-length", str(len(content)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})
