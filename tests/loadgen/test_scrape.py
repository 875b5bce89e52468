"""The load generator's reading of /metrics: the same values as prometheus_client's parser."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api.metrics import GatewayMetrics
from dvfs.simulated import SimulatedDevice
from loadgen.metrics import CLOCK_METRICS, histogram_buckets, scrape_values

TRICKY = """\
# HELP odd_total A counter typed without its suffix's family name.
# TYPE odd_total counter
odd_total{gpu="0",name="Tesla V100 {SXM2}"} 3.0
odd_total{gpu="1",name="a \\"quoted\\" b"} 4.5
odd_created{gpu="0"} 1.7e9
# TYPE plain counter
plain 7.0
# TYPE lat summary
lat{quantile="0.5"} 0.25
lat_count 10
lat_sum 2.5
# TYPE h histogram
h_bucket{le="+Inf"} 3
h_count 3
h_sum 0.5
h_created 1.7e9
# TYPE build info
build_info{version="1"} 1
untyped_thing 2
untyped_thing{x="y"} 3
nv_energy_consumption{gpu_uuid="GPU-1"} 1.5e+03

# HELP sidecar_gpu_clock_hertz Graphics clock read from the GPU.
# TYPE sidecar_gpu_clock_hertz gauge
sidecar_gpu_clock_hertz{gpu="0",name="a"} 9.0e+08
sidecar_gpu_clock_hertz{gpu="1",name="a"} 1.5e+09
g_nan NaN
g_inf +Inf
"""


def reference(text: str) -> dict[str, float]:
    """What the load generator read before: prometheus_client's parser, every family."""
    out: dict[str, float] = {}
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in (family.name, family.name + "_total"):
                out[family.name] = out.get(family.name, 0.0) + s.value
                counts[family.name] = counts.get(family.name, 0) + 1
    for name in CLOCK_METRICS:
        if counts.get(name, 0) > 1:
            out[name] /= counts[name]
    return out


def sidecar_exposition(tmp_path: Path) -> str:
    """The sidecar's own /metrics with traffic counted: labelled counters and their
    ``_created``, histograms, gauges, and the GPUs read at scrape time."""
    metrics = GatewayMetrics()
    for client in ("a", "b b", 'c"}'):
        metrics.count("simnet", "0", metrics.client_label(client), "ok")
        metrics.latency_of("simnet", metrics.client_label(client)).observe(0.012)
    metrics.queue_delay_of("simnet").observe(0.001)
    metrics.clock_set.labels("0").set(1.2e9)
    metrics.set_policy("0", "adaptive")
    devices = [SimulatedDevice("v100", state_path=tmp_path / f"gpu{i}.state") for i in "01"]
    for index, device in enumerate(devices):
        metrics.watch_device(device, str(index))
    try:
        return generate_latest(metrics.registry).decode()
    finally:
        for device in devices:
            device.close()


@pytest.mark.parametrize("which", ["tricky", "sidecar"])
def test_the_line_scan_reads_what_the_parser_reads(which: str, tmp_path: Path) -> None:
    text = TRICKY if which == "tricky" else sidecar_exposition(tmp_path)
    mine, theirs = scrape_values(text), reference(text)
    assert mine.keys() == theirs.keys()
    for key, value in theirs.items():
        assert mine[key] == pytest.approx(value, nan_ok=True), key
    if which == "sidecar":
        assert mine["sidecar_requests"] == 3.0  # the clients' counters add up
        assert mine["sidecar_gpu_clock_set_hertz"] == 1.2e9
        assert "sidecar_request_duration_seconds" not in mine  # a histogram: not a value
    else:
        assert mine["odd"] == 7.5 and mine["plain"] == 7.0 and mine["lat"] == 0.25


def test_a_type_line_without_a_type_is_refused() -> None:
    with pytest.raises(ValueError):
        scrape_values("# TYPE lonely\nlonely 1\n")


def test_histogram_buckets_are_summed_over_the_label_sets_asked_for() -> None:
    registry = CollectorRegistry()
    h = Histogram("lat_seconds", "latency", ["client"], buckets=(0.1, 0.5), registry=registry)
    for client, value in (("hi", 0.05), ("hi", 0.3), ("lo", 0.05), ("lo", 0.9)):
        h.labels(client).observe(value)
    text = generate_latest(registry).decode()
    inf = float("inf")
    assert histogram_buckets(text, "lat_seconds", {"client": "hi"}) == {0.1: 1, 0.5: 2, inf: 2}
    assert histogram_buckets(text, "lat_seconds") == {0.1: 2, 0.5: 3, inf: 4}
    assert histogram_buckets(text, "lat_seconds", {"client": "none"}) == {}
    assert histogram_buckets(text, "other_seconds") == {}
