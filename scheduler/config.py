"""The clock policy's configuration: its name and every parameter of every policy, in one tree.

The gateway (:class:`api.config.GatewayConfig`) and the simulator
(:class:`simulator.simulate.SimConfig`) both nest this one and
:class:`scheduler.core.SchedulerConfig`, so a default is written once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from scheduler.feedback import FeedbackParams, ScaleParams
from scheduler.policies import ClockPolicy, SlackParams
from scheduler.registry import DEFAULT_POLICY, POLICIES, make_policy
from scheduler.tokens import EnginePrior, TokenClockPolicy, TokenPolicyParams, TokenSlo

TOKENS = TokenClockPolicy.name
# The token policy's loops on the measured token tails: each a ScaleParams of the policy's own.
TOKEN_LOOPS = ("ttft_feedback", "tpot_feedback")
_TOKEN_SCALARS = frozenset(f.name for f in fields(TokenPolicyParams)) - set(TOKEN_LOOPS)
_SCALE_FIELDS = frozenset(f.name for f in fields(ScaleParams))


def token_default(path: tuple[str, ...]) -> Any:
    """The token policy's default at ``path``: ``(name,)`` for a parameter of the policy,
    ``(loop, name)`` for one of its loops' (the policy's own for that loop, not
    ScaleParams'); KeyError when ``path`` names no parameter."""
    if len(path) == 1 and path[0] in _TOKEN_SCALARS:
        return getattr(TokenPolicyParams(), path[0])
    if len(path) == 2 and path[0] in TOKEN_LOOPS and path[1] in _SCALE_FIELDS:
        return getattr(getattr(TokenPolicyParams(), path[0]), path[1])
    raise KeyError(".".join(path))


def token_params(values: Mapping[tuple[str, ...], Any]) -> TokenPolicyParams:
    """The token policy's parameters with each of ``values`` at its path (as
    :func:`token_default` names them): a loop's parameters not given keep the policy's own
    defaults for that loop. KeyError for a path that names no parameter; ValueError (the
    classes' own checks) for a value out of bounds."""
    for path in values:
        token_default(path)
    defaults = TokenPolicyParams()
    loops = {
        loop: replace(getattr(defaults, loop),
                      **{p[1]: v for p, v in values.items() if len(p) == 2 and p[0] == loop})
        for loop in TOKEN_LOOPS
    }  # fmt: skip
    return replace(defaults, **{p[0]: v for p, v in values.items() if len(p) == 1}, **loops)


@dataclass(frozen=True)
class PolicyConfig:
    """Which clock policy runs, and its parameters: ``slack`` tunes ``slack`` and ``adaptive``,
    ``feedback`` the latter's tail loop, ``tokens`` the token policy (and its two loops)."""

    name: str = DEFAULT_POLICY
    slack: SlackParams = field(default_factory=SlackParams)
    feedback: FeedbackParams = field(default_factory=FeedbackParams)
    # ``tokens`` (a GPU serving an LLM engine): the token SLOs it holds at the p99.
    ttft_ms: float = 500.0
    tpot_ms: float = 30.0
    tokens: TokenPolicyParams = field(default_factory=TokenPolicyParams)

    def __post_init__(self) -> None:
        known = (*POLICIES, TOKENS)
        if self.name not in known and not self.name.startswith("fixed:"):
            raise ValueError(
                f"--policy must be one of {', '.join(known)} or fixed:MHZ, got {self.name!r}"
            )
        TokenSlo(self.ttft_ms, self.tpot_ms)  # ValueError names a bad one

    def build(
        self, clocks_mhz: list[int], name: str | None = None, engine: EnginePrior | None = None
    ) -> ClockPolicy:
        """The policy (``name`` instead of the configured one, with the same parameters);
        ``tokens`` needs the engine's profile."""
        name = name or self.name
        if name == TOKENS:
            if engine is None:
                raise ValueError(
                    "--policy tokens needs a profile of the LLM engine: the embedded default's "
                    "simulated engines (sim:h100, sim:a100) have one; for another engine, let "
                    "the sidecar measure one at its first start (--profile-engine MODEL), or "
                    "make one with python -m time2clock profile-engine and pass --engine-profile"
                )
            return TokenClockPolicy(
                clocks_mhz, TokenSlo(self.ttft_ms, self.tpot_ms), engine, self.tokens
            )
        return make_policy(name, clocks_mhz, self.slack, self.feedback)
