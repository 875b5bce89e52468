"""``GET /metrics`` in the Prometheus text format.

``?name[]=FAMILY`` (repeatable) restricts the answer to those families, as prometheus_client's
own exposition does: a tool that samples one value several times a second (the load
generator's clock sampler) then costs the event loop that value, not the whole exposition.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter(tags=["metrics"])


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    registry = request.app.state.runtime.metrics.registry
    names = request.query_params.getlist("name[]")
    source = registry.restricted_registry(names) if names else registry
    return Response(generate_latest(source), media_type=CONTENT_TYPE_LATEST)
