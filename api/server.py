"""Run the sidecar inside this process (uvicorn in a thread): for the demo, benchmarks and tests."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from types import TracebackType
from typing import Self

import uvicorn

from api.app import create_app, create_asgi
from api.config import GatewayConfig
from api.embedded import free_port
from api.runtime import Runtime


class SidecarServer:
    """``with SidecarServer(config) as sc:`` serves on ``sc.url`` until the block ends; the
    embedded Triton (if any) starts with it and is stopped with it."""

    def __init__(self, config: GatewayConfig, *, start_timeout_s: float = 180.0) -> None:
        self.config = replace(config, port=free_port()) if config.port == 0 else config
        self.app = create_app(self.config)
        self.server = uvicorn.Server(
            uvicorn.Config(
                create_asgi(self.app),
                host=self.config.host,
                port=self.config.port,
                log_level="warning",
                access_log=False,
            )
        )
        self.thread = threading.Thread(target=self.server.run, name="sidecar", daemon=True)
        self.start_timeout_s = start_timeout_s

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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
