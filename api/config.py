"""The sidecar's options: one tree, set by flags, ``SIDECAR_*`` variables and a TOML file.

:class:`GatewayConfig` nests the scheduler's bounds (:class:`scheduler.core.SchedulerConfig`) and
the clock policy with all its parameters (:class:`scheduler.config.PolicyConfig`), the same
classes the simulator nests, so each default is written once. Every leaf of the tree has a flag of
``python -m api serve`` (``--max-inflight``, ``--slack-hold-s``, ``--feedback-target``…), a
variable (``SIDECAR_MAX_INFLIGHT``…) and a key in the file given by ``--config``
(``SIDECAR_CONFIG``), whose tables mirror the tree: top-level keys for the gateway,
``[scheduler]``, ``[placement]``, ``[policy]``, ``[policy.slack]``, ``[policy.feedback]``,
``[policy.tokens]`` (and its loops, ``[policy.tokens.ttft_feedback]``,
``[policy.tokens.tpot_feedback]``).
Precedence, highest first: flag, variable, file, built-in default.
"""

from __future__ import annotations

import argparse
import json
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from dvfs.factory import parse_device_list
from scheduler.config import TOKEN_LOOPS, PolicyConfig, token_default, token_params
from scheduler.core import SchedulerConfig
from scheduler.feedback import FeedbackParams, ScaleParams
from scheduler.placement import PLACEMENTS, PlacementParams
from scheduler.policies import SlackParams
from scheduler.registry import POLICIES
from scheduler.tokens import TokenPolicyParams

ENV_PREFIX = "SIDECAR_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"


def default_state_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "energy-sidecar"


@dataclass(frozen=True)
class GatewayConfig:
    """What ``python -m api serve`` runs; every leaf has a flag, a variable and a file key."""

    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int = 8001
    triton_url: str | None = None
    triton_grpc_url: str | None = None
    upstream: str | None = None
    device: str | None = None
    table: tuple[Path, ...] = ()
    engine_profile: Path | None = None
    profile_engine: str | None = None
    profile_engine_extra: str | None = None
    admin_token: str | None = None
    admin_token_file: Path | None = None
    tenants: Path | None = None
    # the part of every SLO spent outside the sidecar (the network, the client's own send and
    # receive): each request is held to its SLO less this, so the client's p99 meets the SLO
    slo_outside_ms: float = 0.0
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
    learn_energy_probe: bool = True
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    placement: PlacementParams = field(default_factory=PlacementParams)

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in 0..65535 (0: any free port), got {self.port}")
        if not 0 <= self.grpc_port < 65536:
            raise ValueError(
                f"--grpc-port must be in 0..65535 (0: any free port), got {self.grpc_port}"
            )
        if self.upstream is not None and not self.upstream.startswith("openai=http"):
            raise ValueError(f"--upstream must be openai=http://host:port, got {self.upstream!r}")
        if self.profile_engine is not None:
            if self.engine_profile is not None:
                raise ValueError(
                    "give --engine-profile (a profile made before) or --profile-engine (measured "
                    "at the first start), not both"
                )
            if self.shadow:
                raise ValueError(
                    "--profile-engine locks the GPU's clocks to measure the engine: not in "
                    "shadow mode (measure one with python -m time2clock profile-engine instead)"
                )
        self.profile_engine_body  # noqa: B018 (a bad --profile-engine-extra stops the start)
        if not self.scheduler.default_slo_ms > 0:
            raise ValueError(f"--slo-ms must be > 0, got {self.scheduler.default_slo_ms}")
        if not 0.0 <= self.slo_outside_ms < self.scheduler.default_slo_ms:
            raise ValueError(
                f"--slo-outside-ms must be >= 0 and under --slo-ms "
                f"({self.scheduler.default_slo_ms:g}), got {self.slo_outside_ms}"
            )
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
        gpus = len(parse_device_list(self.device)) if self.device is not None else None
        for flag, urls in (("--triton-url", self.triton_urls),
                           ("--triton-grpc-url", self.triton_grpc_urls)):  # fmt: skip
            if urls is None or len(urls) == (gpus or 1):
                continue
            if gpus is None:
                raise ValueError(
                    f"{flag} names {len(urls)} Tritons: give --device with as many GPUs "
                    "(one Triton per GPU, in the same order)"
                )
            raise ValueError(
                f"{flag} names {len(urls)} Triton(s) for the {gpus} GPU(s) of --device "
                f"{self.device}: give one per GPU, in the same order"
            )

    @property
    def embedded(self) -> bool:
        return self.triton_url is None

    @property
    def triton_urls(self) -> list[str] | None:
        """One Triton per GPU, in the order of ``device`` (None: the embedded default)."""
        return _split(self.triton_url)

    @property
    def triton_grpc_urls(self) -> list[str] | None:
        """Their gRPC endpoints (None: each Triton's HTTP port + 1)."""
        return _split(self.triton_grpc_url)

    @property
    def openai_url(self) -> str | None:
        """The OpenAI-compatible engine's base URL, if one is configured."""
        return None if self.upstream is None else self.upstream.removeprefix("openai=")

    @property
    def profile_engine_body(self) -> dict[str, object]:
        """``--profile-engine-extra``: fields added to every request body of the engine's
        sweep (vLLM's ``{"ignore_eos": true}``)."""
        if self.profile_engine_extra is None:
            return {}
        try:
            extra = json.loads(self.profile_engine_extra)
        except json.JSONDecodeError as err:
            raise ValueError(f"--profile-engine-extra must be a JSON object: {err}") from None
        if not isinstance(extra, dict):
            raise ValueError(
                f"--profile-engine-extra must be a JSON object, got {self.profile_engine_extra!r}"
            )
        return extra

    @property
    def slo_ms(self) -> float:
        """The default latency SLO of a request that gives none."""
        return self.scheduler.default_slo_ms

    def with_policy(self, name: str) -> GatewayConfig:
        """The same configuration running policy ``name`` (its parameters kept)."""
        return replace(self, policy=replace(self.policy, name=name))


