"""Run the sidecar inside this process (uvicorn in a thread): for the demo, benchmarks and tests."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import replace
from types import TracebackType
from typing import Self

import uvicorn

from api.app import create_app, create_asgi
from api.config import GatewayConfig
from api.connection import bounded_protocol
from api.runtime import Runtime
from api.shutdown import GracefulServer

SHUTDOWN_BACKSTOP_S = 3.0  # uvicorn's own bound on open connections, once the drain is over


def build_server(config: GatewayConfig, *, log_level: str | None = None) -> GracefulServer:
    """The sidecar's uvicorn server with every connection limit of ``config`` applied."""
    app = create_app(config)
    uv_config = uvicorn.Config(
        create_asgi(app),
        host=config.host,
        port=config.port,
        log_level=log_level or config.log_level,
        access_log=False,
        http=bounded_protocol(config.max_header_bytes, config.read_timeout_s, app.state.runtime),
        limit_concurrency=config.max_connections,
        timeout_keep_alive=max(1, round(config.idle_timeout_s)),
        timeout_graceful_shutdown=round(SHUTDOWN_BACKSTOP_S),
    )
    server = GracefulServer(uv_config, app.state.runtime, grace_s=config.shutdown_grace_s)
    server.app = app  # type: ignore[attr-defined]
    return server


class SidecarServer:
    """``with SidecarServer(config) as sc:`` serves on ``sc.url`` until the block ends; the
    embedded Triton (if any) starts with it and is stopped with it."""

    def __init__(self, config: GatewayConfig, *, start_timeout_s: float = 180.0) -> None:
        self._sock: socket.socket | None = None
        if config.port == 0:  # bound now, so no other process can take the port meanwhile
            self._sock = socket.socket()
            self._sock.bind((config.host, 0))
            config = replace(config, port=self._sock.getsockname()[1])
        self.config = config
        self.server = build_server(self.config, log_level="warning")
        self.app = self.server.app  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self._run, name="sidecar", daemon=True)
        self.start_timeout_s = start_timeout_s

    def _run(self) -> None:
        self.server.run(sockets=None if self._sock is None else [self._sock])

    @property
    def url(self) -> str:
        return f"{self.config.host}:{self.config.port}"

    @property
    def grpc_url(self) -> str:
        """Where the gRPC front end listens (its port known once started)."""
        return f"{self.config.host}:{self.app.state.grpc.port}"

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the sidecar failed to start (its log says why)")
            if time.monotonic() > deadline:
                self.close()
                raise TimeoutError(f"the sidecar did not start in {self.start_timeout_s:.0f} s")
            time.sleep(0.05)
        return self

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(90.0)
        if self._sock is not None:
            self._sock.close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
