"""Inference: ``POST /v2/models/{model}[/versions/{version}]/infer``, through the scheduler.

``infer`` does the work and is shared: by the FastAPI route (documented in the OpenAPI schema)
and by :class:`InferenceFastPath`, a thin ASGI layer that serves the same requests without
FastAPI's routing and middleware stack, which cost about half the sidecar's CPU per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.dispatcher import Job, RejectedError, UnavailableError
from api.errors import error_body
from api.hints import HEADER_LENGTH, BadRequestError, json_header, parse_hints
from api.runtime import Runtime
from api.tenants import UnknownTokenError
from api.tensors import check_request
from scheduler.weights import weight_for_nice

router = APIRouter(tags=["inference"])
PASS_HEADERS = ("content-type", HEADER_LENGTH, "accept-encoding", "content-encoding")
Reply = tuple[int, dict[str, str], bytes]


async def infer(
    rt: Runtime, model: str, version: str | None, body: bytes, headers: Mapping[str, str]
) -> Reply:
    """Schedule one inference request and return Triton's reply (or the protocol's error)."""
    arrival_s = time.monotonic()
    metrics = rt.metrics
    label = rt.models.label(model)
    if rt.draining:
        metrics.count(label, "", "", "unavailable")
        return _retry_later(503, "the sidecar is shutting down")
    if not rt.triton_up:
        metrics.count(label, "", "", "unavailable")
        return _retry_later(503, "Triton is unavailable (restarting or unreachable); retry later")
    try:
        request_json = json_header(body, headers)
        hints = parse_hints(request_json, headers, rt.config.priority_levels)
    except BadRequestError as err:
        metrics.count(label, "", "", "bad_request")
        return error_body(400, str(err))
    if rt.tenants is not None:
        try:
            hints = rt.tenants.apply(hints, headers.get("authorization"))
        except UnknownTokenError as err:
            metrics.count(label, "", "", "unauthorized")
            return error_body(401, str(err))
    client = metrics.client_label(hints.client_id)
    assert rt.dispatcher is not None
    level = rt.dispatcher.scheduler.config.level_of(hints.priority)
    priority = str(level)
    metrics.client_weight.labels(client, priority).set(weight_for_nice(hints.nice))
    if not await rt.models.exists(model):
        metrics.count(label, priority, client, "unknown_model")
        return error_body(404, f"Request for unknown model: '{model}' is not found")
    label = rt.models.label(model)
    header_length = headers.get(HEADER_LENGTH)
    try:
        check_request(
            request_json,
            len(body) - int(header_length) if header_length is not None else 0,
            max_elements=rt.config.max_request_elements,
            model=await rt.models.limits(model),
        )
    except BadRequestError as err:
        metrics.count(label, priority, client, "bad_request")
        return error_body(400, str(err))
    path = (
        f"/v2/models/{model}/versions/{version}/infer" if version else f"/v2/models/{model}/infer"
    )
    job = Job(
        path=path,
        body=body,
        timeout_us=hints.timeout_us,
        headers={k: v for k in PASS_HEADERS if (v := headers.get(k)) is not None},
    )
    request = hints.request(model, arrival_s, rt.config.slo_ms, job)
    assert rt.dispatcher is not None
    try:
        upstream = await rt.dispatcher.submit(request)
    except RejectedError as err:
        metrics.count(label, priority, client, "rejected")
        return _retry_later(429, str(err))
    except UnavailableError as err:
        metrics.count(label, priority, client, "unavailable")
        return error_body(503, str(err))
    metrics.count(label, priority, client, "ok" if upstream.status == 200 else "triton_error")
    return upstream.status, upstream.headers, upstream.body


def _retry_later(status: int, message: str) -> Reply:
    status, headers, content = error_body(status, message)
    return status, {**headers, "retry-after": "1"}, content


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


class InferenceFastPath:
    """ASGI: ``POST /v2/models/<m>[/versions/<v>]/infer`` straight to :func:`infer`; all else to
    the FastAPI app (lifespan included)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            parts = scope["path"].split("/")
            # ["", "v2", "models", m, "infer"] or ["", "v2", "models", m, "versions", v, "infer"]
            shaped = len(parts) == 5 or (len(parts) == 7 and parts[4] == "versions")
            if shaped and parts[1:3] == ["v2", "models"] and parts[-1] == "infer":
                version = parts[5] if len(parts) == 7 else None
                await self._serve(scope, receive, send, parts[3], version)
                return
        await self.app(scope, receive, send)

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, model: str, version: str | None
    ) -> None:
        rt: Runtime = self.app.state.runtime
        limit = rt.config.max_body_bytes
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await _send_reply(send, _too_large(limit))
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
                await _send_reply(send, _too_large(limit))
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        work = asyncio.ensure_future(infer(rt, model, version, b"".join(chunks), headers))
        rt.pending.add(work)  # a shutdown past its grace period cancels what is left
        work.add_done_callback(rt.pending.discard)
        gone = asyncio.ensure_future(_disconnected(receive))
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        if not work.done():  # the client went away: so does its request (queue slot included)
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            rt.metrics.count(rt.models.label(model), "", "", "abandoned")
            return
        gone.cancel()
        if work.cancelled():
            await _send_reply(send, error_body(503, "the sidecar is shutting down"))
            return
        await _send_reply(send, work.result())


async def _disconnected(receive: Receive) -> None:
    """Return once the client has disconnected (the body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _too_large(limit: int) -> Reply:
    return error_body(413, f"request body larger than {limit} bytes (--max-body-bytes)")


async def _send_reply(send: Send, reply: Reply) -> None:
    status, out_headers, content = reply
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out_headers.items()]
    raw.append((b"content-length", str(len(content)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})
