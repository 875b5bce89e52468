"""The real sidecar for tests: :class:`api.server.SidecarServer` plus small HTTP helpers."""

from __future__ import annotations

from pathlib import Path

import httpx

from api.config import GatewayConfig
from api.server import SidecarServer


class LiveSidecar(SidecarServer):
    """A :class:`SidecarServer` on a free port, with ``get``/``post`` shortcuts."""

    def __init__(self, config: GatewayConfig) -> None:
        super().__init__(GatewayConfig(**{**config.__dict__, "port": 0, "grpc_port": 0}))

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