def _split(urls: str | None) -> list[str] | None:
    if urls is None:
        return None
    items = [u.strip() for u in urls.split(",")]
    if not all(items):
        raise ValueError(f"an empty item in the list of Tritons {urls!r}")
    return items


@dataclass(frozen=True)
class Option:
    """One leaf of the tree: where it sits, its flag and what it means."""

    # ("port",), ("scheduler", "max_inflight"), ("policy", "slack", "hold_s"),
    # ("policy", "tokens", "tpot_feedback", "setpoint")
    path: tuple[str, ...]
    flag: str  # without the leading dashes
    help: str
    type_name: str
    builtin: Any

    @property
    def dest(self) -> str:
        return self.flag.replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()

    @property
    def file_key(self) -> str:
        """Where it sits in the TOML file: ``[scheduler] max_inflight``, or a top-level key."""
        return ".".join(self.path)

    @property
    def is_bool(self) -> bool:
        return self.type_name == "bool"


_GATEWAY_HELP = {
    "host": "address to listen on",
    "port": "port to listen on (Triton's own HTTP port, so the sidecar can take its place)",
    "grpc_port": "port for the KServe v2 gRPC front end (Triton's own gRPC port; 0: any free)",
    "triton_url": "an existing Triton (host:port), or one per GPU of --device, comma-separated "
    "in the same order; omitted: start the embedded default (one Triton per simulated GPU)",
    "triton_grpc_url": "those Tritons' gRPC (host:port, comma-separated); omitted: each "
    "--triton-url's host, port + 1",
    "upstream": "an OpenAI-compatible engine for /v1/* (openai=http://host:port: vLLM, "
    "TensorRT-LLM, Triton's OpenAI front end); omitted: /v1/* speaks to Triton's generate",
    "device": "the GPU(s) to drive: sim:<profile> or nvml:<index>, or several, comma-separated "
    "(nvml:0,1,2,3; sim:v100x2; sim:v100,sim:a100) (default: NVML GPU 0 if present, else "
    "sim:v100)",
    "engine_profile": "an LLM engine's profile (python -m time2clock profile-engine), which "
    "--policy tokens plans with in front of an engine other than the embedded one",
    "profile_engine": "the LLM model (as clients name it) whose engine the sidecar profiles at "
    "its first start on each kind of GPU, before serving, for --policy tokens (cached in the "
    "state dir; the OpenAI upstream's engine if --upstream is given, else Triton's)",
    "profile_engine_extra": "a JSON object added to every request of that profile "
    '(vLLM: {"ignore_eos": true}, so that each stream runs to its length)',
    "table": "time2clock table file(s), comma-separated (each holds one or more models); "
    "omitted in the embedded default: profile and cache one per model",
    "admin_token": "bearer token for /admin (none: admin API disabled); prefer the variable "
    "or --admin-token-file: a flag shows in the process list",
    "admin_token_file": "a file holding the bearer token for /admin (first line)",
    "tenants": "a tenants file (TOML): bearer tokens → client id, highest priority, lowest nice, "
    "default SLO; none: every client is trusted with its hints",
    "slo_outside_ms": "ms of every SLO spent outside the sidecar (the network, the client's own "
    "send and receive): each request is held to its SLO (and TTFT) less this, so that the tail "
    "the client measures meets it",
    "max_body_bytes": "largest request body or gRPC message, checked while it streams in "
    "(HTTP 413, gRPC RESOURCE_EXHAUSTED beyond)",
    "max_request_elements": "most tensor elements one request may declare (400 / "
    "INVALID_ARGUMENT beyond); models' configs bound each input further",
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
    "learn_energy_probe": "while learning, lower the energy floor now and then (2 s in 10) to "
    "a clock the energy fit has not measured, so a wrong energy curve heals",
}
# The scheduler's fields keep the flags users know.
_SCHEDULER_FLAGS = {
    "default_slo_ms": ("slo-ms", "default latency SLO per request, ms"),
    "max_inflight": (
        "max-inflight",
        "a cap on requests at Triton per GPU (each model gets what its batcher can use, "
        "or less when the policy says so)",
    ),
    "max_queue": ("max-queue", "requests waiting per GPU before new ones are refused (429)"),
    "priority_levels": (
        "priority-levels",
        "priority levels (1 highest; 0 in a request means the default level)",
    ),
    "default_priority_level": (
        "default-priority-level",
        "the level of a request with priority 0 (default: the lowest)",
    ),
    # priority: the release depth (scheduler/core.py)
    "triton_batches": (
        "triton-batches",
        "full batches of each model kept at Triton (while several nice values or priority "
        "levels arrive); the rest waits in the sidecar's queue, "
        "where priority, nice weights and cancellation apply (more: throughput over isolation)",
    ),
    "triton_batches_alone": (
        "triton-batches-alone",
        "full batches of each model kept at Triton while one nice value alone arrived lately, "
        "and one priority level alone or this model's alone at levels its Triton batcher "
        "orders: no level waits behind them, no shares to keep (never fewer than "
        "--triton-batches)",
    ),
}
_PLACEMENT_FLAGS = {
    "mode": (
        "placement",
        "with several GPUs, which one takes each request: " + ", ".join(PLACEMENTS) + " (spread: "
        "where it finishes soonest, counting work ahead by level and weight; energy: pack onto "
        "busy GPUs while the deadline allows; round-robin)",
    ),
    "pack_slo_share": (
        "pack-slo-share",
        "energy placement: pack a request onto a busy GPU only if it is expected to finish "
        "within this share of the time left to its deadline",
    ),
}
_SLACK_HELP = {
    "batch_hold": "slack: how long a model may hold for a fuller batch, as a share of its room",
    "quantile": "slack: the table quantile the plan budgets (mean, p50, p90, p95, p99)",
    "lookahead": "slack: queued requests the plan looks at",
    "phantoms": "slack: future arrivals (at the measured rate) the plan reserves room for",
    "hold_s": "slack: seconds before stepping the clock down (hysteresis)",
    "safety": "slack: share of each deadline the plan may use",
    "change_delay_ms": "slack: what a clock change costs, ms (counted against every deadline; "
    "the least planned with when the delay is learned)",
    "arrival_quantile": "slack: quantile of the inter-arrival time the phantoms assume",
    "phantom_margin": "slack: multiplier on the phantoms' arrival rate",
    "hold_while_busy": "slack: hold requests for a fuller batch while the model runs too",
    "learn_change_delay": "slack: time the GPU's clock changes and plan with their p90 where "
    "it is longer than change_delay_ms",
}
_FEEDBACK_HELP = {
    "target": "adaptive: the quantile of latency/SLO each SLO class holds at the setpoint",
    "setpoint": "adaptive: the share of the SLO that quantile is held at",
    "gain": "adaptive: the base speed's step (log) per near miss, times target",
    "settled_gain": "adaptive: the smallest step (the step shrinks as 1/sqrt(completions))",
    "settle_completions": "adaptive: the class's completion at which the step is gain",
    "far_below": "adaptive: a tail under this share of the setpoint walks down faster",
    "fast_descent": "adaptive: times faster the base walks down far below it (1: no faster)",
    "young_descent": "adaptive: times faster a young class's base walks down far below it",
    "young_completions": "adaptive: completions while a class is young",
    "start_queue": "adaptive: a class starts at the top clock where no clock runs this many "
    "requests back to back within its setpoint",
    "min_samples": "adaptive: completions of a class before its base moves",
    "window_s": "adaptive: seconds of completions the reported tail is measured over",
    "max_samples": "adaptive: most completions kept per window",
    "idle_depth": (
        "adaptive: the share of the room under the tightest SLO a wake-up from the idle clock "
        "may cost"
    ),
    "idle_power_w": "adaptive: the GPU's idle power at its lowest clock (none: read at start)",
    "idle_power_top_w": "adaptive: the GPU's idle power at its top clock (none: unknown)",
    "floor_tolerance": "adaptive: the energy floor is the lowest clock within this share of the "
    "least energy",
    "phantoms": "adaptive: arrivals to come the plan counts",
    "raise_quantile": "adaptive: the execution times raises plan for (mean, or a quantile)",
    "batch_hold": "adaptive: the longest a model's requests are held for a fuller batch, as a "
    "share of their SLO",
    "hold_while_busy": "adaptive: hold requests for a fuller batch while the model runs too",
    "rest_while_holding": "adaptive: idle clock while every model waiting is held back",
    "overshoot": "adaptive: how far (log speed) the level may run past the top clock while "
    "even the top leaves near misses",
    "quiet_s": "adaptive: seconds without a completion after which a class no longer keeps "
    "the idle clock up",
    "count_drop": "adaptive: the energy floor counts the clock change a busy period ends with "
    "at the floor (needs idle_power_top_w)",
    "rare_wakes": "adaptive: a quiet class's wake-ups leave the idle clock the whole SLO only "
    "while they are fewer than the misses the target allows",
}

