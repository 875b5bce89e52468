"""Triton's generate extension through the scheduler: ``POST /v2/models/{m}/generate`` and
``…/generate_stream`` (server-sent events, passed through byte for byte), versions included.

Both go through :func:`api.admission.admit` as ``infer`` does: the same hints (in the body's
``parameters``, or the ``x-*`` headers; ``ttft_ms`` and ``tpot_ms`` for token SLOs), tenants,
limits and outcomes. A stream stays in flight, as one sequence in the engine, until its last
event; a client that leaves mid-stream frees its place at once (the upstream connection is closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from api.admission import Admission, Inbound, admit
from api.dispatcher import Job, post
from api.errors import error_body
from api.hints import BadRequestError
from api.http_infer import STATUS, Reply
from api.routes.inference import Call
from api.runtime import Runtime
from api.streaming import Relay, TokenMeter, stream_send, token_slos
from api.tensors import MAX_JSON_DEPTH, ModelLimits, json_depth
from api.upstream import UpstreamResponse

FORWARD = ("content-type", "accept", "accept-encoding")


class JsonBody:
    """A JSON request body (generate, OpenAI): hints from ``parameters``, or from the top-level
    keys named in ``hint_keys`` (the OpenAI API has no ``parameters``)."""

    __slots__ = ("_body", "_hint_keys", "_json")

    def __init__(self, body: bytes, hint_keys: tuple[str, ...] = ()) -> None:
        self._body = body
        self._hint_keys = hint_keys
        self._json: dict[str, Any] | None = None

    def parsed(self) -> dict[str, Any]:
        if self._json is None:
            try:
                obj = json.loads(self._body)
            except (ValueError, RecursionError) as err:
                raise BadRequestError(f"malformed request body: {err}") from None
            if not isinstance(obj, dict):
                raise BadRequestError("malformed request body: expected a JSON object")
            if json_depth(obj) > MAX_JSON_DEPTH:
                raise BadRequestError(f"request JSON is nested deeper than {MAX_JSON_DEPTH}")
            self._json = obj
        return self._json

    def parameters(self) -> Any:
        obj = self.parsed()
        if self._hint_keys:
            return {k: obj[k] for k in self._hint_keys if k in obj}
        return obj.get("parameters")

    def check(self, *, max_elements: int, model: ModelLimits | None) -> None:
        self.parsed()


def forwarded(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k in FORWARD if (v := headers.get(k)) is not None}


ErrorShape = Callable[[int, str], Reply]


def refusal(admission: Admission, shape: ErrorShape = error_body) -> Reply:
    """A request the sidecar answered itself: the protocol's error (``shape`` writes it)."""
    status, out_headers, content = shape(STATUS[admission.outcome], admission.message)
    if admission.retry:
        out_headers = {**out_headers, "retry-after": "1"}
    return status, out_headers, content


async def relay_stream(
    rt: Runtime, call: Call, inbound: Inbound, relay: Relay, shape: ErrorShape = error_body
) -> Reply | None:
    """Admit a streamed request and write its events to the client as they come; the error
    reply when it was refused before its stream began."""
    work = asyncio.ensure_future(admit(rt, inbound))
    ended = False
    try:
        while not ended:
            if relay.events.empty():
                if work.done():
                    break
                getter = asyncio.ensure_future(relay.events.get())
                await asyncio.wait((getter, work), return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    continue
                kind, value = getter.result()
            else:
                kind, value = relay.events.get_nowait()
            if kind == "start":
                status, headers = value
                await call.start(status, {**headers, "cache-control": "no-cache"})
            elif kind == "chunk":
                await call.write(value)
            else:
                await call.write(value, more=False)
                ended = True
        admission = await work
    finally:
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
    if call.started:
        if not ended:  # the upstream failed mid-stream: end what the client has
            await call.write(b"", more=False)
        return None
    if admission.answer is not None:  # no stream came back (the upstream failed to start one)
        return shape(503, "no stream came back from the upstream")
    return refusal(admission, shape)


async def generate(rt: Runtime, call: Call) -> Reply:
    """``generate``: one reply, as ``infer``."""
    path = _path(call, "generate")
    inbound = Inbound(
        protocol="http",
        model=call.model,
        body=JsonBody(call.body),
        headers=call.headers,
        arrival_s=time.monotonic(),
        job=Job(send=post(path, call.body, forwarded(call.headers))),
    )
    admission = await admit(rt, inbound)
    if admission.answer is None:
        return refusal(admission)
    answer: UpstreamResponse = admission.answer
    return answer.status, answer.headers, answer.body


async def generate_stream(rt: Runtime, call: Call) -> Reply | None:
    """``generate_stream``: Triton's server-sent events, relayed as they come."""
    arrival_s = time.monotonic()
    body = JsonBody(call.body)
    relay = Relay()
    meter = _meter(rt, call, body, arrival_s)
    send = stream_send(_path(call, "generate_stream"), call.body, forwarded(call.headers), relay,
                       meter)  # fmt: skip
    inbound = Inbound(
        "http",
        call.model,
        body,
        call.headers,
        arrival_s,
        Job(send=send, stream=True, tokens=meter),
        prompt_tokens=_prompt_tokens(body),
    )
    return await relay_stream(rt, call, inbound, relay)


def _prompt_tokens(body: JsonBody) -> int:
    """The prompt's length in words, a stand-in for tokens (0 when there is no text)."""
    try:
        text = body.parsed().get("text_input")
    except BadRequestError:
        return 0
    if isinstance(text, list) and text:
        text = text[0]
    return len(text.split()) if isinstance(text, str) else 0


def _path(call: Call, verb: str) -> str:
    if call.version:
        return f"/v2/models/{call.model}/versions/{call.version}/{verb}"
    return f"/v2/models/{call.model}/{verb}"


def _meter(rt: Runtime, call: Call, body: JsonBody, arrival_s: float) -> TokenMeter:
    """The stream's token meter, with its token SLOs when the hints give them."""
    try:
        params = body.parameters()
    except BadRequestError:
        params = None  # admission refuses it before any token
    return TokenMeter(
        arrival_s=arrival_s,
        metrics=rt.metrics,
        model_label=rt.models.label(call.model),
        slos=token_slos(params, call.headers),
    )
