"""Nice values and CFS weights, exactly as Linux has them (kernel/sched/core.c)."""

from __future__ import annotations

NICE_MIN = -20
NICE_MAX = 19
NICE_0_WEIGHT = 1024

# sched_prio_to_weight[]: nice -20 .. 19. Each step of nice changes the share by about 10%
# (the ratio between neighbours is about 1.25).
SCHED_PRIO_TO_WEIGHT: tuple[int, ...] = (
    88761, 71755, 56483, 46273, 36291,
    29154, 23254, 18705, 14949, 11916,
    9548, 7620, 6100, 4904, 3906,
    3121, 2501, 1991, 1586, 1277,
    1024, 820, 655, 526, 423,
    335, 272, 215, 172, 137,
    110, 87, 70, 56, 45,
    36, 29, 23, 18, 15,
)  # fmt: skip


def weight_for_nice(nice: int) -> int:
    """The CFS load weight of a nice value; ValueError outside −20..19."""
    if not NICE_MIN <= nice <= NICE_MAX:
        raise ValueError(f"nice must be in {NICE_MIN}..{NICE_MAX}, got {nice}")
    return SCHED_PRIO_TO_WEIGHT[nice - NICE_MIN]
