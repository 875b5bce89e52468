"""Prometheus metrics of the gateway, in base units; the registry is injected, never global."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.counts import SpreadFamily, ValueFamily
from api.looplag import LAG_BUCKETS_S
from dvfs.device import Device
from scheduler.policies import FixedPolicy
from scheduler.registry import POLICIES

POLICY_NAMES = (*POLICIES, FixedPolicy.name)

LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# Decode steps of a large model on a GPU take a few to a few hundred milliseconds.
TOKEN_GAP_BUCKETS_S = (
    *(0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075),
    *(0.1, 0.15, 0.25, 0.5, 1.0),
)
MAX_CLIENT_LABELS = 100  # beyond this, clients share the label "other" (bounded cardinality)
MAX_LABEL_CHARS = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:@/+=-]")


def sanitize_label(value: str) -> str:
    """A label value safe to export: printable ASCII of a few kinds, at most 64 characters
    (a client may send anything: NULs, newlines, 10,000 characters)."""
    return _UNSAFE.sub("_", value[:MAX_LABEL_CHARS]) or "_"


class PlainCollector(Collector):
    """Exports the request path's plain metrics (:mod:`api.counts`) at scrape time."""

    def __init__(self, families: list[ValueFamily | SpreadFamily]) -> None:
        self.families = families

    def describe(self) -> Iterator[Metric]:
        """The families it exports, without their series (for a restricted scrape)."""
        for family in self.families:
            yield family.family(with_values=False)

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            yield family.family()


class DeviceCollector(Collector):
    """Reads the GPUs at scrape time: clock, power, energy counter; one family of each, a
    sample per GPU."""

    def __init__(self, device: Device | None = None, index: str = "0") -> None:
        self.devices: list[tuple[str, Device]] = [] if device is None else [(index, device)]

    def describe(self) -> Iterator[Metric]:
        """The families it exports, without reading the GPUs: so that a scrape restricted to
        some families (``/metrics?name[]=…``) knows which collector to ask."""
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        clock, power, energy = self._families()
        for index, device in self.devices:
            labels = [index, device.identity.name]
            clock.add_metric(labels, device.clock_mhz() * 1e6)
            power.add_metric(labels, device.power_w())
            energy.add_metric(labels, device.energy_j())
        yield from (clock, power, energy)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily]:
        clock = GaugeMetricFamily(
            "sidecar_gpu_clock_hertz", "Graphics clock read from the GPU.", labels=["gpu", "name"]
        )
        power = GaugeMetricFamily(
            "sidecar_gpu_power_watts", "Power the GPU draws.", labels=["gpu", "name"]
        )
        energy = CounterMetricFamily(
            "sidecar_gpu_energy_joules", "Energy the GPU used.", labels=["gpu", "name"]
        )
        return clock, power, energy