_TOKENS_HELP = {
    "period_s": "tokens: seconds between control periods (the base clock, the admission limit)",
    "hold_s": "tokens: seconds the base clock holds the highest need before it comes down",
    "rise_s": "tokens: above the static clock, seconds a need raises the base (none once the "
    "static clock is trusted)",
    "static_window_s": "tokens: seconds of ended streams the static clock is judged on",
    "static_min_samples": "tokens: ended streams the static clock is judged on at least "
    "(before: no static clock)",
    "confident_samples": "tokens: ended streams on which the static clock is trusted",
    "window_s": "tokens: seconds the prompt rate is measured over",
    "short_window_s": "tokens: the prompt rate's short window, seconds (a rising load is seen "
    "within it)",
    "tail_quantile": "tokens: the quantile of requests the token SLOs hold at",
    "tail_samples": "tokens: ended streams whose TPOT over the model's mean gap is kept (the "
    "tail factor)",
    "tail_neighbours": "tokens: the tail factor at a clock is over this many streams whose mean "
    "clocks were nearest it",
    "min_samples": "tokens: ended streams before the tail factor is measured (before: "
    "--tokens-prior-tail)",
    "prior_tail": "tokens: the p99 TPOT over the model's mean gap, assumed until measured",
    "tpot_share": "tokens: the TPOT budget, as a share of the TPOT SLO (times the TPOT loop's "
    "scale)",
    "ttft_share": "tokens: the waiting prompts' TTFT target, as a share of the TTFT SLO (times "
    "the TTFT loop's scale)",
    "boost_hold_s": "tokens: seconds a boost for waiting prompts lasts at least",
    "max_share": "tokens: the most of the engine's time prompts may take",
    "headroom": "tokens: the admission limit keeps the mean gap within the TPOT SLO times this",
    "batched_tokens": "tokens: the engine's tokens per iteration, as the engine is set (vLLM's "
    "max_num_batched_tokens)",
    "change_latency_s": "tokens: seconds a clock change takes to land on the GPU",
    "prefill_samples": "tokens: lone prompts' measured over predicted times kept (the prefill "
    "factor)",
    "min_prefill_samples": "tokens: lone prompts measured before the prefill factor applies",
    "settle_s": "tokens: seconds after a clock request whose token gaps are not learned from",
    "gap_cap": "tokens: token gaps kept per (running sequences, clock)",
    "min_gap_samples": "tokens: token gaps before a (running sequences, clock) cell is learned "
    "from",
    "max_seqs": "tokens: the engine's most sequences at once, as the engine is set (vLLM's "
    "max_num_seqs)",
}
_SCALE_HELP = {
    "target": "the share of streams within the SLO it holds",
    "setpoint": "below this share of the SLO at the target's quantile, the scale creeps up",
    "window_s": "seconds of streams it measures over",
    "max_samples": "most streams kept in its window",
    "min_samples": "streams since its last cut before it steps",
    "period_s": "seconds between its steps",
    "gain": "exponent of its step toward the setpoint",
    "max_step": "largest step up, as a share of the scale",
    "backoff": "the factor the scale is cut by when misses pass the target's budget",
    "backoff_gap_s": "seconds between two cuts at least",
    "settle_s": "seconds after a cut without a rise",
    "min_scale": "lowest scale",
    "max_scale": "highest scale",
    "start_scale": "scale at start",
    "horizon_s": "seconds over which misses past the target's budget are also counted (0: off)",
}
_LOOP_NAMES = {"ttft_feedback": "TTFT", "tpot_feedback": "TPOT"}


