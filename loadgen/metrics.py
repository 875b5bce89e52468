"""What the server side says: the sidecar's /metrics (energy, clock) and Triton's model stats."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

# Joules: the sidecar's counter, or Triton's own GPU counter when pointed at a Triton with a GPU.
ENERGY_METRICS = ("sidecar_gpu_energy_joules", "nv_energy_consumption")
CLOCK_METRICS = ("sidecar_gpu_clock_hertz",)


# The samples a family of each type owns beyond its name (prometheus_client's text parser).
_OWN_SUFFIXES = {"summary": ("_count", "_sum", ""), "histogram": ("_count", "_sum", "_bucket")}


def scrape_values(text: str) -> dict[str, float]:
    """Each counter/gauge by family name: the sum of its samples (a sidecar with several GPUs
    has one per GPU: energy adds up), the mean for the clocks (the node's mean clock).

    One pass over the lines rather than prometheus_client's parser, with its rules: the load
    generator scrapes while it measures, and parsing every sample into objects held its event
    loop for milliseconds each time, which the replies arriving then were charged. As that
    parser reads it: a ``# HELP`` or ``# TYPE`` line starts a family; a counter's family is its
    name without ``_total``, its samples ``name_total``; a sample its family does not own (a
    counter's ``_created``, say) is a family of its own; a family's value is the sum of the
    samples named as the family or as the family with ``_total``."""
    out: dict[str, float] = {}
    counts: dict[str, int] = {}
    name, kind, own = "", "untyped", frozenset[str]()
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
                continue
            if parts[1] == "HELP":
                if parts[2] != name:
                    name, kind, own = parts[2], "untyped", frozenset((parts[2],))
                continue
            if len(parts) < 4:
                raise ValueError(f"a TYPE line without a type: {line!r}")
            name, kind = parts[2], parts[3]
            own = frozenset(name + x for x in _OWN_SUFFIXES.get(kind, ("",)))
            continue
        brace, space = line.find("{"), line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            sample, rest = line[:brace], line[line.rindex("}") + 1 :]
        else:
            sample, rest = line[:space], line[space:]
        value = float(rest.split()[0])
        if sample in own:
            family = name
            if kind == "counter":
                family = name.removesuffix("_total")
                sample = family + "_total"
        else:  # a family of its own, and the one before it ends
            name, kind, own = "", "untyped", frozenset()
            family = sample
        if sample in (family, family + "_total"):
            out[family] = out.get(family, 0.0) + value
            counts[family] = counts.get(family, 0) + 1
    for clock in CLOCK_METRICS:
        if counts.get(clock, 0) > 1:
            out[clock] /= counts[clock]
    return out


def histogram_totals(text: str, family: str) -> tuple[float, float]:
    """A histogram's ``_sum`` and ``_count`` over all its label sets (0, 0 when absent)."""
    total, count = 0.0, 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name != family:
            continue
        for s in fam.samples:
            if s.name == family + "_sum":
                total += s.value
            elif s.name == family + "_count":
                count += s.value
    return total, count


def histogram_buckets(
    text: str, family: str, labels: Mapping[str, str] | None = None
) -> dict[float, float]:
    """A histogram's cumulative bucket counts by upper bound (``inf`` for the last), summed
    over its label sets that carry ``labels`` (all, without; empty when absent)."""
    want = dict(labels or {})
    out: dict[float, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != family:
            continue
        for s in fam.samples:
            if s.name == family + "_bucket" and want.items() <= s.labels.items():
                le = float(s.labels["le"])
                out[le] = out.get(le, 0.0) + s.value
    return out


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url) as resp:
        resp.raise_for_status()
        return scrape_values(await resp.text())


def energy_j(values: dict[str, float]) -> float | None:
    for name in ENERGY_METRICS:
        if name in values:
            return values[name]
    return None


@dataclass
class ClockSampler:
    """Samples the GPU clock from /metrics every ``period_s`` while a measurement runs.

    Each scrape costs the sidecar's event loop an exposition (and this one its parse), time
    every request waiting then pays: it asks for the clock's family alone, a few times a
    second, which gives the mean clock over a run without the sampler showing in the
    latencies it is measured beside."""

    session: aiohttp.ClientSession
    url: str
    period_s: float = 0.25
    values_hz: list[float] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        # Only the clock's family where the server can restrict its answer (the sidecar and
        # prometheus_client's exposition do; a server that cannot sends it all).
        url = self.url if "?" in self.url else f"{self.url}?name[]={CLOCK_METRICS[0]}"
        while True:
            with contextlib.suppress(aiohttp.ClientError, ValueError):
                values = await scrape(self.session, url)
                for name in CLOCK_METRICS:
                    if name in values:
                        self.values_hz.append(values[name])
            await asyncio.sleep(self.period_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def mean_mhz(self) -> float | None:
        return sum(self.values_hz) / len(self.values_hz) / 1e6 if self.values_hz else None

    @property
    def distinct_mhz(self) -> list[int]:
        return sorted({round(v / 1e6) for v in self.values_hz})


async def model_stats(session: aiohttp.ClientSession, url: str, model: str) -> dict[str, float]:
    """Triton's cumulative inference statistics (counts and ns) for ``model``."""
    async with session.get(f"http://{url}/v2/models/{model}/stats") as resp:
        resp.raise_for_status()
        return stats_counts(await resp.json())


def stats_counts(data: dict[str, Any]) -> dict[str, float]:
    """Counts and ns from a statistics reply (HTTP's JSON, or gRPC's as a dict)."""
    out: dict[str, float] = {}
    for entry in data.get("model_stats", []):
        stats = entry.get("inference_stats", {})
        for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
            part = stats.get(key, {})
            out[f"{key}_count"] = out.get(f"{key}_count", 0.0) + float(part.get("count", 0))
            out[f"{key}_ns"] = out.get(f"{key}_ns", 0.0) + float(part.get("ns", 0))
        out["inference_count"] = out.get("inference_count", 0.0) + float(
            entry.get("inference_count", 0)
        )
    return out
