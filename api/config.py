"""The sidecar's options: each a flag of ``python -m api serve`` and an environment variable."""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from scheduler.registry import DEFAULT_POLICY, POLICIES

ENV_PREFIX = "SIDECAR_"


def default_state_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "energy-sidecar"


@dataclass(frozen=True)
class GatewayConfig:
    """What ``python -m api serve`` runs; every field has a flag and a ``SIDECAR_*`` variable."""

    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int = 8001
    triton_url: str | None = None
    triton_grpc_url: str | None = None
    device: str | None = None
    policy: str = DEFAULT_POLICY
    table: tuple[Path, ...] = ()
    slo_ms: float = 100.0
    max_inflight: int = 256
    max_queue: int = 1000
    priority_levels: int = 2
    admin_token: str | None = None
    admin_token_file: Path | None = None
    tenants: Path | None = None
    max_body_bytes: int = 64 * 1024 * 1024
    max_request_elements: int = 16 * 1024 * 1024
    max_header_bytes: int = 64 * 1024
    max_connections: int = 1024
    read_timeout_s: float = 10.0
    idle_timeout_s: float = 5.0
    probe_interval_s: float = 0.5
    liveness_grace_s: float = 60.0
    shutdown_grace_s: float = 20.0
    state_dir: Path = field(default_factory=default_state_dir)
    profile_models: tuple[str, ...] = ("simnet", "simbert")
    profile_clocks: int = 8
    profile_requests: int = 10
    log_level: str = "info"
    shadow: bool = False
    learn: bool = True

    def __post_init__(self) -> None:
        if self.policy not in POLICIES and not self.policy.startswith("fixed:"):
            raise ValueError(
                f"--policy must be one of {', '.join(POLICIES)} or fixed:MHZ, got {self.policy!r}"
            )
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in 0..65535 (0: any free port), got {self.port}")
        if not 0 <= self.grpc_port < 65536:
            raise ValueError(
                f"--grpc-port must be in 0..65535 (0: any free port), got {self.grpc_port}"
            )
        if self.slo_ms <= 0:
            raise ValueError(f"--slo-ms must be > 0, got {self.slo_ms}")
        if self.max_inflight < 1 or self.max_queue < 1:
            raise ValueError("--max-inflight and --max-queue must be >= 1")
        for name in (
            "max_body_bytes",
            "max_request_elements",
            "max_header_bytes",
            "max_connections",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        for name in (
            "read_timeout_s",
            "idle_timeout_s",
            "probe_interval_s",
            "liveness_grace_s",
            "shutdown_grace_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0")

    @property
    def embedded(self) -> bool:
        return self.triton_url is None


_HELP = {
    "host": "address to listen on",
    "port": "port to listen on (Triton's own HTTP port, so the sidecar can take its place)",
    "grpc_port": "port for the KServe v2 gRPC front end (Triton's own gRPC port; 0: any free)",
    "triton_url": "an existing Triton (host:port); omitted: start the embedded default",
    "triton_grpc_url": "that Triton's gRPC (host:port); omitted: --triton-url's host, port + 1",
    "device": "sim:<profile> or nvml:<index> (default: NVML GPU 0 if present, else sim:v100)",
    "policy": "clock policy: " + ", ".join(POLICIES) + ", or fixed:MHZ",
    "table": "time2clock table file(s), comma-separated (each holds one or more models); "
    "omitted in the embedded default: profile and cache one per model",
    "slo_ms": "default latency SLO per request, ms",
    "max_inflight": "a cap on requests at Triton per GPU (each model gets what its batcher "
    "can use: (instances + 1) × max_batch_size, or less when the policy says so)",
    "max_queue": "requests waiting per GPU before new ones are refused (429)",
    "priority_levels": "priority levels (1 highest; 0 in a request means the lowest)",
    "admin_token": "bearer token for /admin (none: admin API disabled); prefer the variable "
    "or --admin-token-file: a flag shows in the process list",
    "admin_token_file": "a file holding the bearer token for /admin (first line)",
    "tenants": "a tenants file (TOML): bearer tokens → client id, highest priority, lowest nice, "
    "default SLO; none: every client is trusted with its hints",
    "max_body_bytes": "largest request body, checked while it streams in (413 beyond)",
    "max_request_elements": "most tensor elements one request may declare (400 beyond); "
    "models' configs bound each input further",
    "max_header_bytes": "largest request line + headers (431 beyond, connection closed)",
    "max_connections": "open connections (and requests) at once; beyond them, 503",
    "read_timeout_s": "seconds a client may take to send its headers, and between body chunks",
    "idle_timeout_s": "seconds an idle keep-alive connection stays open",
    "probe_interval_s": "seconds between probes of Triton's readiness",
    "liveness_grace_s": "seconds Triton may stay down before /v2/health/live says 503",
    "shutdown_grace_s": "seconds queued work gets after SIGTERM; then 503 and exit",
    "state_dir": "where tables are cached (profiled, and learned from live traffic)",
    "profile_models": "embedded models to profile at start-up, comma-separated (others: top clock)",
    "profile_clocks": "clocks to sweep when profiling at start-up",
    "profile_requests": "requests per clock and batch size when profiling at start-up",
    "log_level": "uvicorn log level",
    "shadow": "decide and export the clock it would set, never write one (no root needed)",
    "learn": "refit each model's table from live traffic, save it in the state dir and prefer "
    "it at the next start (off in shadow mode)",
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


def _list(value: object) -> tuple[str, ...]:
    """A comma-separated flag (or a default tuple) as a tuple of non-empty strings."""
    if isinstance(value, tuple):
        return tuple(str(v) for v in value)
    return tuple(x.strip() for x in str(value or "").split(",") if x.strip())


def from_args(args: argparse.Namespace) -> GatewayConfig:
    values = {f.name: getattr(args, f.name) for f in fields(GatewayConfig)}
    values["shadow"] = _flag("shadow", values["shadow"])
    values["learn"] = _flag("learn", values["learn"])
    values["state_dir"] = Path(values["state_dir"])
    values["table"] = tuple(Path(p) for p in _list(values["table"]))
    values["profile_models"] = _list(values["profile_models"])
    for name in ("admin_token_file", "tenants"):
        values[name] = Path(values[name]) if values[name] not in ("", None) else None
    for name in ("triton_url", "triton_grpc_url", "device", "admin_token"):
        if values[name] in ("", None):
            values[name] = None
    if values["admin_token_file"] is not None and values["admin_token"] is None:
        values["admin_token"] = read_token(values["admin_token_file"])
    return GatewayConfig(**values)


def read_token(path: Path) -> str:
    """The first line of ``path``, stripped; ValueError names the file when it is unusable."""
    try:
        token = path.read_text().splitlines()[0].strip() if path.stat().st_size else ""
    except (OSError, UnicodeDecodeError, IndexError) as err:
        raise ValueError(f"--admin-token-file {path}: {err}") from None
    if not token:
        raise ValueError(f"--admin-token-file {path} is empty")
    return token