def _builtin(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    assert f.default_factory is not MISSING
    return f.default_factory()


def _options() -> tuple[Option, ...]:
    out: list[Option] = []
    for f in fields(GatewayConfig):
        if f.name in ("scheduler", "policy", "placement"):
            continue
        out.append(
            Option((f.name,), f.name.replace("_", "-"), _GATEWAY_HELP[f.name], str(f.type),
                   _builtin(f))
        )  # fmt: skip
    for f in fields(SchedulerConfig):
        flag, text = _SCHEDULER_FLAGS[f.name]
        out.append(Option(("scheduler", f.name), flag, text, str(f.type), _builtin(f)))
    for f in fields(PlacementParams):
        flag, text = _PLACEMENT_FLAGS[f.name]
        out.append(Option(("placement", f.name), flag, text, str(f.type), _builtin(f)))
    out.append(
        Option(("policy", "name"), "policy", "clock policy: " + ", ".join(POLICIES) +
               ", tokens (a GPU serving an LLM engine), or fixed:MHZ", "str", PolicyConfig().name)
    )  # fmt: skip
    for name, text in (
        ("ttft_ms", "tokens: the p99 time to first token it holds, ms"),
        ("tpot_ms", "tokens: the p99 time per output token it holds, ms"),
    ):
        out.append(Option(("policy", name), name.replace("_", "-"), text, "float",
                          getattr(PolicyConfig(), name)))  # fmt: skip
    for cls, section, texts in ((SlackParams, "slack", _SLACK_HELP),
                                (FeedbackParams, "feedback", _FEEDBACK_HELP),
                                (TokenPolicyParams, "tokens", _TOKENS_HELP)):  # fmt: skip
        for f in fields(cls):
            if f.name in TOKEN_LOOPS:
                continue  # the token policy's loops: their own leaves, below
            out.append(
                Option(("policy", section, f.name), f"{section}-{f.name.replace('_', '-')}",
                       texts[f.name], str(f.type), _builtin(f))
            )  # fmt: skip
    for loop in TOKEN_LOOPS:
        for f in fields(ScaleParams):
            flag = f"tokens-{loop}-{f.name}".replace("_", "-")
            out.append(
                Option(("policy", "tokens", loop, f.name), flag,
                       f"tokens, its {_LOOP_NAMES[loop]} loop: {_SCALE_HELP[f.name]}",
                       str(f.type), token_default((loop, f.name)))
            )  # fmt: skip
    return tuple(out)


OPTIONS: tuple[Option, ...] = _options()
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _convert(option: Option, value: Any, source: str) -> Any:
    """``value`` (text from a flag or a variable, or a TOML value) as the option's type;
    ValueError names ``source`` and what is allowed."""
    kind = option.type_name.replace(" | None", "")
    nullable = option.type_name.endswith("| None")
    try:
        if option.is_bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text not in _TRUE + _FALSE:
                raise ValueError(f"one of {', '.join(_TRUE + _FALSE[:-1])}")
            return text in _TRUE
        if nullable and value in ("", None):
            return None
        if kind.startswith("tuple["):
            items = value if isinstance(value, list | tuple) else str(value).split(",")
            texts = [str(x).strip() for x in items if str(x).strip()]
            return tuple(Path(x) for x in texts) if "Path" in kind else tuple(texts)
        if isinstance(value, bool):  # TOML true where a number or text is expected
            raise ValueError(f"a {kind}")
        if kind == "int":
            if isinstance(value, float):
                raise ValueError("a whole number")
            return int(value)
        if kind == "float":
            return float(value)
        if kind == "Path":
            return Path(str(value))
        if isinstance(value, list | dict):
            raise ValueError("text")
        return str(value)
    except ValueError as err:
        raise ValueError(f"{source} must be {_expected(err, kind)}, got {value!r}") from None


def _expected(err: ValueError, kind: str) -> str:
    text = str(err)
    if text.startswith(("one of", "a ", "text")):
        return text
    return {"int": "a whole number", "float": "a number"}.get(kind, f"a {kind}")


def load_file(path: Path) -> dict[str, Any]:
    """The TOML file's leaves by option path; ValueError names an unknown key or a bad file."""
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"--config {path}: {err}") from None
    known = {o.path: o for o in OPTIONS}
    sections = {o.path[:i] for o in OPTIONS for i in range(1, len(o.path))}
    values: dict[str, Any] = {}

    def walk(table: Mapping[str, Any], prefix: tuple[str, ...]) -> None:
        for key, value in table.items():
            at = (*prefix, key)
            if isinstance(value, dict) and at in sections:
                walk(value, at)
            elif at in known:
                values[".".join(at)] = _convert(known[at], value, f"{'.'.join(at)} in {path}")
            else:
                raise ValueError(f"--config {path}: unknown key {'.'.join(at)!r}")

    walk(data, ())
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config`` and one flag per leaf; what was not given is resolved by :func:`from_args`
    (variable, then file, then the built-in default)."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"a TOML file of options (env {CONFIG_ENV}); flags and variables win over it",
    )
    for o in OPTIONS:
        shown = ",".join(map(str, o.builtin)) if isinstance(o.builtin, tuple) else o.builtin
        text = f"{o.help} (env {o.env}; default {shown})"
        if o.is_bool:
            parser.add_argument("--" + o.flag, default=None, action=argparse.BooleanOptionalAction,
                                help=text)  # fmt: skip
        else:
            parser.add_argument("--" + o.flag, default=None, help=text)


