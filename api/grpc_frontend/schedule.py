"""One gRPC inference request through the scheduler: hints, admission, the shared queue.

The same rules as HTTP (:mod:`api.routes.inference`): hints from the request's ``parameters``
(``priority``, ``timeout``, ``nice``, ``slo_ms``, ``client_id``) with metadata (``x-priority``,
``x-nice``, ``x-slo-ms``, ``x-client-id``) as the fallback, validated by :mod:`api.hints`; the
errors are gRPC statuses with the meaning of the HTTP ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from api.dispatcher import Job, RejectedError, UnavailableError
from api.grpc_frontend.protocol import parameter_values
from api.hints import BadRequestError, parse_hints
from api.runtime import Runtime
from api.tenants import UnknownTokenError
from scheduler.weights import weight_for_nice

PROTOCOL = "grpc"


class GrpcStatusError(Exception):
    """The request is answered with this status instead of Triton's reply."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class GrpcAnswer:
    """Triton's answer to one request: its status, and for a unary call the reply's bytes."""

    code: grpc.StatusCode
    details: str = ""
    body: bytes = b""
    trailing: tuple[tuple[str, str | bytes], ...] = ()

    @property
    def ok(self) -> bool:
        return bool(self.code == grpc.StatusCode.OK)


async def schedule(
    rt: Runtime,
    request: Any,
    metadata: Mapping[str, str],
    arrival_s: float,
    send: Callable[[], Awaitable[GrpcAnswer]],
) -> GrpcAnswer:
    """Queue ``request`` (a parsed ``ModelInferRequest``) and return what ``send`` got from
    Triton; :class:`GrpcStatusError` when the sidecar answers itself."""
    metrics = rt.metrics
    model: str = request.model_name
    label = rt.models.label(model)
    if rt.draining or not rt.triton_up:
        metrics.count(label, "", "", "unavailable", PROTOCOL)
        reason = "the sidecar is shutting down" if rt.draining else "Triton is unavailable"
        raise GrpcStatusError(grpc.StatusCode.UNAVAILABLE, f"{reason}; retry later")
    try:
        hints = parse_hints(
            {"parameters": parameter_values(request.parameters)},
            metadata,
            rt.config.priority_levels,
        )
        if rt.tenants is not None:
            hints = rt.tenants.apply(hints, metadata.get("authorization"))
    except BadRequestError as err:
        metrics.count(label, "", "", "bad_request", PROTOCOL)
        raise GrpcStatusError(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None
    except UnknownTokenError as err:
        metrics.count(label, "", "", "unauthorized", PROTOCOL)
        raise GrpcStatusError(grpc.StatusCode.UNAUTHENTICATED, str(err)) from None
    client = metrics.client_label(hints.client_id)
    assert rt.dispatcher is not None
    priority = str(rt.dispatcher.scheduler.config.level_of(hints.priority))
    metrics.client_weight.labels(client, priority).set(weight_for_nice(hints.nice))
    if not await rt.model_exists(model):
        metrics.count(label, priority, client, "unknown_model", PROTOCOL)
        raise GrpcStatusError(
            grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{model}' is not found"
        )
    job = Job(timeout_us=hints.timeout_us, send=send)
    sched_request = hints.request(model, arrival_s, rt.config.slo_ms, job)
    label = rt.models.label(model)
    task = asyncio.current_task()
    if task is not None:
        rt.pending.add(task)  # a bounded shutdown answers it, as it answers HTTP's
    try:
        answer: GrpcAnswer = await rt.dispatcher.submit(sched_request)
    except asyncio.CancelledError:  # the client went away; the dispatcher will not send it
        metrics.count(label, priority, client, "cancelled", PROTOCOL)
        raise
    except RejectedError as err:
        metrics.count(label, priority, client, "rejected", PROTOCOL)
        raise GrpcStatusError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err)) from None
    except UnavailableError as err:
        metrics.count(label, priority, client, "unavailable", PROTOCOL)
        raise GrpcStatusError(grpc.StatusCode.UNAVAILABLE, str(err)) from None
    finally:
        if task is not None:
            rt.pending.discard(task)
    metrics.count(label, priority, client, "ok" if answer.ok else "triton_error", PROTOCOL)
    return answer
