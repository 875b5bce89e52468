"""The OpenAI-compatible API through the scheduler: ``/v1/completions``, ``/v1/chat/completions``
(streaming and not) and ``/v1/models``.

Two upstreams. With ``--upstream openai=URL`` (vLLM, TensorRT-LLM, Triton's own OpenAI front end
or any engine that speaks the API) requests and replies pass through byte for byte. Without it,
the front end speaks to Triton's ``generate``/``generate_stream`` itself, as Triton's OpenAI front
end does: the prompt (or the chat's messages, one ``role: content`` line each) becomes
``text_input``, ``max_tokens`` stays ``max_tokens``, and each ``text_output`` event becomes one
OpenAI chunk. Either way the request goes through :func:`api.admission.admit`; the scheduling
hints ride as top-level fields of the body (``priority``, ``nice``, ``slo_ms``, ``ttft_ms``,
``tpot_ms``, ``client_id``, ``timeout``; the SDK's ``extra_body``), or the ``x-*`` headers, and a
tenant's token is the API key the SDK sends.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.admission import Inbound, admit
from api.dispatcher import Answer, Job
from api.hints import BadRequestError
from api.http_infer import Reply
from api.routes.generate import JsonBody, forwarded, refusal, relay_stream
from api.routes.inference import Call
from api.runtime import Runtime
from api.streaming import Relay, TokenMeter, split_events, stream_send, token_slos
from api.upstream import Upstream, UpstreamResponse

HINT_KEYS = ("priority", "nice", "slo_ms", "ttft_ms", "tpot_ms", "client_id", "timeout")
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
router = APIRouter(tags=["openai"])


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def openai_error(status: int, message: str) -> Reply:
    """An error in the API's own shape, which the OpenAI SDKs raise as their typed errors."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return status, {"content-type": "application/json"}, json.dumps(body).encode()


def prompt_of(path: str, request: dict[str, Any]) -> str:
    """The text a completion continues: ``prompt``, or the chat's messages one per line."""
    if path == CHAT:
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequestError("messages must be a non-empty list")
        lines = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequestError("each message must be an object with a role")
            content = m.get("content", "")
            if isinstance(content, list):  # content parts: their text
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            lines.append(f"{m['role']}: {content}")
        return "\n".join(lines)
    prompt = request.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequestError("prompt must be a string")
    return prompt


def max_tokens_of(request: dict[str, Any]) -> int:
    value = request.get("max_completion_tokens", request.get("max_tokens", 16))
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise BadRequestError(f"max_tokens must be an integer in 1..1000000, got {value!r}")
    return value


class OpenAiChunks:
    """Re-frames Triton's ``generate_stream`` events as OpenAI chunks, then ``[DONE]``."""

    def __init__(self, path: str, model: str, request_id: str, created: int) -> None:
        self.chat = path == CHAT
        self.model = model
        self.id = request_id
        self.created = created
        self._pending = b""
        self._first = True

    def _event(self, text: str | None, finish: str | None) -> bytes:
        if self.chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if self._first and text is not None:
                delta["role"] = "assistant"
                self._first = False
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish}
            kind = "text_completion"
        body = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    def feed(self, chunk: bytes) -> bytes:
        events, self._pending = split_events(self._pending + chunk)
        out = []
        for event in events:
            data = event.partition(b"data:")[2].strip()
            if not data:
                continue
            try:
                text = json.loads(data).get("text_output", "")
            except (ValueError, AttributeError):
                continue
            out.append(self._event(str(text), None))
        return b"".join(out)

    def close(self) -> bytes:
        return self._event(None, "length") + b"data: [DONE]\n\n"


def completion_body(path: str, model: str, text: str, prompt_tokens: int, tokens: int) -> bytes:
    """A whole (non-streamed) completion in the API's shape."""
    if path == CHAT:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "length",
        }
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": "length"}
        kind = "text_completion"
    return json.dumps(
        {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": tokens,
                "total_tokens": prompt_tokens + tokens,
            },
        }
    ).encode()


def _via(
    target: Upstream, send: Callable[[Upstream], Awaitable[Answer]]
) -> Callable[[Upstream], Awaitable[Answer]]:
    """``send`` to ``target`` whatever the dispatcher's upstream (the OpenAI engine)."""

    def routed(_: Upstream) -> Awaitable[Answer]:
        return send(target)

    return routed


async def _post(path: str, body: bytes, headers: dict[str, str], upstream: Upstream) -> Answer:
    return await upstream.request("POST", path, body, headers)