class GatewayMetrics:
    """Everything the gateway counts; one instance per app, each with its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = ValueFamily(
            "counter",
            "sidecar_requests",
            "Inference requests by outcome and protocol (http, grpc).",
            ("model", "priority", "client", "outcome", "protocol"),
        )
        self.latency = SpreadFamily(
            "sidecar_request_duration_seconds",
            "Latency in the sidecar: from the request's arrival (over HTTP its first byte read) to "
            "Triton's answer (admission, queue and Triton).",
            ("model", "client"),
            LATENCY_BUCKETS_S,
        )
        self.ttft = SpreadFamily(
            "sidecar_time_to_first_token_seconds",
            "Streams of tokens: from arrival to the first token.",
            ("model",),
            LATENCY_BUCKETS_S,
        )
        self.inter_token = SpreadFamily(
            "sidecar_inter_token_seconds",
            "Streams of tokens: time between one token and the next.",
            ("model",),
            TOKEN_GAP_BUCKETS_S,
        )
        self.output_tokens = ValueFamily(
            "counter",
            "sidecar_output_tokens",
            "Tokens streamed back to clients (energy per token: the GPUs' energy over this).",
            ("model",),
        )
        self.token_slo = ValueFamily(
            "counter",
            "sidecar_token_slo_requests",
            "Streams by token SLO (ttft, tpot) and whether they met it.",
            ("model", "slo", "met"),
        )
        self.queue_delay = SpreadFamily(
            "sidecar_queue_delay_seconds",
            "Time spent in the queue.",
            ("model",),
            LATENCY_BUCKETS_S,
        )
        self.slo = ValueFamily(
            "counter",
            "sidecar_slo_requests",
            "Completed requests, by whether they met their SLO.",
            ("model", "client", "met"),
        )
        self.gpu_time = ValueFamily(
            "counter",
            "sidecar_gpu_time_seconds",
            "GPU (Triton) time received.",
            ("client", "priority", "nice"),
        )
        self.queue_length = Gauge("sidecar_queue_length", "Requests waiting.", ["gpu"], registry=r)
        self.inflight = Gauge(
            "sidecar_inflight", "Requests sent to Triton, not yet answered.", ["gpu"], registry=r
        )
        self.clock_set = Gauge(
            "sidecar_gpu_clock_set_hertz",
            "Clock the policy set (0 when left to the GPU).",
            ["gpu"],
            registry=r,
        )
        self.clock_shadow = Gauge(
            "sidecar_gpu_clock_shadow_hertz",
            "Shadow mode: the clock the policy would set (0: it would leave it to the GPU); "
            "nothing is written.",
            ["gpu"],
            registry=r,
        )
        self.shadow_mode = Gauge(
            "sidecar_shadow_mode",
            "1 when the sidecar only decides and never writes a clock (--shadow).",
            ["gpu"],
            registry=r,
        )
        self.shadow_energy = ValueFamily(
            "counter",
            "sidecar_shadow_energy_joules",
            "Shadow mode: table-estimated energy of the completed requests at the clock the GPU "
            "ran (at=gpu_clock) and at the clock the policy would have set (at=shadow_clock); "
            "their difference is the estimated saving.",
            ("gpu", "at"),
        )
        self.clock_change_delay = Gauge(
            "sidecar_gpu_clock_change_delay_seconds",
            "How long the GPU's clock changes take to land, from the policy asking to the "
            "clock read back (figure=measured: the p90 of the raises timed lately) and what "
            "the policy plans raises with (figure=planned).",
            ["gpu", "figure"],
            registry=r,
        )
        self.clock_changes = Counter(
            "sidecar_gpu_clock_changes", "Clock changes applied.", ["gpu"], registry=r
        )
        self.policy = Gauge(
            "sidecar_policy_info",
            "The clock policy in force (1 for it).",
            ["gpu", "policy"],
            registry=r,
        )
        self.base_speed = Gauge(
            "sidecar_base_speed",
            "Policy adaptive: the speed the model's SLO classes ask of the GPU while busy, over "
            "the top clock's (the fastest of its classes, learned from the measured tail; 1 = "
            "the top clock).",
            ["gpu", "model"],
            registry=r,
        )
        self.client_weight = ValueFamily(
            "gauge",
            "sidecar_client_weight",
            "CFS weight of the nice a client last sent, by priority level.",
            ("client", "priority"),
        )
        self.default_slo = Gauge(
            "sidecar_default_slo_seconds", "SLO of requests that name none.", registry=r
        )
        self.loop_lag = Histogram(
            "sidecar_event_loop_lag_seconds",
            "How late the event loop ran a timer due every 50 ms: what a callback running long "
            "added to every request meanwhile.",
            buckets=LAG_BUCKETS_S,
            registry=r,
        )
        self.gpu_requests = ValueFamily(
            "counter",
            "sidecar_gpu_requests",
            "Requests each GPU's Triton answered (its share of the node's work).",
            ("gpu",),
        )
        self.placement = Gauge(
            "sidecar_placement_info",
            "How requests are placed on the node's GPUs (1 for the mode in force), and how many "
            "GPUs the sidecar drives.",
            ["placement", "gpus"],
            registry=r,
        )
        r.register(PlainCollector(self._plain()))
        self._clients: set[str] = set()
        self._client_labels: dict[str, str] = {}  # client id as sent -> its label
        # The model label: the runtime puts its model index here (known names, else "unknown").
        self.model_label: Callable[[str], str] = sanitize_label
        # The series the request path uses, by their label values.
        self.requests_of = self.requests.labels
        self.latency_of = self.latency.labels
        self.queue_delay_of = self.queue_delay.labels
        self.slo_of = self.slo.labels
        self.gpu_time_of = self.gpu_time.labels
        self.client_weight_of = self.client_weight.labels
        self.requests_by_protocol: dict[str, int] = {}  # for the admin state
        self._device_collector: DeviceCollector | None = None

    def _plain(self) -> list[ValueFamily | SpreadFamily]:
        """The families kept as plain numbers (those the request path or a stream changes):
        found among the attributes, so that one added above is exported without a list to
        keep."""
        return [v for v in vars(self).values() if isinstance(v, ValueFamily | SpreadFamily)]

    def count(
        self, model: str, priority: str, client: str, outcome: str, protocol: str = "http"
    ) -> None:
        """One request with this outcome."""
        self.requests_of(model, priority, client, outcome, protocol).inc()
        self.requests_by_protocol[protocol] = self.requests_by_protocol.get(protocol, 0) + 1

    def client_label(self, client_id: str) -> str:
        """The first ``MAX_CLIENT_LABELS`` clients by name (sanitised), then ``other``."""
        label = self._client_labels.get(client_id)
        if label is not None:
            return label
        label = sanitize_label(client_id)
        if label not in self._clients:
            if len(self._clients) >= MAX_CLIENT_LABELS:
                return "other"  # not remembered: a flood of made-up ids stays bounded
            self._clients.add(label)
        if len(self._client_labels) < 4 * MAX_CLIENT_LABELS:
            self._client_labels[client_id] = label
        return label

    def watch_device(self, device: Device, index: str) -> None:
        """Export ``device`` (the GPU labelled ``index``) at every scrape."""
        if self._device_collector is None:
            self._device_collector = DeviceCollector()
            self.registry.register(self._device_collector)
        self._device_collector.devices.append((index, device))

    def set_placement(self, mode: str, gpus: int) -> None:
        self.placement.labels(mode, str(gpus)).set(1.0)

    def set_policy(self, gpu: str, name: str) -> None:
        """1 for the policy in force, 0 for every other one."""
        for other in POLICY_NAMES:
            self.policy.labels(gpu, other).set(1.0 if other == name else 0.0)
