"""``/admin``: see the queues and the device, change the policy, force a clock, reload a table.

Every call needs ``Authorization: Bearer <token>``, the token given by ``--admin-token`` or
``SIDECAR_ADMIN_TOKEN``; with none configured the admin API is disabled (403).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field, ValidationError

from api.runtime import Gpu, Runtime
from dvfs.errors import DeviceError
from scheduler.config import TOKENS
from scheduler.policies import ClockPolicy, FixedPolicy
from scheduler.registry import POLICIES
from time2clock.table import TableError, TableSet

bearer = HTTPBearer(auto_error=False, description="the sidecar's --admin-token")


def _runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


def require_admin(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Runtime:
    rt = _runtime(request)
    token = rt.config.admin_token
    if token is None:
        raise HTTPException(
            403, "admin API disabled: start the sidecar with --admin-token or SIDECAR_ADMIN_TOKEN"
        )
    given = None if credentials is None else credentials.credentials.encode()
    if given is None or not secrets.compare_digest(given, token.encode()):
        raise HTTPException(
            401,
            "admin API needs 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return rt


Admin = Annotated[Runtime, Depends(require_admin)]
router = APIRouter(prefix="/admin", tags=["admin"])


class PolicyChange(BaseModel):
    policy: str = Field(description="one of: " + ", ".join(POLICIES))


class ClockForce(BaseModel):
    clock_mhz: int | None = Field(
        description="a supported clock; null hands control back to --policy"
    )


class TableReload(BaseModel):
    path: str = Field(
        description="a time2clock table file on the sidecar's machine; its models replace "
        "theirs, the other models keep their tables"
    )


BodyT = TypeVar("BodyT", bound=BaseModel)


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Document a JSON body that the route reads itself."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


@router.get("/state")
async def state(rt: Admin) -> dict[str, Any]:
    """Per GPU (``gpus``, each with its ``gpu`` label): queues, in-flight requests, clock target
    and reading, policy, each model's batching and table, its Triton; the top level repeats
    GPU 0's (as with one GPU) and adds the placement, and requests taken by protocol (HTTP and
    gRPC feed the same queues), and the worst lag of the event loop seen (:mod:`api.looplag`)."""
    gpus = []
    for gpu in rt.gpus:
        assert gpu.dispatcher is not None and gpu.device is not None
        clock_mhz = await asyncio.to_thread(gpu.device.clock_mhz)  # may block: not in the loop
        gpus.append(
            {
                **gpu.dispatcher.state(),
                "clock_mhz": clock_mhz,
                "triton_url": gpu.url,
                "triton_grpc_url": gpu.grpc_url,
                "triton_up": gpu.up,
                # the LLM engine's profile the token policy plans with (None: the embedded
                # engine's own, or none)
                "engine_profile": _text(gpu.engine_profile or rt.config.engine_profile),
            }
        )
    return {
        **gpus[0],
        "gpus": gpus,
        "placement": {
            "mode": rt.placer.mode,
            "pack_slo_share": rt.placer.params.pack_slo_share,
        },
        "requests_by_protocol": dict(rt.metrics.requests_by_protocol),
        "event_loop_lag_worst_ms": round(rt.loop_lag.worst_s * 1000.0, 3),
    }


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _swap(rt: Runtime, build: Callable[[Gpu], ClockPolicy]) -> dict[str, Any]:
    """Every GPU runs the policy ``build`` makes for it; GPU 0's answer (with one GPU, the only
    one), and with several each GPU's under ``gpus``. A policy a GPU cannot run (tokens
    without an engine profile) is a 400."""
    policies = []
    for gpu in rt.gpus:
        assert gpu.dispatcher is not None and gpu.device is not None
        try:
            policies.append(build(gpu))
        except ValueError as err:
            raise HTTPException(400, str(err)) from None
    out = []
    for gpu, policy in zip(rt.gpus, policies, strict=True):
        dispatcher = gpu.dispatcher
        assert dispatcher is not None
        dispatcher.set_policy(policy)
        out.append(
            {
                "gpu": gpu.index,
                "policy": dispatcher.policy.name,
                "clock_target_mhz": dispatcher.clock_target_mhz,
            }
        )
    first = {"policy": out[0]["policy"], "clock_target_mhz": out[0]["clock_target_mhz"]}
    return first if len(out) == 1 else {**first, "gpus": out}


def _clocks(gpu: Gpu) -> list[int]:
    assert gpu.device is not None
    return gpu.device.supported_clocks_mhz()


async def _json(request: Request, model: type[BodyT]) -> BodyT:
    """The body as JSON whatever its Content-Type says (curl -d sends a form type)."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in err.errors()
        )
        raise HTTPException(400, problems) from None


@router.put("/policy", openapi_extra=_body_schema(PolicyChange))
async def change_policy(request: Request, rt: Admin) -> dict[str, Any]:
    """Switch every GPU's clock policy now."""
    change = await _json(request, PolicyChange)
    if change.policy not in (*POLICIES, TOKENS):
        raise HTTPException(
            400, f"policy must be one of {', '.join((*POLICIES, TOKENS))}, got {change.policy!r}"
        )
    return _swap(rt, lambda gpu: rt.build_policy(change.policy, gpu))


@router.put("/clock", openapi_extra=_body_schema(ClockForce))
async def force_clock(request: Request, rt: Admin) -> dict[str, Any]:
    """Hold one clock on every GPU (the policy becomes ``fixed``); ``null`` goes back to
    ``--policy``."""
    force = await _json(request, ClockForce)
    if force.clock_mhz is None:
        return _swap(rt, lambda gpu: rt.build_policy(gpu=gpu))
    clock = force.clock_mhz
    try:
        return _swap(rt, lambda gpu: FixedPolicy(_clocks(gpu), clock))
    except ValueError as err:
        raise HTTPException(400, str(err)) from None


@router.post("/table", openapi_extra=_body_schema(TableReload))
async def reload_table(request: Request, rt: Admin) -> dict[str, Any]:
    """Load a time2clock table file; its models' tables replace theirs on every GPU."""
    reload = await _json(request, TableReload)
    try:
        loaded = await asyncio.to_thread(TableSet.load, Path(reload.path))
    except (TableError, OSError, ValueError) as err:
        raise HTTPException(400, str(err)) from None
    for dispatcher in rt.dispatchers:
        tables = TableSet(dispatcher.tables)
        for table in loaded:
            tables.add(table)
        dispatcher.set_tables(tables, reference=loaded)
    assert rt.dispatcher is not None
    name = rt.dispatcher.policy.name
    if name == "fixed":
        name = rt.config.policy.name
    try:
        swapped = _swap(rt, lambda gpu: rt.build_policy(name, gpu))
    except DeviceError as err:
        raise HTTPException(503, str(err)) from None
    return {**swapped, "table": reload.path, "models": loaded.models}
