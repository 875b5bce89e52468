"""Inference: ``POST /v2/models/{model}[/versions/{version}]/infer``, through the scheduler.

``infer`` does the work and is shared: by the FastAPI route (documented in the OpenAPI schema)
and by :class:`InferenceFastPath`, a thin ASGI layer that serves the same requests without
FastAPI's routing and middleware stack, which cost about half the sidecar's CPU per request.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.dispatcher import Job, RejectedError, UnavailableError
from api.errors import error_body
from api.hints import HEADER_LENGTH, BadRequestError, json_header, parse_hints
from api.runtime import Runtime
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
    try:
        hints = parse_hints(json_header(body, headers), headers, rt.config.priority_levels)
    except BadRequestError as err:
        metrics.count(model, "", "", "bad_request")
        return error_body(400, str(err))
    client = metrics.client_label(hints.client_id)
    assert rt.dispatcher is not None
    level = rt.dispatcher.scheduler.config.level_of(hints.priority)
    priority = str(level)
    metrics.client_weight.labels(client, priority).set(weight_for_nice(hints.nice))
    if not await rt.model_exists(model):
        metrics.count(model, priority, client, "unknown_model")
        return error_body(404, f"Request for unknown model: '{model}' is not found")
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
        metrics.count(model, priority, client, "rejected")
        status, hdrs, content = error_body(429, str(err))
        return status, {**hdrs, "retry-after": "1"}, content
    except UnavailableError as err:
        metrics.count(model, priority, client, "unavailable")
        return error_body(503, str(err))
    metrics.count(model, priority, client, "ok" if upstream.status == 200 else "triton_error")
    return upstream.status, upstream.headers, upstream.body


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
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        status, out_headers, content = await infer(
            self.app.state.runtime, model, version, b"".join(chunks), headers
        )
        raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out_headers.items()]
        raw.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": content})
