"""One admission path for every protocol: hints, tenants, model, tensor checks, the queue.

A front end reads a request just enough to hand :func:`admit` an :class:`Inbound` (its model,
where its hints and tensors are, and a :class:`api.dispatcher.Job` that knows how to send it),
and maps the :class:`Admission` that comes back to its own statuses. Every limit and every
outcome's name is therefore the same over HTTP, gRPC and whatever protocol comes next; a client
that leaves is ``abandoned`` whichever protocol it spoke.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from api.dispatcher import Job, RejectedError, UnavailableError
from api.hints import BadRequestError, parse_hints
from api.runtime import Runtime
from api.tenants import UnknownTokenError
from api.tensors import ModelLimits
from scheduler.weights import weight_for_nice


class Outcome(StrEnum):
    """How a request ended, as the ``outcome`` label of ``sidecar_requests_total`` names it."""

    OK = "ok"
    TRITON_ERROR = "triton_error"  # Triton answered with an error of its own
    BAD_REQUEST = "bad_request"
    UNAUTHORIZED = "unauthorized"
    UNKNOWN_MODEL = "unknown_model"
    REJECTED = "rejected"  # queue full or fair share reached: retry later
    UNAVAILABLE = "unavailable"  # Triton down, timeout expired, shutting down
    ABANDONED = "abandoned"  # the client went away before its answer


class RequestBody(Protocol):
    """The part of a request admission reads: its ``parameters`` and its tensors."""

    def parameters(self) -> Any:
        """The request's ``parameters`` (hints), as sent; :class:`BadRequestError` if the
        request cannot be read."""

    def check(self, *, max_elements: int, model: ModelLimits | None) -> None:
        """:class:`BadRequestError` unless the tensors agree with their shapes and bounds."""


@dataclass(slots=True)  # not frozen: built per request, and cheaper so
class Inbound:
    """One request as a front end hands it over."""

    protocol: str
    model: str
    body: RequestBody
    headers: Mapping[str, str]  # text headers or metadata: hint fallbacks, authorization
    arrival_s: float
    job: Job
    # Whether the model must be one Triton serves (checked, and its config's bounds applied);
    # False when another engine serves it (the OpenAI upstream answers for its own models).
    resolve: bool = True
    prompt_tokens: int = 0  # a generative request: its prompt's length, as the edge estimates it


@dataclass(slots=True)  # not frozen: built per request, and cheaper so
class Admission:
    """What became of a request: the upstream's answer when it was sent, else why not.

    ``retry``: the refusal is temporary (shutting down, Triton restarting, queue full).
    ``gpu``: which GPU served it (its label, as in the metrics), once it was sent.
    """

    outcome: Outcome
    message: str = ""
    answer: Any = None
    retry: bool = False
    gpu: str | None = None


async def admit(rt: Runtime, inbound: Inbound) -> Admission:
    """Queue ``inbound`` through the scheduler and wait for its answer, or say why not.

    Cancelling the caller (the client went away, or a shutdown past its grace) takes the
    request out of the queue; it is counted ``abandoned`` (``unavailable`` when shutting down).
    """
    tally = _Tally(rt, inbound)
    try:
        return await _admit(rt, inbound, tally)
    except asyncio.CancelledError:
        if not tally.counted:
            tally.done(Outcome.UNAVAILABLE if rt.draining else Outcome.ABANDONED)
        raise


class _Tally:
    """Counts a request's outcome once, with the labels known so far."""

    __slots__ = ("client", "counted", "inbound", "priority", "rt")

    def __init__(self, rt: Runtime, inbound: Inbound) -> None:
        self.rt, self.inbound = rt, inbound
        self.priority = self.client = ""
        self.counted = False

    def done(self, outcome: Outcome, message: str = "", *, retry: bool = False) -> Admission:
        label = self.rt.models.label(self.inbound.model)
        self.rt.metrics.count(label, self.priority, self.client, outcome, self.inbound.protocol)
        self.counted = True
        return Admission(outcome, message, retry=retry)


async def _admit(rt: Runtime, inbound: Inbound, tally: _Tally) -> Admission:
    done = tally.done
    if rt.draining:
        return done(Outcome.UNAVAILABLE, "the sidecar is shutting down", retry=True)
    if not rt.triton_up:
        return done(
            Outcome.UNAVAILABLE,
            "Triton is unavailable (restarting or unreachable); retry later",
            retry=True,
        )
    dispatcher = rt.dispatcher
    assert dispatcher is not None, "admission runs only while the runtime is started"
    try:
        params = {"parameters": inbound.body.parameters()}
        hints = parse_hints(params, inbound.headers, dispatcher.priority_levels)
        if rt.tenants is not None:
            hints = rt.tenants.apply(hints, inbound.headers.get("authorization"))
    except BadRequestError as err:
        return done(Outcome.BAD_REQUEST, str(err))
    except UnknownTokenError as unknown:
        return done(Outcome.UNAUTHORIZED, str(unknown))
    metrics, models, model = rt.metrics, rt.models, inbound.model
    tally.client = metrics.client_label(hints.client_id)
    tally.priority = str(dispatcher.level_of(hints.priority))
    metrics.client_weight_of(tally.client, tally.priority).set(weight_for_nice(hints.nice))
    if inbound.resolve and model not in models.known and not await models.exists(model):
        return done(Outcome.UNKNOWN_MODEL, f"Request for unknown model: '{model}' is not found")
    try:
        limits = (
            (models.cached_limits(model) or await models.limits(model)) if inbound.resolve else None
        )
        inbound.body.check(max_elements=rt.config.max_request_elements, model=limits)
    except BadRequestError as err:
        return done(Outcome.BAD_REQUEST, str(err))
    inbound.job.timeout_us = hints.timeout_us
    try:
        request = hints.request(
            model, inbound.arrival_s, rt.config.slo_ms, inbound.job, rt.config.slo_outside_ms
        )
    except BadRequestError as err:
        return done(Outcome.BAD_REQUEST, str(err))
    request.prompt_tokens = inbound.prompt_tokens
    target = rt.place(request)  # the GPU that takes it (the only one, on a node of one)
    try:
        answer = await target.submit(request)
    except RejectedError as rejected:
        return done(Outcome.REJECTED, str(rejected), retry=True)
    except UnavailableError as unavailable:
        return done(Outcome.UNAVAILABLE, str(unavailable))
    outcome = done(Outcome.OK if answer.ok else Outcome.TRITON_ERROR).outcome
    return Admission(outcome, answer=answer, gpu=target.gpu)
