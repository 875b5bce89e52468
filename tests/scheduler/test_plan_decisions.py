"""The plan's speed-ups change no decision: seeded simulations give what they gave before them.

``slack`` and ``adaptive`` plan with :mod:`scheduler.constraints` (work tables instead of a
matrix product, two clocks checked around the last answer when feasibility is monotone, the
per-plan caches). The figures below are what each run gave with the plain evaluation (every
constraint at every clock, a matrix product per plan; ``slack`` as of commit 2133b8b,
``adaptive`` as reworked since: a base clock from the tail, an energy floor above idle for the
batches formed, holds planned at that floor and kept while the model runs, an idle clock, also
while every model waiting is held; the queue and the wait bound as the priority class meets them
now: a held-back model blocks nothing behind it, and lower levels go to Triton in staggered
chunks, spaced as far apart as what is at Triton needs, not as the cap would; and CFS charging
each request its model's GPU time per request in full batches, not its time from dispatch to
completion, which changes the order of the two nice clients' requests; the tail controller's
step settling as a class's completions add up, and its setpoint at 0.97; the tables' tail
margins taken as the spread around each clock's own mean, not against the fit; the energy floor
at the clock of least energy, with no tolerance below it; one arrival to come in ``adaptive``'s
plan; no clock change kept by a hold where the GPU rests at or above its batch's clock; the
energy floor counting the clock change a busy period ends with):
every clock change, batch and completion time feeds into them, so a single decision that
differs shows. A change that means to alter decisions updates them
(``python -m tests.scheduler.test_plan_decisions`` prints the current ones).
"""

from __future__ import annotations

import numpy as np
import pytest

from dvfs.profiles import CNN, TRANSFORMER, get_profile
from scheduler.clients import ClientSpec
from simulator.simulate import ModelMix, SimConfig, mix_capacity_rps, simulate

# (policy, arrival, seed) -> (completed, met, clock changes, batches, energy J, mean clock MHz,
# sum of latencies ms, median latency ms, largest latency ms)
BEFORE = {
    ("adaptive", "poisson", 3): (
        1175, 981, 14, 923, 1178.012253, 1514.95093, 443204.854003, 24.217433, 6460.719407
    ),
    ("adaptive", "bursty", 5): (
        961, 616, 9, 613, 956.250409, 1525.216729, 197039.648501, 44.831676, 1966.864769
    ),
    ("slack", "poisson", 3): (
        1175, 1004, 5, 858, 1134.587973, 1519.604874, 364840.404731, 28.619334, 5198.20511
    ),
    ("slack", "bursty", 5): (
        961, 578, 24, 622, 916.952173, 1456.680168, 202970.240863, 57.121597, 1938.973498
    ),
}  # fmt: skip


def fingerprint(policy: str, arrival: str, seed: int) -> tuple[float, ...]:
    """Two models with their own SLOs, three clients (nice, a priority class with its own
    SLO), 8 simulated seconds at 60% of the mix's full-batch capacity (a rate: what ``load``
    0.6 meant when the figures were taken)."""
    models = (ModelMix(CNN, 0.7, 60.0), ModelMix(TRANSFORMER, 0.3, 400.0))
    cfg = SimConfig(
        gpu="v100",
        policy=policy,
        duration_s=8.0,
        seed=seed,
        rate_rps=0.6 * mix_capacity_rps(get_profile("v100"), models),
        arrival=arrival,
        models=models,
        clients=(
            ClientSpec("a", 0.5, 0, -5),
            ClientSpec("b", 0.3, 0, 5),
            ClientSpec("c", 0.2, 1, 0, 45.0),
        ),
        with_oracle=False,
    )
    r = simulate(cfg)
    lat = np.sort(r.latencies_ms)
    return (
        r.completed,
        r.met,
        r.clock_changes,
        r.batches,
        round(r.energy_j, 6),
        round(r.mean_clock_mhz, 6),
        round(float(lat.sum()), 6),
        round(float(lat[len(lat) // 2]), 6),
        round(float(lat[-1]), 6),
    )


@pytest.mark.parametrize(("policy", "arrival", "seed"), sorted(BEFORE))
def test_decisions_are_those_of_the_plain_evaluation(policy: str, arrival: str, seed: int) -> None:
    assert fingerprint(policy, arrival, seed) == pytest.approx(BEFORE[policy, arrival, seed])


if __name__ == "__main__":
    for key in sorted(BEFORE):
        print(key, fingerprint(*key))
