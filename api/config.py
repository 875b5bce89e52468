"""The sidecar's options: each a flag of ``python -m api serve`` and an environment variable."""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from scheduler.policies import POLICIES

ENV_PREFIX = "SIDECAR_"


def default_state_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "energy-sidecar"


@dataclass(frozen=True)
class GatewayConfig:
    """What ``python -m api serve`` runs; every field has a flag and a ``SIDECAR_*`` variable."""

    host: str = "127.0.0.1"
    port: int = 8000
    triton_url: str | None = None
    device: str | None = None
    policy: str = "slack"
    table: Path | None = None
    slo_ms: float = 100.0
    max_inflight: int = 2
    max_queue: int = 1000
    priority_levels: int = 2
    admin_token: str | None = None
    state_dir: Path = field(default_factory=default_state_dir)
    profile_clocks: int = 12
    profile_requests: int = 20
    log_level: str = "info"
    shadow: bool = False

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"--policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in 0..65535 (0: any free port), got {self.port}")
        if self.slo_ms <= 0:
            raise ValueError(f"--slo-ms must be > 0, got {self.slo_ms}")
        if self.max_inflight < 1 or self.max_queue < 1:
            raise ValueError("--max-inflight and --max-queue must be >= 1")

    @property
    def embedded(self) -> bool:
        return self.triton_url is None


_HELP = {
    "host": "address to listen on",
    "port": "port to listen on (Triton's own HTTP port, so the sidecar can take its place)",
    "triton_url": "an existing Triton (host:port); omitted: start the embedded default",
    "device": "sim:<profile> or nvml:<index> (default: NVML GPU 0 if present, else sim:v100)",
    "policy": "clock policy: " + ", ".join(POLICIES),
    "table": "a time2clock table (JSON); omitted in the embedded default: profile and cache one",
    "slo_ms": "default latency SLO per request, ms",
    "max_inflight": "requests in flight to Triton per GPU",
    "max_queue": "requests waiting per GPU before new ones are refused (429)",
    "priority_levels": "priority levels (1 highest; 0 in a request means the lowest)",
    "admin_token": "bearer token for /admin (none: admin API disabled)",
    "state_dir": "where tables are cached",
    "profile_clocks": "clocks to sweep when profiling at start-up",
    "profile_requests": "requests per clock when profiling at start-up",
    "log_level": "uvicorn log level",
    "shadow": "decide and export the clock it would set, never write one (no root needed)",
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _flag(name: str, value: object) -> bool:
    """A boolean option: the flag's own value, or ``SIDECAR_<NAME>`` as text."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    env = ENV_PREFIX + name.upper()
    raise ValueError(f"{env} must be one of {', '.join(_TRUE + _FALSE[:-1])}, got {value!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field, its default taken from ``SIDECAR_<FIELD>`` when set."""
    for f in fields(GatewayConfig):
        env = ENV_PREFIX + f.name.upper()
        builtin = f.default_factory() if f.default is MISSING else f.default  # type: ignore[operator]
        default = os.environ.get(env, builtin)
        if str(f.type) == "bool":
            parser.add_argument(
                "--" + f.name.replace("_", "-"),
                default=default,
                action=argparse.BooleanOptionalAction,
                help=f"{_HELP[f.name]} (env {env}=1; default {builtin})",
            )
            continue
        kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            default=default,
            type=kind,
            help=f"{_HELP[f.name]} (env {env}; default {builtin})",
        )


def from_args(args: argparse.Namespace) -> GatewayConfig:
    values = {f.name: getattr(args, f.name) for f in fields(GatewayConfig)}
    values["shadow"] = _flag("shadow", values["shadow"])
    for name in ("table", "state_dir"):
        if values[name] is not None:
            values[name] = Path(values[name])
    for name in ("triton_url", "device", "admin_token", "table"):
        if values[name] in ("", None):
            values[name] = None
    return GatewayConfig(**values)
