"""Every clock policy by name, and :func:`make_policy`, which builds one from its name."""

from __future__ import annotations

from scheduler.adaptive import AdaptivePolicy
from scheduler.feedback import FeedbackParams
from scheduler.policies import (
    ClockPolicy,
    DefaultPolicy,
    FixedPolicy,
    MaxPolicy,
    SeedPolicy,
    SlackParams,
    SlackPolicy,
)

POLICIES: dict[str, type[ClockPolicy]] = {
    p.name: p for p in (MaxPolicy, DefaultPolicy, SeedPolicy, SlackPolicy, AdaptivePolicy)
}
DEFAULT_POLICY = AdaptivePolicy.name


def make_policy(
    name: str,
    clocks_mhz: list[int],
    slack: SlackParams | None = None,
    feedback: FeedbackParams | None = None,
) -> ClockPolicy:
    """The policy called ``name`` (``fixed:MHZ`` for one locked clock); ValueError lists the
    known ones. ``slack`` tunes ``slack`` and ``adaptive``, ``feedback`` the latter's loop."""
    if name == SlackPolicy.name:
        return SlackPolicy(clocks_mhz, slack)
    if name == AdaptivePolicy.name:
        return AdaptivePolicy(clocks_mhz, slack, feedback)
    kind, sep, arg = name.partition(":")
    if kind == FixedPolicy.name and sep:
        try:
            mhz = int(arg)
        except ValueError:
            raise ValueError(f"fixed:MHZ needs a whole number of MHz, got {arg!r}") from None
        return FixedPolicy(clocks_mhz, mhz)
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; known: {', '.join(POLICIES)}, fixed:MHZ"
        ) from None
    return cls(clocks_mhz)