async def serve(rt: Runtime, call: Call, path: str) -> Reply | None:
    """One completion or chat completion, streamed or not."""
    arrival_s = time.monotonic()
    body = JsonBody(call.body, HINT_KEYS)
    try:
        request = body.parsed()
        model = request.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequestError("model must be a non-empty string")
        stream = bool(request.get("stream", False))
        engine = rt.openai
        if engine is None:
            text_input, max_tokens = prompt_of(path, request), max_tokens_of(request)
    except BadRequestError as err:
        return openai_error(400, str(err))
    meter = TokenMeter(
        arrival_s=arrival_s,
        metrics=rt.metrics,
        model_label=rt.models.label(model),
        slos=token_slos(request, call.headers),
    )
    headers = forwarded(call.headers)
    if engine is not None:  # an OpenAI-compatible engine: bytes through
        if "authorization" in call.headers and rt.tenants is None:
            headers["authorization"] = call.headers["authorization"]
        if stream:
            relay = Relay()
            send = _via(engine, stream_send(path, call.body, headers, relay, meter))
            job = Job(send=send, stream=True, tokens=meter)
            inbound = Inbound("openai", model, body, call.headers, arrival_s, job, resolve=False,
                              prompt_tokens=_words(path, request))  # fmt: skip
            return await relay_stream(rt, call, inbound, relay, openai_error)
        job = Job(send=_via(engine, lambda up: _post(path, call.body, headers, up)))
        inbound = Inbound("openai", model, body, call.headers, arrival_s, job, resolve=False)
        admission = await admit(rt, inbound)
        if admission.answer is None:
            return refusal(admission, openai_error)
        answer: UpstreamResponse = admission.answer
        return answer.status, answer.headers, answer.body
    upstream_body = json.dumps({"text_input": text_input, "max_tokens": max_tokens}).encode()
    headers["content-type"] = "application/json"
    if stream:
        relay = Relay(OpenAiChunks(path, model, f"cmpl-{uuid.uuid4().hex}", int(time.time())))
        send = stream_send(f"/v2/models/{model}/generate_stream", upstream_body, headers, relay,
                           meter)  # fmt: skip
        job = Job(send, stream=True, tokens=meter)
        inbound = Inbound("openai", model, body, call.headers, arrival_s, job,
                          prompt_tokens=len(text_input.split()))  # fmt: skip
        return await relay_stream(rt, call, inbound, relay, openai_error)
    # Not streamed to the client, but streamed from Triton (a decoupled model answers generate
    # with its last response only): the tokens are gathered, and timed as they come.
    relay = Relay()
    send = stream_send(f"/v2/models/{model}/generate_stream", upstream_body, headers, relay, meter)
    job = Job(send=send, stream=True, tokens=meter)
    inbound = Inbound("openai", model, body, call.headers, arrival_s, job,
                      prompt_tokens=len(text_input.split()))  # fmt: skip
    admission = await admit(rt, inbound)
    if admission.answer is None:
        return refusal(admission, openai_error)
    status, events = 0, b""
    while not relay.events.empty():
        kind, value = relay.events.get_nowait()
        if kind == "start":
            status = value[0]
        elif kind == "chunk":
            events += value
    if status != 200:  # Triton's error, in the API's shape
        try:
            message = str(json.loads(events).get("error", ""))
        except (ValueError, AttributeError):
            message = events.decode(errors="replace")
        return openai_error(status or 502, message or f"the model answered {status}")
    texts = []
    for event in split_events(events)[0]:
        try:
            texts.append(str(json.loads(event.partition(b"data:")[2]).get("text_output", "")))
        except (ValueError, AttributeError):
            return openai_error(502, "the model's stream is not generate_stream's events")
    out = completion_body(path, model, "".join(texts), len(text_input.split()), len(texts))
    return 200, {"content-type": "application/json"}, out


def _words(path: str, request: dict[str, Any]) -> int:
    """The prompt's length in words, a stand-in for tokens (0 when it cannot be read)."""
    try:
        return len(prompt_of(path, request).split())
    except BadRequestError:
        return 0


async def completions(rt: Runtime, call: Call) -> Reply | None:
    return await serve(rt, call, COMPLETIONS)


async def chat_completions(rt: Runtime, call: Call) -> Reply | None:
    return await serve(rt, call, CHAT)


@router.get("/v1/models")
async def models(request: Request) -> Response:
    """The models: the engine's own list, or Triton's (each one a generate-capable name)."""
    rt: Runtime = request.app.state.runtime
    if rt.openai is not None:
        reply = await rt.openai.request("GET", "/v1/models", timeout_s=10.0)
        return Response(reply.body, reply.status, reply.headers)
    names = await rt.models.names()
    data = [{"id": n, "object": "model", "created": 0, "owned_by": "triton"} for n in names]
    return Response(json.dumps({"object": "list", "data": data}), 200,
                    media_type="application/json")  # fmt: skip