def from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """The configuration: each leaf from its flag, else its variable, else the file, else the
    default. ValueError names the flag, variable or file key that is wrong."""
    env = os.environ if environ is None else environ
    file_path = args.config or (Path(env[CONFIG_ENV]) if env.get(CONFIG_ENV) else None)
    from_file = load_file(Path(file_path)) if file_path is not None else {}
    leaves: dict[tuple[str, ...], Any] = {}
    for o in OPTIONS:
        given = getattr(args, o.dest, None)
        if given is not None:
            leaves[o.path] = _convert(o, given, "--" + o.flag)
        elif o.env in env:
            leaves[o.path] = _convert(o, env[o.env], o.env)
        elif o.file_key in from_file:
            leaves[o.path] = from_file[o.file_key]
    return build(leaves)


def from_options(**values: Any) -> GatewayConfig:
    """A configuration from options named as their flags are (``slo_ms=60``, ``policy="max"``,
    ``slack_hold_s=0.1``, ``port=0``), values already of their types; TypeError names an
    unknown one."""
    by_dest = {o.dest: o for o in OPTIONS}
    unknown = sorted(set(values) - set(by_dest))
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(unknown)}")
    return build({by_dest[k].path: v for k, v in values.items()})


def leaf(config: GatewayConfig, path: tuple[str, ...]) -> Any:
    """The value at ``path`` in ``config`` (``("policy", "slack", "hold_s")``)."""
    value: Any = config
    for name in path:
        value = getattr(value, name)
    return value


