"""The clock policy's configuration: its name and every parameter of every policy, in one tree.

The gateway (:class:`api.config.GatewayConfig`) and the simulator
(:class:`simulator.simulate.SimConfig`) both nest this one and
:class:`scheduler.core.SchedulerConfig`, so a default is written once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.feedback import FeedbackParams
from scheduler.policies import ClockPolicy, SlackParams
from scheduler.registry import DEFAULT_POLICY, POLICIES, make_policy
from scheduler.tokens import EnginePrior, TokenClockPolicy, TokenPolicyParams, TokenSlo

TOKENS = TokenClockPolicy.name


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
                    "simulated engines (sim:h100, sim:a100) have one"
                )
            return TokenClockPolicy(
                clocks_mhz, TokenSlo(self.ttft_ms, self.tpot_ms), engine, self.tokens
            )
        return make_policy(name, clocks_mhz, self.slack, self.feedback)
