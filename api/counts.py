"""The request path's metrics as plain numbers, read by a collector at scrape time.

prometheus_client's counters and histograms take a lock for every value they change (they
may be shared between threads); the sidecar counts from its event loop alone, several times
per request, where a lock, a method call through the metric's wrapper and a bucket search in
Python cost more than the counting. Here a labelled series is a plain object whose numbers
the request path adds to (compiled with the rest of the path, ``setup.py``), and a family
turns its series into prometheus_client's metric families when ``/metrics`` is read
(:class:`api.metrics.PlainCollector`). The exposition is the same as prometheus_client's own
for these kinds (``_total``; ``_bucket``, ``_count``, ``_sum``), without the ``_created``
samples that nothing reads.

Every change happens on the event loop, as every scrape does: nothing here locks.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any, cast

from prometheus_client import utils
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

# How prometheus_client writes a bucket's bound (``le``), so that the exposition is its own.
_go_float = cast(Callable[[float], str], utils.floatToGoString)


class Value:
    """One series of a counter or a gauge."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        """Count ``amount`` more (a counter never goes down)."""
        if amount < 0.0:
            raise ValueError(f"a counter only goes up: inc({amount!r})")
        self.value += amount

    def set(self, value: float) -> None:
        """A gauge's value now."""
        self.value = value


class Spread:
    """One series of a histogram: counts per bucket (each bound the least ``le`` a value fits
    under, the last one ``+Inf``) and the sum of the values."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """One value: in the first bucket whose bound is at least it, as Prometheus's ``le``."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class _Family:
    """A metric's name, help and label names, and its series by label values (made on first
    use; the label values are bounded where they are made, so the series are too)."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames

    def _check(self, values: tuple[str, ...]) -> None:
        if len(values) != len(self.labelnames):
            raise ValueError(
                f"{self.name} takes {len(self.labelnames)} label values "
                f"({', '.join(self.labelnames)}), got {len(values)}"
            )


class ValueFamily(_Family):
    """A counter or a gauge with labels."""

    def __init__(
        self, kind: str, name: str, documentation: str, labelnames: tuple[str, ...]
    ) -> None:
        if kind not in ("counter", "gauge"):
            raise ValueError(f"a value family is a counter or a gauge, not {kind!r}")
        super().__init__(name, documentation, labelnames)
        self.kind = kind
        self.series: dict[tuple[str, ...], Value] = {}

    def labels(self, *values: str) -> Value:
        """The series of these label values."""
        got = self.series.get(values)
        if got is None:
            self._check(values)
            got = self.series[values] = Value()
        return got

    def family(self, with_values: bool = True) -> Any:
        """prometheus_client's family for the exposition (empty for ``describe``)."""
        labels = list(self.labelnames)
        metric: Any
        if self.kind == "counter":
            metric = CounterMetricFamily(self.name, self.documentation, labels=labels)
        else:
            metric = GaugeMetricFamily(self.name, self.documentation, labels=labels)
        if with_values:
            for key, series in list(self.series.items()):
                metric.add_metric(list(key), series.value)
        return metric


class SpreadFamily(_Family):
    """A histogram with labels, every series on the same buckets."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        buckets: tuple[float, ...],
    ) -> None:
        super().__init__(name, documentation, labelnames)
        bounds = tuple(float(b) for b in buckets)
        if not bounds or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"{name}: buckets must be increasing, got {buckets!r}")
        self.bounds = bounds
        self._les = [_go_float(b) for b in bounds] + ["+Inf"]
        self.series: dict[tuple[str, ...], Spread] = {}

    def labels(self, *values: str) -> Spread:
        """The series of these label values."""
        got = self.series.get(values)
        if got is None:
            self._check(values)
            got = self.series[values] = Spread(self.bounds)
        return got

    def family(self, with_values: bool = True) -> Any:
        """prometheus_client's family for the exposition (empty for ``describe``)."""
        metric = HistogramMetricFamily(self.name, self.documentation, labels=list(self.labelnames))
        if with_values:
            for key, series in list(self.series.items()):
                cumulative: list[tuple[str, float]] = []
                total = 0
                for le, count in zip(self._les, series.counts, strict=True):
                    total += count
                    cumulative.append((le, float(total)))
                metric.add_metric(list(key), cumulative, series.sum)
        return metric
