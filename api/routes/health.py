"""Health and metadata: the sidecar's liveness; Triton's answers passed through byte for byte."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.errors import error
from api.runtime import Runtime
from api.upstream_errors import UpstreamUnavailableError

router = APIRouter(tags=["health and metadata"])


@router.get("/v2/health/live")
async def live(request: Request) -> Response:
    """The sidecar is up; 503 once a GPU's Triton has been down past ``--liveness-grace-s``
    (then only a restart of the pod will help)."""
    rt: Runtime = request.app.state.runtime
    if not rt.live():
        return error(503, f"Triton has been down for over {rt.config.liveness_grace_s:g} s")
    return Response(status_code=200)


async def _proxy(request: Request, path: str) -> Response:
    rt: Runtime = request.app.state.runtime
    upstream = rt.upstream_up()
    assert upstream is not None
    try:
        resp = await upstream.request("GET", path)
    except UpstreamUnavailableError as err:
        return error(503, str(err))
    status = resp.status
    if status == 400 and b"unknown model" in resp.body.lower():
        status = 404  # Triton says 400; a missing resource is a 404
    return Response(content=resp.body, status_code=status, headers=resp.headers)


@router.get("/v2/health/ready")
async def ready(request: Request) -> Response:
    """Ready when a GPU's Triton is ready and the dispatchers run."""
    rt: Runtime = request.app.state.runtime
    if rt.dispatcher is None:
        return error(503, "the sidecar is starting")
    if rt.draining:
        return error(503, "the sidecar is shutting down")
    if not rt.triton_up:
        return error(503, "Triton is unavailable")
    return await _proxy(request, "/v2/health/ready")


@router.get("/v2")
async def server_metadata(request: Request) -> Response:
    return await _proxy(request, "/v2")


@router.get("/v2/models/{model}")
async def model_metadata(model: str, request: Request) -> Response:
    return await _proxy(request, f"/v2/models/{model}")


@router.get("/v2/models/{model}/versions/{version}")
async def model_version_metadata(model: str, version: str, request: Request) -> Response:
    return await _proxy(request, f"/v2/models/{model}/versions/{version}")


@router.get("/v2/models/{model}/{what}")
async def model_resource(model: str, what: str, request: Request) -> Response:
    """``ready``, ``config`` and ``stats`` of a model."""
    if what not in ("ready", "config", "stats"):
        return error(404, f"no such resource: {what!r} (ready, config, stats)")
    return await _proxy(request, f"/v2/models/{model}/{what}")


@router.get("/v2/models/{model}/versions/{version}/{what}")
async def model_version_resource(model: str, version: str, what: str, request: Request) -> Response:
    if what not in ("ready", "config", "stats"):
        return error(404, f"no such resource: {what!r} (ready, config, stats)")
    return await _proxy(request, f"/v2/models/{model}/versions/{version}/{what}")
