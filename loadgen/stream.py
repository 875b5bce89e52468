"""A streaming client for generative endpoints that timestamps every server-sent event.

Three endpoints, as aiperf and genai-perf drive them: the OpenAI-compatible
``/v1/chat/completions`` (``openai-chat``) and ``/v1/completions`` (``openai-completions``) with
``stream: true``, and Triton's ``/v2/models/{m}/generate_stream``. A *token* is an event whose
text is not empty (a chat's role-only first chunk, the closing chunk with the finish reason and
``[DONE]`` are not tokens): Triton's LLM backends and OpenAI-compatible engines send one token per
event when streaming. Each event is stamped with the time its bytes were read from the socket
(``time.perf_counter``), before it is parsed, so parsing does not add to the figures.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from loadgen.generative import StreamRecord
from loadgen.synthetic import GenRequest

OPENAI_CHAT = "openai-chat"
OPENAI_COMPLETIONS = "openai-completions"
GENERATE_STREAM = "generate_stream"
ENDPOINTS = (OPENAI_CHAT, OPENAI_COMPLETIONS, GENERATE_STREAM)
ALIASES = {"chat": OPENAI_CHAT, "completions": OPENAI_COMPLETIONS}
HINTS = ("priority", "nice", "slo_ms", "ttft_ms", "tpot_ms", "client_id")


class StreamError(Exception):
    """An error the server reported inside a stream."""


def endpoint_name(text: str) -> str:
    """The canonical endpoint name (aiperf's ``chat`` and ``completions`` accepted)."""
    name = ALIASES.get(text, text)
    if name not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {text!r}")
    return name


def endpoint_path(endpoint: str, model: str) -> str:
    if endpoint == OPENAI_CHAT:
        return "/v1/chat/completions"
    if endpoint == OPENAI_COMPLETIONS:
        return "/v1/completions"
    return f"/v2/models/{model}/generate_stream"


def request_body(
    endpoint: str,
    model: str,
    request: GenRequest,
    hints: Mapping[str, object] | None = None,
    extra: Mapping[str, object] | None = None,
) -> bytes:
    """The streamed request's JSON. Scheduling hints ride where each protocol has room for
    them: top-level fields of an OpenAI body, the ``parameters`` of a generate body."""
    body: dict[str, Any]
    if endpoint == GENERATE_STREAM:
        body = {"text_input": request.prompt}
        if request.output_tokens is not None:
            body["max_tokens"] = request.output_tokens
        if hints:
            body["parameters"] = dict(hints)
    else:
        body = {"model": model, "stream": True}
        if endpoint == OPENAI_CHAT:
            body["messages"] = [{"role": "user", "content": request.prompt}]
        else:
            body["prompt"] = request.prompt
        if request.output_tokens is not None:
            body["max_tokens"] = request.output_tokens
        body.update(hints or {})
    body.update(extra or {})
    return json.dumps(body).encode()


class SseReader:
    """Server-sent events from a byte stream, as the HTML standard parses them: lines end with
    ``\\n`` or ``\\r\\n``; an event's ``data:`` lines are joined by ``\\n``; a blank line ends the
    event; comment lines (``:``) and other fields are skipped."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of every event that ``chunk`` completes."""
        self._buffer += chunk
        out: list[bytes] = []
        while (end := self._buffer.find(b"\n")) != -1:
            line = self._buffer[:end].removesuffix(b"\r")
            self._buffer = self._buffer[end + 1 :]
            if not line:
                if self._data:
                    out.append(b"\n".join(self._data))
                    self._data = []
                continue
            name, _, value = line.partition(b":")
            if name == b"data":
                self._data.append(value.removeprefix(b" "))
        return out


def event_text(endpoint: str, data: bytes) -> str | None:
    """The text an event carries ("" when none; None for ``[DONE]``); a reported error raises
    :class:`StreamError`."""
    if data.strip() == b"[DONE]":
        return None
    try:
        obj = json.loads(data)
    except ValueError:
        raise StreamError(f"not JSON: {data[:200]!r}") from None
    if not isinstance(obj, dict):
        raise StreamError(f"not a JSON object: {data[:200]!r}")
    if "error" in obj:
        error = obj["error"]
        raise StreamError(str(error.get("message", error) if isinstance(error, dict) else error))
    if endpoint == GENERATE_STREAM:
        return str(obj.get("text_output", "") or "")
    choices = obj.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    if endpoint == OPENAI_CHAT:
        delta = choice.get("delta") or {}
        return str(delta.get("content") or "")
    return str(choice.get("text") or "")


@dataclass
class TimedStream:
    """One streamed request as the client saw it (seconds of ``time.perf_counter``)."""

    start_s: float
    input_tokens: int
    token_times_s: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    end_s: float = float("nan")
    status: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200 and bool(self.token_times_s)

    def record(self) -> StreamRecord:
        """The request as the metrics take it (a successful stream only)."""
        if not self.ok:
            raise ValueError(f"a failed stream has no record: {self.error or self.status}")
        return StreamRecord(
            start_s=self.start_s,
            first_token_s=self.token_times_s[0],
            end_s=self.token_times_s[-1],
            input_tokens=self.input_tokens,
            output_tokens=len(self.token_times_s),
        )


@dataclass(frozen=True)
class GenTarget:
    """Where a run's requests go and what rides with each: ``base_url`` (``http://host:port``),
    the endpoint, the model, the scheduling hints and any extra body fields."""

    base_url: str
    endpoint: str
    model: str
    hints: Mapping[str, object] = field(default_factory=dict)
    extra: Mapping[str, object] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.base_url + endpoint_path(self.endpoint, self.model)

    def body(self, request: GenRequest) -> bytes:
        return request_body(self.endpoint, self.model, request, self.hints, self.extra)


async def stream_once(
    session: aiohttp.ClientSession,
    target: GenTarget,
    request: GenRequest,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> TimedStream:
    """Send one streamed request and stamp each of its events as it arrives."""
    body = target.body(request)
    timed = TimedStream(start_s=clock(), input_tokens=request.input_tokens)
    reader = SseReader()
    try:
        async with session.post(
            target.url, data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            timed.status = resp.status
            if resp.status != 200:
                timed.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
            else:
                async for chunk in resp.content.iter_any():
                    now = clock()
                    for data in reader.feed(chunk):
                        text = event_text(target.endpoint, data)
                        if text:
                            timed.token_times_s.append(now)
                            timed.text.append(text)
    except StreamError as err:
        timed.error = f"stream error: {err}"
    except (aiohttp.ClientError, TimeoutError) as err:
        timed.error = f"{type(err).__name__}: {err}"
    timed.end_s = clock()
    if timed.error is None and not timed.token_times_s:
        timed.error = "the stream ended without a token"
    return timed
