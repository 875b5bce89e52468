"""Run the real sidecar (and its embedded Triton) in this process for tests, and stop it after."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import TracebackType

import httpx
import uvicorn

from api.app import create_app
from api.config import GatewayConfig
from api.embedded import free_port
from api.runtime import Runtime


class LiveSidecar:
    """``with LiveSidecar(config) as sc:`` serves on ``sc.url`` until the block ends."""

    def __init__(self, config: GatewayConfig, start_timeout_s: float = 180.0) -> None:
        self.config = GatewayConfig(**{**config.__dict__, "port": free_port()})
        self.app = create_app(self.config)
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                host="127.0.0.1",
                port=self.config.port,
                log_level="warning",
                access_log=False,
            )
        )
        self.thread = threading.Thread(target=self.server.run, name="sidecar", daemon=True)
        self.start_timeout_s = start_timeout_s

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.config.port}"

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime

    def __enter__(self) -> LiveSidecar:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the sidecar failed to start (see the log above)")
            if time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise TimeoutError("the sidecar did not start in time")
            time.sleep(0.1)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.should_exit = True
        self.thread.join(90.0)

    def get(self, path: str, **kw: object) -> httpx.Response:
        return httpx.get(f"http://{self.url}{path}", timeout=30.0, **kw)  # type: ignore[arg-type]

    def post(self, path: str, **kw: object) -> httpx.Response:
        return httpx.post(f"http://{self.url}{path}", timeout=60.0, **kw)  # type: ignore[arg-type]


def embedded_config(tmp: Path, **overrides: object) -> GatewayConfig:
    """The embedded default, profiled quickly (6 clocks × 10 requests), tables cached in ``tmp``."""
    base: dict[str, object] = dict(
        state_dir=tmp,
        profile_clocks=6,
        profile_requests=10,
        slo_ms=60.0,
        admin_token="test-token",
        max_queue=8,
    )
    base.update(overrides)
    return GatewayConfig(**base)  # type: ignore[arg-type]
