"""``POST /v2/models/{model}[/versions/{version}]/infer``: through the scheduler to Triton."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.dispatcher import Job, RejectedError, UnavailableError
from api.errors import error
from api.hints import HEADER_LENGTH, BadRequestError, json_header, parse_hints
from api.runtime import Runtime
from scheduler.request import Request as SchedRequest

router = APIRouter(tags=["inference"])
PASS_HEADERS = ("content-type", HEADER_LENGTH, "accept-encoding", "content-encoding")


@router.post("/v2/models/{model}/infer")
async def infer(model: str, request: Request) -> Response:
    return await _infer(model, None, request)


@router.post("/v2/models/{model}/versions/{version}/infer")
async def infer_version(model: str, version: str, request: Request) -> Response:
    return await _infer(model, version, request)


async def _infer(model: str, version: str | None, request: Request) -> Response:
    arrival_s = time.monotonic()
    rt: Runtime = request.app.state.runtime
    metrics = rt.metrics
    body = await request.body()
    headers = request.headers
    try:
        hints = parse_hints(json_header(body, headers), headers, rt.config.priority_levels)
    except BadRequestError as err:
        metrics.requests.labels(model, "", "", "bad_request").inc()
        return error(400, str(err))
    client = metrics.client_label(hints.client_id)
    if not await rt.model_exists(model):
        metrics.requests.labels(model, str(hints.priority), client, "unknown_model").inc()
        return error(404, f"Request for unknown model: '{model}' is not found")
    path = (
        f"/v2/models/{model}/versions/{version}/infer" if version else f"/v2/models/{model}/infer"
    )
    job = Job(
        path=path,
        body=body,
        timeout_us=hints.timeout_us,
        headers={k: v for k in PASS_HEADERS if (v := headers.get(k)) is not None},
    )
    sched_request = SchedRequest(
        model=model,
        arrival_s=arrival_s,
        slo_ms=hints.slo_ms or rt.config.slo_ms,
        priority=hints.priority,
        nice=hints.nice,
        client_id=hints.client_id,
        payload=job,
    )
    assert rt.dispatcher is not None
    try:
        upstream = await rt.dispatcher.submit(sched_request)
    except RejectedError as err:
        metrics.requests.labels(model, str(hints.priority), client, "rejected").inc()
        return error(429, str(err), {"Retry-After": "1"})
    except UnavailableError as err:
        metrics.requests.labels(model, str(hints.priority), client, "unavailable").inc()
        return error(503, str(err))
    outcome = "ok" if upstream.status == 200 else "triton_error"
    metrics.requests.labels(model, str(hints.priority), client, outcome).inc()
    return Response(content=upstream.body, status_code=upstream.status, headers=upstream.headers)
