"""An independent streaming client: the ``openai`` Python SDK, timing chunks itself.

The reference that ``python -m benchmarks.genai_agreement`` checks loadgen's generative mode
against. It shares nothing with ``loadgen``: its HTTP stack is the SDK's (httpx), its SSE
parsing and chunk objects are the SDK's, and its statistics are its own (the standard library's).
It reads the requests to send from a JSON file (``[{"prompt": ..., "max_tokens": ...,
"at_s": ...}, ...]``). With ``at_s`` (seconds from the start) each request leaves at its time
(open loop); without, ``--concurrency`` chat completions stream at a time, the requests used in
order and cycled, until ``--duration-s`` has passed (those in flight then finish). It writes
what it measured as JSON.

It starts when told: it prints ``ready`` once the SDK is loaded and warm (``--warmup``
requests sent and discarded: the SDK's first call loads and builds much of it) and waits for a
line on stdin, so a run beside another client can start both at the same moment.

A token is a chunk whose ``delta.content`` is not empty; TTFT is its first one's time from the
request's start; a request's inter-token latency is ``(last − first) / (tokens − 1)``;
throughputs are per second from the first request's start to the last token.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import openai


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) with linear interpolation between closest ranks."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = q * (len(data) - 1)
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def summary(requests: list[dict[str, Any]]) -> dict[str, float]:
    """The run's figures from per-request times (s) and token counts."""
    done = [r for r in requests if r["error"] is None and r["tokens"] > 0]
    if not done:
        return {"request_count": 0.0}
    ttft_ms = [(r["first_s"] - r["start_s"]) * 1000.0 for r in done]
    itl_ms = [
        (r["last_s"] - r["first_s"]) * 1000.0 / (r["tokens"] - 1) for r in done if r["tokens"] > 1
    ]
    span_s = max(r["last_s"] for r in done) - min(r["start_s"] for r in done)
    tokens = sum(r["tokens"] for r in done)
    return {
        "request_count": float(len(done)),
        "error_count": float(len(requests) - len(done)),
        "ttft_mean_ms": statistics.fmean(ttft_ms),
        "ttft_p50_ms": quantile(ttft_ms, 0.50),
        "ttft_p90_ms": quantile(ttft_ms, 0.90),
        "ttft_p99_ms": quantile(ttft_ms, 0.99),
        "itl_mean_ms": statistics.fmean(itl_ms) if itl_ms else float("nan"),
        "duration_s": span_s,
        "output_token_throughput": tokens / span_s,
        "request_throughput": len(done) / span_s,
        "output_tokens": float(tokens),
    }


async def one(
    client: openai.AsyncOpenAI, model: str, request: dict[str, Any], client_id: str
) -> dict[str, Any]:
    start = time.perf_counter()
    times: list[float] = []
    error = None
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": request["prompt"]}],
            max_tokens=request["max_tokens"],
            stream=True,
            extra_body={"client_id": client_id},
        )
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].delta.content:
                times.append(now)
    except openai.OpenAIError as err:
        error = f"{type(err).__name__}: {err}"
    return {
        "start_s": start,
        "first_s": times[0] if times else None,
        "last_s": times[-1] if times else None,
        "tokens": len(times),
        "error": error,
    }


async def run(
    base_url: str,
    model: str,
    workload: list[dict[str, Any]],
    *,
    concurrency: int = 1,
    duration_s: float = math.inf,
    client_id: str = "openai-sdk",
    warmup: int = 0,
    wait_for_go: bool = False,
) -> list[dict[str, Any]]:
    """Send the workload: each request at its ``at_s`` (s from the start) when the requests
    have one (open loop), else ``concurrency`` at a time, cycled, for ``duration_s``."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600.0)
    if warmup:
        await asyncio.gather(*(one(client, model, workload[i % len(workload)], client_id)
                               for i in range(warmup)))  # fmt: skip
    if wait_for_go:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    out: list[dict[str, Any]] = []
    start = time.perf_counter()
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while time.perf_counter() < start + duration_s:
            request = workload[sent % len(workload)]
            sent += 1
            out.append(await one(client, model, request, client_id))

    async def at(request: dict[str, Any]) -> None:
        await asyncio.sleep(max(0.0, start + float(request["at_s"]) - time.perf_counter()))
        out.append(await one(client, model, request, client_id))

    try:
        if all("at_s" in r for r in workload):
            await asyncio.gather(*(at(r) for r in workload))
        else:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sdk_client", description=__doc__)
    p.add_argument("--base-url", required=True, help="http://host:port/v1")
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--workload", type=Path, required=True)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--duration-s", type=float, default=math.inf, help="closed loop: how long")
    p.add_argument("-o", "--out", type=Path, required=True)
    p.add_argument("--client-id", default="openai-sdk", help="sent as the sidecar's hint")
    p.add_argument("--warmup", type=int, default=4, help="requests sent first, not measured (4)")
    p.add_argument("--now", action="store_true", help="start at once (do not wait for stdin)")
    args = p.parse_args(argv)
    workload = json.loads(args.workload.read_text())
    requests = asyncio.run(
        run(
            args.base_url,
            args.model,
            workload,
            concurrency=args.concurrency,
            duration_s=args.duration_s,
            client_id=args.client_id,
            warmup=args.warmup,
            wait_for_go=not args.now,
        )
    )
    args.out.write_text(
        json.dumps({"summary": summary(requests), "requests": requests}, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
