"""Seed 000's isolation metric: ideal CFS's split, each client's completion time against it."""

from __future__ import annotations

import math

import pytest

from scheduler.isolation import ClientUsage, ideal_shares, isolation
from scheduler.weights import weight_for_nice

NICES = (-5, 0, 5)


def usage(
    served: tuple[float, ...], demand: tuple[float | None, ...] | None = None
) -> list[ClientUsage]:
    demands = demand or (None,) * len(served)
    return [
        ClientUsage(f"c{n}", 2, n, s, d) for n, s, d in zip(NICES, served, demands, strict=True)
    ]


def test_saturated_clients_share_by_weight() -> None:
    weights = [weight_for_nice(n) for n in NICES]  # 3121 : 1024 : 335
    ideal = ideal_shares(4480.0, usage((0.0, 0.0, 0.0)))
    assert ideal == pytest.approx([4480.0 * w / sum(weights) for w in weights])


def test_a_client_asking_for_less_gets_what_it_asks_and_the_rest_is_shared() -> None:
    ideal = ideal_shares(1000.0, usage((0.0, 0.0, 0.0), (None, 100.0, None)))
    assert ideal[1] == pytest.approx(100.0)
    assert ideal[0] / ideal[2] == pytest.approx(weight_for_nice(-5) / weight_for_nice(5))
    assert sum(ideal) == pytest.approx(1000.0)


def test_served_as_ideal_is_zero_deviation() -> None:
    report = isolation(usage((696.65, 228.57, 74.78)))
    assert report.deviation == pytest.approx(0.0, abs=1e-3)
    assert all(c.ratio == pytest.approx(1.0, abs=1e-3) for c in report.clients)


def test_fifo_like_service_is_far_from_ideal() -> None:
    """Equal service whatever the weights (what a FIFO queue at Triton gave): the heaviest
    client takes twice its ideal time, the lightest a third of it; the worst pair is the
    ratio of the two, minus one."""
    report = isolation(usage((1000.0, 1000.0, 1000.0)))
    heavy, light = report.ratio_of("c-5"), report.ratio_of("c5")
    assert heavy == pytest.approx(3000.0 * 3121 / 4480 / 1000.0)
    assert light == pytest.approx(3000.0 * 335 / 4480 / 1000.0)
    assert report.deviation == pytest.approx(heavy / light - 1.0)


def test_levels_are_compared_apart_and_a_lone_client_has_no_pair() -> None:
    clients = [
        ClientUsage("hi", 1, 0, 10.0),
        ClientUsage("a", 2, 0, 50.0),
        ClientUsage("b", 2, 0, 50.0),
    ]
    report = isolation(clients)
    assert math.isnan(report.deviation_by_level[1])
    assert report.deviation_by_level[2] == pytest.approx(0.0)
    assert report.deviation == pytest.approx(0.0)
    assert report.to_json()["deviation_by_level"] == {"1": None, "2": 0.0}
