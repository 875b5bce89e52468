"""One config tree: flags, variables and a TOML file, with the precedence documented."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

from api.config import (
    OPTIONS,
    GatewayConfig,
    add_arguments,
    default_state_dir,
    from_args,
    from_options,
    to_flags,
)
from dvfs.llm_profiles import get_llm_profile
from scheduler.core import SchedulerConfig
from scheduler.tokens import TokenClockPolicy, TokenPolicyParams
from simulator.generative import engine_prior
from simulator.simulate import SimConfig


def parse(argv: list[str], environ: dict[str, str] | None = None) -> GatewayConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_args(parser.parse_args(argv), environ or {})


def test_defaults_are_the_nested_classes_own() -> None:
    config = parse([])
    assert config.scheduler == SchedulerConfig()
    assert config.policy.name == "adaptive"
    assert config.scheduler.max_inflight == SimConfig().max_inflight


def test_every_policy_parameter_is_settable(tmp_path: Path) -> None:
    config = parse(["--slack-hold-s", "0.2", "--feedback-target", "0.95", "--policy", "slack"])
    assert config.policy.name == "slack"
    assert config.policy.slack.hold_s == 0.2 and config.policy.feedback.target == 0.95
    flags = {o.flag for o in OPTIONS}
    assert {"slack-quantile", "feedback-setpoint", "max-inflight", "slo-ms"} <= flags


def test_the_token_policy_and_its_loops_are_settable_and_reach_the_policy(tmp_path: Path) -> None:
    """Every parameter of ``tokens``, its two loops' included, by flag, variable and file key;
    a loop's parameters left alone keep the token policy's own defaults for that loop (not
    ScaleParams'); the policy built for a GPU runs with them."""
    file = tmp_path / "sidecar.toml"
    file.write_text(
        '[policy]\nname = "tokens"\n[policy.tokens]\nbatched_tokens = 8192\nhold_s = 3.0\n'
        "[policy.tokens.tpot_feedback]\nsetpoint = 0.95\n"
    )
    env = {"SIDECAR_CONFIG": str(file), "SIDECAR_TOKENS_MAX_SEQS": "128"}
    config = parse(["--tokens-tpot-share", "0.9", "--tokens-ttft-feedback-min-scale", "0.6"], env)
    tokens = config.policy.tokens
    default = TokenPolicyParams()
    assert tokens.tpot_share == 0.9 and tokens.ttft_feedback.min_scale == 0.6  # flags
    assert tokens.max_seqs == 128  # variable
    assert tokens.batched_tokens == 8192 and tokens.hold_s == 3.0  # file
    assert tokens.tpot_feedback.setpoint == 0.95
    assert tokens.tpot_feedback.backoff == default.tpot_feedback.backoff != 0.7  # its own
    assert tokens.ttft_feedback.setpoint == default.ttft_feedback.setpoint
    assert tokens.period_s == default.period_s
    settable = {o.path for o in OPTIONS}
    for name in TokenPolicyParams.__dataclass_fields__:
        if name in ("ttft_feedback", "tpot_feedback"):
            assert ("policy", "tokens", name, "setpoint") in settable
        else:
            assert ("policy", "tokens", name) in settable
    clocks = list(get_llm_profile("h100").clocks_mhz)
    policy = config.policy.build(clocks, engine=engine_prior("h100", 256, 0, 0.03))
    assert isinstance(policy, TokenClockPolicy)
    assert policy.tokens.params == tokens
    assert parse(to_flags(config)) == config
    with pytest.raises(ValueError, match=r"--tokens-\*\): tpot_share must be in"):
        parse(["--tokens-tpot-share", "2"])
    with pytest.raises(ValueError, match="SIDECAR_TOKENS_GAP_CAP must be a whole number"):
        parse([], {"SIDECAR_TOKENS_GAP_CAP": "many"})
    with pytest.raises(ValueError, match="setpoint must be in"):
        parse(["--tokens-tpot-feedback-setpoint", "1.5"])


def test_flag_beats_variable_beats_file_beats_default(tmp_path: Path) -> None:
    file = tmp_path / "sidecar.toml"
    file.write_text(
        "port = 9000\nmax_body_bytes = 1000\n[scheduler]\nmax_queue = 7\ndefault_slo_ms = 40\n"
        '[policy]\nname = "slack"\n[policy.slack]\nhold_s = 0.3\n'
    )
    env = {"SIDECAR_CONFIG": str(file), "SIDECAR_MAX_QUEUE": "9", "SIDECAR_PORT": "9100"}
    config = parse(["--port", "9200"], env)
    assert config.port == 9200  # flag
    assert config.scheduler.max_queue == 9  # variable
    assert config.scheduler.default_slo_ms == 40 and config.max_body_bytes == 1000  # file
    assert config.policy.name == "slack" and config.policy.slack.hold_s == 0.3
    assert config.grpc_port == 8001  # default
    assert parse(["--config", str(file)]).scheduler.max_queue == 7


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("nope = 1\n", "unknown key 'nope'"),
        ("[scheduler]\nmax_queue = 1.5\n", "scheduler.max_queue"),
        ("[policy.feedback]\nbogus = 1\n", "unknown key 'policy.feedback.bogus'"),
        ("port = 70000\n", "--port must be in 0..65535"),
        ("[policy]\nname = 'fastest'\n", "--policy must be one of"),
        ("port = [", "--config"),
    ],
)
def test_bad_files_are_named(tmp_path: Path, text: str, problem: str) -> None:
    file = tmp_path / "bad.toml"
    file.write_text(text)
    with pytest.raises(ValueError, match=problem.replace(".", r"\.").replace("[", r"\[")):
        parse(["--config", str(file)])