def to_flags(config: GatewayConfig, *, leave_out: Sequence[str] = ()) -> list[str]:
    """The ``python -m api serve`` flags that rebuild ``config`` (:func:`from_args` of them
    gives it back): one per leaf that differs from its built-in default, none for the flags
    named in ``leave_out`` (``"port"``: what the caller sets itself)."""
    out: list[str] = []
    for o in OPTIONS:
        value = leaf(config, o.path)
        if o.flag in leave_out or value == o.builtin:
            continue
        if o.is_bool:
            out.append(("--" if value else "--no-") + o.flag)
            continue
        if value is None:
            text = ""
        elif isinstance(value, tuple):
            text = ",".join(map(str, value))
        else:
            text = repr(value) if isinstance(value, float) else str(value)
        out.append(f"--{o.flag}={text}")  # one word: a value may start with "-"
    return out


def build(leaves: Mapping[tuple[str, ...], Any]) -> GatewayConfig:
    """A :class:`GatewayConfig` from the leaves given (the rest keep their defaults)."""

    def part(cls: Callable[..., Any], prefix: tuple[str, ...]) -> Any:
        values = {p[len(prefix)]: v for p, v in leaves.items()
                  if len(p) == len(prefix) + 1 and p[: len(prefix)] == prefix}  # fmt: skip
        return cls(**values)

    values = {p[0]: v for p, v in leaves.items() if len(p) == 1}
    if values.get("admin_token_file") is not None and values.get("admin_token") is None:
        values["admin_token"] = read_token(values["admin_token_file"])
    policy = PolicyConfig(
        **{p[1]: v for p, v in leaves.items() if len(p) == 2 and p[0] == "policy"},
        slack=part(SlackParams, ("policy", "slack")),
        feedback=part(FeedbackParams, ("policy", "feedback")),
        tokens=_tokens(leaves),
    )
    return GatewayConfig(
        **values,
        scheduler=part(SchedulerConfig, ("scheduler",)),
        policy=policy,
        placement=part(PlacementParams, ("placement",)),
    )


def _tokens(leaves: Mapping[tuple[str, ...], Any]) -> TokenPolicyParams:
    """The token policy's parameters from the leaves under ``policy.tokens``
    (:func:`scheduler.config.token_params`); ValueError says which part is wrong."""
    prefix = ("policy", "tokens")
    try:
        return token_params({p[2:]: v for p, v in leaves.items() if p[:2] == prefix})
    except ValueError as err:
        raise ValueError(f"the token policy's parameters (--tokens-*): {err}") from None


def read_token(path: Path) -> str:
    """The first line of ``path``, stripped; ValueError names the file when it is unusable."""
    try:
        token = path.read_text().splitlines()[0].strip() if path.stat().st_size else ""
    except (OSError, UnicodeDecodeError, IndexError) as err:
        raise ValueError(f"--admin-token-file {path}: {err}") from None
    if not token:
        raise ValueError(f"--admin-token-file {path} is empty")
    return token
