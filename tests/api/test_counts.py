"""The request path's plain metrics (api/counts.py) expose what prometheus_client's own
counters, gauges and histograms expose for the same values, ``_created`` aside."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from api.counts import SpreadFamily, ValueFamily
from api.metrics import GatewayMetrics, PlainCollector

BUCKETS_S = (0.001, 0.0025, 0.01, 0.1, 1.0, 10.0)
# On a bound, between bounds, under the first, over the last, and zero.
VALUES_S = (0.001, 0.0025, 0.0011, 0.5, 0.0, 0.0004, 12.0, 1.0, 0.05, 10.0)


def exposition(registry: CollectorRegistry) -> list[str]:
    """The text exposition's lines, without the ``_created`` samples and their headers."""
    return sorted(
        line for line in generate_latest(registry).decode().splitlines() if "_created" not in line
    )


def test_counters_gauges_and_histograms_read_as_prometheus_clients_own() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    counter = Counter("c", "A counter.", ["model", "client"], registry=theirs)
    gauge = Gauge("g", "A gauge.", ["client"], registry=theirs)
    histogram = Histogram(
        "h_seconds", "A histogram.", ["model"], buckets=BUCKETS_S, registry=theirs
    )
    plain_counter = ValueFamily("counter", "c", "A counter.", ("model", "client"))
    plain_gauge = ValueFamily("gauge", "g", "A gauge.", ("client",))
    plain_histogram = SpreadFamily("h_seconds", "A histogram.", ("model",), BUCKETS_S)
    ours.register(PlainCollector([plain_counter, plain_gauge, plain_histogram]))
    for i, value in enumerate(VALUES_S):
        model, client = ("m1", "a") if i % 3 else ("m2", 'b"\\\n')
        counter.labels(model, client).inc(value)
        plain_counter.labels(model, client).inc(value)
        gauge.labels(client).set(-value)
        plain_gauge.labels(client).set(-value)
        histogram.labels(model).observe(value)
        plain_histogram.labels(model).observe(value)
    assert exposition(ours) == exposition(theirs)
    assert ours.get_sample_value("h_seconds_bucket", {"model": "m1", "le": "0.001"}) == 2.0


def test_a_restricted_scrape_finds_the_plain_families() -> None:
    metrics = GatewayMetrics()
    metrics.count("simnet", "0", "a", "ok")
    metrics.latency_of("simnet", "a").observe(0.02)
    restricted = metrics.registry.restricted_registry(["sidecar_requests_total"])
    text = generate_latest(restricted).decode()
    assert 'sidecar_requests_total{client="a",model="simnet",outcome="ok"' in text
    assert "sidecar_request_duration_seconds" not in text


def test_bad_use_is_refused_clearly() -> None:
    family = ValueFamily("counter", "c", "A counter.", ("model", "client"))
    with pytest.raises(ValueError, match="takes 2 label values"):
        family.labels("only-one")
    with pytest.raises(ValueError, match="only goes up"):
        family.labels("m", "a").inc(-1.0)
    with pytest.raises(ValueError, match="counter or a gauge"):
        ValueFamily("summary", "s", "S.", ())
    with pytest.raises(ValueError, match="increasing"):
        SpreadFamily("h", "H.", (), (1.0, 0.5))
    assert family.labels("m", "a").value == 0.0  # the refused inc counted nothing


def test_an_infinite_value_lands_where_prometheus_puts_it() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    histogram = Histogram("h", "H.", buckets=BUCKETS_S, registry=theirs)
    plain = SpreadFamily("h", "H.", (), BUCKETS_S)
    ours.register(PlainCollector([plain]))
    for value in (math.inf, 0.3):
        histogram.observe(value)
        plain.labels().observe(value)
    assert exposition(ours) == exposition(theirs)
