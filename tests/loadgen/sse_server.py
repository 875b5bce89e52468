"""A scripted streaming server for client tests: every stream's first token comes ``ttft_s``
after its request arrives and the next ones ``gap_s`` apart, so what a client measures can be
checked against what the server did.

It speaks the three endpoints the way real servers do: OpenAI chat chunks (a role-only chunk
first, as vLLM sends, then one chunk per token, a finish chunk and ``[DONE]``), OpenAI
completions, and Triton's ``generate_stream``. ``/metrics`` exposes an energy counter that grows
by ``joules_per_token`` per token sent. Model ``broken`` answers 400; model ``faulty`` sends an
error event after its first token. It runs on a thread of its own (its own event loop), so a
test may drive it from ``asyncio.run`` or from another process.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Script:
    ttft_s: float = 0.1
    gap_s: float = 0.02
    joules_per_token: float = 0.5
    arrivals_s: list[float] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    token_times_s: list[list[float]] = field(default_factory=list)  # per stream, when written
    in_flight: int = 0
    max_in_flight: int = 0
    tokens_sent: int = 0


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(kind: str, text: str | None, finish: str | None = None) -> dict[str, Any]:
    if kind == "chat":
        delta: dict[str, Any] = {"role": "assistant"} if text is None else {"content": text}
        return {"object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {} if finish else delta, "finish_reason": finish}]}  # fmt: skip
    return {"object": "text_completion", "choices": [
        {"index": 0, "text": text or "", "finish_reason": finish}]}  # fmt: skip


def build_app(script: Script) -> web.Application:
    async def stream(request: web.Request, kind: str, model: str) -> web.StreamResponse:
        script.arrivals_s.append(time.perf_counter())
        body = await request.json()
        script.bodies.append(body)
        if model == "broken":
            return web.json_response({"error": "no such model"}, status=400)
        tokens = int(body.get("max_tokens", 4))
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        script.in_flight += 1
        script.max_in_flight = max(script.max_in_flight, script.in_flight)
        start = time.perf_counter()
        sent: list[float] = []
        script.token_times_s.append(sent)
        try:
            if kind == "chat":
                await reply.write(_sse(_chunk(kind, None)))  # role only: not a token
            for i in range(tokens):
                await asyncio.sleep(max(0.0, start + script.ttft_s + i * script.gap_s
                                        - time.perf_counter()))  # fmt: skip
                if kind == "generate":
                    event: dict[str, Any] = {"model_name": model, "text_output": f"t{i + 1} "}
                else:
                    event = _chunk(kind, f"t{i + 1} ")
                sent.append(time.perf_counter())
                await reply.write(_sse(event))
                script.tokens_sent += 1
                if model == "faulty":
                    await reply.write(_sse({"error": "the engine failed"}))
                    break
            if kind != "generate":
                await reply.write(_sse(_chunk(kind, None, "length")) + b"data: [DONE]\n\n")
        finally:
            script.in_flight -= 1
        await reply.write_eof()
        return reply

    async def chat(request: web.Request) -> web.StreamResponse:
        return await stream(request, "chat", (await request.json())["model"])

    async def completions(request: web.Request) -> web.StreamResponse:
        return await stream(request, "completions", (await request.json())["model"])

    async def generate(request: web.Request) -> web.StreamResponse:
        return await stream(request, "generate", request.match_info["model"])

    async def metrics(request: web.Request) -> web.Response:
        joules = script.tokens_sent * script.joules_per_token
        text = (
            "# HELP sidecar_gpu_energy_joules_total Energy the GPU used.\n"
            "# TYPE sidecar_gpu_energy_joules_total counter\n"
            f'sidecar_gpu_energy_joules_total{{gpu="0",name="scripted"}} {joules}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v2/models/{model}/generate_stream", generate)
    app.router.add_get("/metrics", metrics)
    return app


@contextmanager
def serving(script: Script) -> Iterator[str]:
    """Serve ``script`` on a free port for the block; yields ``host:port``."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(build_app(script))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"] = runner
        holder["port"] = runner.addresses[0][1]
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    started.wait(10)
    try:
        yield f"127.0.0.1:{holder['port']}"
    finally:
        asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
