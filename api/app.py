"""The sidecar's FastAPI application: ``create_app(config)``; resources live in the lifespan."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from api import errors
from api.config import GatewayConfig
from api.grpc_frontend.server import GrpcFrontend
from api.metrics import GatewayMetrics
from api.routes import admin, generate, health, inference, metrics, openai
from api.routes.inference import InferenceFastPath
from api.runtime import Runtime


def create_app(config: GatewayConfig, *, registry: CollectorRegistry | None = None) -> FastAPI:
    """Build the app; the device, Triton and dispatcher open when it starts and close after."""
    runtime = Runtime(config, GatewayMetrics(registry))
    grpc_frontend = GrpcFrontend(runtime)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            await grpc_frontend.start()
            settle_heap()
            yield
        finally:
            # gRPC stops taking calls while the dispatcher answers those still queued.
            stopping = asyncio.create_task(grpc_frontend.stop())
            await runtime.stop()
            await stopping

    app = FastAPI(
        title="energy-aware scheduling sidecar",
        description="KServe v2 / Triton HTTP in front of Triton: priority and nice-weighted "
        "queueing, and GPU clocks just fast enough for each request's SLO.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    app.state.grpc = grpc_frontend
    errors.install(app)
    for module in (inference, health, metrics, admin, openai):
        app.include_router(module.router)
    return app


def settle_heap() -> None:
    """Move everything start-up made (libraries, tables, the app) out of the collector's reach.

    A full collection walks every tracked object; with the start-up heap in it, each one stops
    the event loop, and every request in flight, for longer than a tight SLO leaves room for,
    and the tail controller reads those stalls as a clock too slow. Frozen, the start-up heap is
    never walked again, and a full collection only walks what serving made since.
    """
    gc.collect()
    gc.freeze()


def create_asgi(app: FastAPI) -> InferenceFastPath:
    """What uvicorn serves: the inference fast path (infer, generate, generate_stream) in front
    of ``app``."""
    fast = InferenceFastPath(app)
    fast.add_verb("generate", generate.generate)
    fast.add_verb("generate_stream", generate.generate_stream)
    fast.add_path(openai.COMPLETIONS, openai.completions)
    fast.add_path(openai.CHAT, openai.chat_completions)
    return fast