def test_bad_values_name_their_flag_or_variable() -> None:
    with pytest.raises(ValueError, match="--max-queue must be a whole number"):
        parse(["--max-queue", "lots"])
    with pytest.raises(ValueError, match="SIDECAR_SLACK_SAFETY must be a number"):
        parse([], {"SIDECAR_SLACK_SAFETY": "high"})
    with pytest.raises(ValueError, match="quantile must be one of"):
        parse(["--slack-quantile", "p42"])
    with pytest.raises(ValueError, match="--slo-outside-ms must be >= 0 and under --slo-ms"):
        parse(["--slo-ms", "40", "--slo-outside-ms", "40"])


def test_from_options_uses_flag_names() -> None:
    config = from_options(slo_ms=60.0, policy="max", max_queue=8, port=0)
    assert config.slo_ms == 60.0 and config.policy.name == "max"
    assert config.scheduler.max_queue == 8 and config.port == 0
    with pytest.raises(TypeError, match="unknown option"):
        from_options(max_qeueu=8)


def test_flags_written_for_a_config_rebuild_it(tmp_path: Path) -> None:
    """What a benchmark hands a sidecar process it starts: every kind of leaf (a bool set and
    cleared, a tuple, an empty tuple, a path, None, a float, a nested policy parameter)."""
    config = from_options(
        state_dir=tmp_path,
        profile_models=(),
        table=(tmp_path / "a.json", tmp_path / "b.json"),
        learn=False,
        shadow=True,
        slo_ms=40.0,
        policy="slack",
        slack_hold_s=0.125,
        feedback_setpoint=0.9,
        feedback_idle_power_w=None,
        device="sim:v100x2",
        max_queue=9,
    )
    assert parse(to_flags(config)) == config
    assert to_flags(GatewayConfig(state_dir=tmp_path)) == [f"--state-dir={tmp_path}"]
    assert parse(to_flags(from_options(admin_token="-x"))).admin_token == "-x"
    left = to_flags(config, leave_out=("state-dir", "device"))
    assert not [f for f in left if f.startswith(("--state-dir", "--device"))]
    assert parse(left) == replace(config, state_dir=GatewayConfig().state_dir, device=None)


def test_the_tests_never_write_to_the_users_cache(session_cache: Path) -> None:
    # A sidecar a test starts with the default state directory profiles and learns into the
    # session's own cache (tests/conftest.py), not into the table a later `make demo` reads.
    assert default_state_dir() == session_cache / "energy-sidecar"
    assert from_options().state_dir == session_cache / "energy-sidecar"
