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


@dataclass(frozen=True)
class PolicyConfig:
    """Which clock policy runs, and its parameters: ``slack`` tunes ``slack`` and ``adaptive``,
    ``feedback`` the latter's tail loop."""

    name: str = DEFAULT_POLICY
    slack: SlackParams = field(default_factory=SlackParams)
    feedback: FeedbackParams = field(default_factory=FeedbackParams)

    def __post_init__(self) -> None:
        if self.name not in POLICIES and not self.name.startswith("fixed:"):
            raise ValueError(
                f"--policy must be one of {', '.join(POLICIES)} or fixed:MHZ, got {self.name!r}"
            )

    def build(self, clocks_mhz: list[int], name: str | None = None) -> ClockPolicy:
        """The policy (``name`` instead of the configured one, with the same parameters)."""
        return make_policy(name or self.name, clocks_mhz, self.slack, self.feedback)
