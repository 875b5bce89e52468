"""Tables that learn, live: where the learned tables are kept, how they are saved, what they
export, and the reader that feeds the GPU's energy counter to the energy fit.

The scheduler core refits the tables (:mod:`time2clock.online`); this module keeps the result
across restarts. Every ``save_every_s`` the tables of the models refitted since the last save
are written to ``<state-dir>/tables/<gpu>-learned-v3.json`` (atomically: a temporary file
renamed over the old one, so a crash never leaves half a table), and once more on the way out.
The next start loads that file in preference to the profiled cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.tasks import cancel_and_wait
from dvfs.device import Device
from dvfs.energy import EnergyCounter, EnergyReading
from dvfs.errors import DeviceError
from time2clock.online import OnlineTables
from time2clock.table import TableError, TableSet

log = logging.getLogger(__name__)
SAVE_EVERY_S = 10.0
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def learned_path(state_dir: Path, gpu_name: str, version: int) -> Path:
    """Where the tables learned on ``gpu_name`` are kept."""
    return state_dir / "tables" / f"{_UNSAFE.sub('_', gpu_name)}-learned-v{version}.json"


def load_learned(path: Path) -> TableSet:
    """The learned tables at ``path``; empty (with a warning) when there are none usable."""
    if not path.is_file():
        return TableSet()
    try:
        tables = TableSet.load(path)
    except TableError as err:
        log.warning("ignoring the learned tables: %s", err)
        return TableSet()
    log.info("using the learned time2clock tables of %s from %s", ", ".join(tables.models), path)
    return tables


def save_atomic(tables: TableSet, path: Path) -> None:
    """Write ``tables`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(tables.to_json(), handle, indent=2)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class LearnedTableSaver:
    """Saves what the online fit learned, at most every ``save_every_s``, and at stop."""

    def __init__(
        self,
        learner: OnlineTables,
        tables: Callable[[], TableSet],
        path: Path,
        *,
        keep: Iterable[str] = (),
        save_every_s: float = SAVE_EVERY_S,
    ) -> None:
        """``keep``: models whose learned table was loaded at start; they stay in the file
        whether or not they are served this time."""
        self.learner = learner
        self.keep = set(keep)
        self._tables = tables
        self.path = path
        self.save_every_s = save_every_s
        self._saved_version = learner.version
        self._task: asyncio.Task[None] | None = None
        self.saves = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="learned-table-saver")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await self.save()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.save_every_s)
            await self.save()

    async def save(self) -> None:
        """Write the learned models' tables if a refit changed them since the last save."""
        if self.learner.version == self._saved_version:
            return
        version = self.learner.version
        current = self._tables()
        learned = TableSet(
            t for t in current if self.learner.refits(t.model) or t.model in self.keep
        )
        if not len(learned):
            return
        try:
            await asyncio.to_thread(save_atomic, learned, self.path)
        except OSError as err:
            log.warning("could not save the learned tables to %s: %s", self.path, err)
            return
        self._saved_version = version
        self.saves += 1


class EnergyReader:
    """Reads the GPU's energy counter every ``poll_s`` in a thread of its own (an NVML call
    blocks) and hands the new values, in order and each with the counter's refresh interval as
    learned, to ``on_reading`` in the event loop (the scheduler's thread).

    The values are handed over in batches, at most every ``deliver_s``: each carries the time
    it became current, and the energy fit attributes it by that time, so a value that reaches
    the loop a little later is attributed exactly as one that came at once. Polling in one
    long-lived thread and waking the loop a few times a second, rather than a worker-thread
    hop per read, is what keeps an idle sidecar's CPU low.

    Once the scheduler has had no work for ``idle_after_s`` (``last_work_s``, asked at each
    read: when it last had a request at Triton or waiting), the reader reads every
    ``idle_poll_s`` instead, until work comes again. Each wake-up of the thread costs the
    process a few hundred microseconds of CPU on a small machine, most of an idle sidecar's
    CPU at 50 reads a second; and an idle GPU's windows lose nothing by it: a value's time is
    late by at most the gap between reads *and* at most the counter's own refresh interval,
    and the windows an idle GPU gives are its idle power alone.
    """

    def __init__(
        self,
        device: Device,
        on_reading: Callable[[EnergyReading, float | None], None],
        *,
        poll_s: float,
        deliver_s: float = 0.1,
        idle_poll_s: float | None = None,
        idle_after_s: float = 1.0,
        last_work_s: Callable[[], float] | None = None,
        time_source: Callable[[], float] = time.monotonic,
    ) -> None:
        """``idle_poll_s`` None, or no ``last_work_s``: every ``poll_s``, work or not.
        ``last_work_s`` gives times of ``time_source``."""
        idle_poll_s = poll_s if idle_poll_s is None else idle_poll_s
        if poll_s <= 0 or deliver_s < 0 or idle_poll_s < poll_s or idle_after_s < 0:
            raise ValueError(
                "poll_s must be > 0, deliver_s >= 0, idle_poll_s >= poll_s and "
                f"idle_after_s >= 0, got {poll_s}, {deliver_s}, {idle_poll_s}, {idle_after_s}"
            )
        self.counter = EnergyCounter(device.energy_j, time_source, device.gpu_busy_s)
        self.poll_s = poll_s
        self.deliver_s = deliver_s
        self.idle_poll_s = idle_poll_s
        self.idle_after_s = idle_after_s
        self._last_work_s = last_work_s
        self._now = time_source
        self._on_reading = on_reading
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.readings = 0
        self.errors = 0

    def start(self) -> None:
        """Start reading, handing values to the running event loop."""
        loop = asyncio.get_running_loop()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(loop,), name="energy-reader", daemon=True
        )
        self._thread.start()

    async def stop(self) -> None:
        """Stop reading; values read and not yet handed over are dropped."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        await asyncio.to_thread(thread.join)

    def next_wait_s(self) -> float:
        """How long to wait before the next read: ``poll_s``, or ``idle_poll_s`` once the
        scheduler has had no work for ``idle_after_s``."""
        if self._last_work_s is None:
            return self.poll_s
        idle_s = self._now() - self._last_work_s()
        return self.poll_s if idle_s < self.idle_after_s else self.idle_poll_s

    def _deliver(self, batch: list[tuple[EnergyReading, float | None]]) -> None:
        if self._thread is None:
            return  # stopped meanwhile
        for reading, update_interval_s in batch:
            self.readings += 1
            self._on_reading(reading, update_interval_s)

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        last: EnergyReading | None = None
        batch: list[tuple[EnergyReading, float | None]] = []
        delivered_s = time.monotonic()
        wait_s = self.poll_s
        while not self._stop.wait(wait_s):
            wait_s = self.next_wait_s()
            try:
                reading = self.counter.read()
            except DeviceError as err:
                self.errors += 1
                if self.errors == 1:
                    log.warning("cannot read the GPU's energy counter (%s); retrying", err)
                wait_s = max(1.0, self.poll_s)
                continue
            if reading != last:
                last = reading
                batch.append((reading, self.counter.update_interval_s))
            now_s = time.monotonic()
            if batch and now_s - delivered_s >= self.deliver_s:
                try:
                    loop.call_soon_threadsafe(self._deliver, batch)
                except RuntimeError:  # the loop closed under us
                    return
                batch = []
                delivered_s = now_s


class LearningCollector(Collector):
    """At scrape time, per GPU and model: the table's error on what was measured since the last
    refit, the samples measured, the refits; the same of the energy fit, and its windows (one
    family of each over every GPU's learner)."""

    def __init__(self, learner: OnlineTables, gpu: str, model_label: Callable[[str], str]):
        self.learners: list[tuple[str, OnlineTables]] = [(gpu, learner)]
        self.model_label = model_label

    def add(self, learner: OnlineTables, gpu: str) -> None:
        """Export another GPU's learner too."""
        self.learners.append((gpu, learner))

    def collect(self) -> Iterator[Metric]:
        error = GaugeMetricFamily(
            "sidecar_table_error_ratio",
            "Median |measured / predicted - 1| of the execution times measured since the last "
            "refit, against the table in force when each was measured.",
            labels=["gpu", "model"],
        )
        samples = CounterMetricFamily(
            "sidecar_table_samples",
            "Isolated executions measured for the online table fit.",
            labels=["gpu", "model"],
        )
        refits = CounterMetricFamily(
            "sidecar_table_refits", "Online refits that changed the table.", labels=["gpu", "model"]
        )
        for gpu, learner in self.learners:
            errors: dict[str, float] = {}
            counts: dict[str, tuple[int, int]] = {}
            for model in learner.models:
                label = self.model_label(model)  # bounded: two models may share one
                value = learner.error(model)
                if value is not None:
                    errors[label] = max(value, errors.get(label, 0.0))
                n, r = counts.get(label, (0, 0))
                counts[label] = (n + learner.samples_total(model), r + learner.refits(model))
            for label, value in sorted(errors.items()):
                error.add_metric([gpu, label], value)
            for label, (n, r) in sorted(counts.items()):
                samples.add_metric([gpu, label], n)
                refits.add_metric([gpu, label], r)
        yield from (error, samples, refits)
        if any(learner.energy is not None for _, learner in self.learners):
            yield from self._energy()

    def _energy(self) -> Iterator[Metric]:
        error = GaugeMetricFamily(
            "sidecar_table_energy_error_ratio",
            "Median |measured / predicted - 1| of the energy of the clock windows the model kept "
            "busy, measured since the last energy refit, against the table in force.",
            labels=["gpu", "model"],
        )
        refits = CounterMetricFamily(
            "sidecar_table_energy_refits",
            "Online refits of the model's energy per inference from the GPU's energy counter.",
            labels=["gpu", "model"],
        )
        attributed = CounterMetricFamily(
            "sidecar_energy_attributed_seconds",
            "Time of the GPU's energy counter attributed to clock windows (kept), or not (dropped: "
            "under a clock the sidecar did not set).",
            labels=["gpu", "outcome"],
        )
        host = GaugeMetricFamily(
            "sidecar_energy_host_seconds",
            "The host's part of each execution's time at Triton (the GPU idle through it), "
            "measured from the GPU's busy time at the last energy refit; absent where the GPU "
            "does not report its busy time.",
            labels=["gpu", "model"],
        )
        probes = CounterMetricFamily(
            "sidecar_energy_probes",
            "Times the energy floor was lowered for a while to measure a clock under it.",
            labels=["gpu"],
        )
        for gpu, learner in self.learners:
            energy = learner.energy
            if energy is None:
                continue
            errors: dict[str, float] = {}
            counts: dict[str, int] = {}
            for model in energy.models:
                label = self.model_label(model)
                value = energy.error(model)
                if value is not None:
                    errors[label] = max(value, errors.get(label, 0.0))
                counts[label] = counts.get(label, 0) + energy.refits(model)
            for label, value in sorted(errors.items()):
                error.add_metric([gpu, label], value)
            for label, count in sorted(counts.items()):
                refits.add_metric([gpu, label], count)
            hosts: dict[str, float] = {}
            for model, host_s in energy.host_s.items():
                label = self.model_label(model)
                hosts[label] = max(host_s, hosts.get(label, 0.0))
            for label, host_s in sorted(hosts.items()):
                host.add_metric([gpu, label], host_s)
            attributed.add_metric([gpu, "kept"], energy.attribution.kept_s)
            attributed.add_metric([gpu, "dropped"], energy.attribution.dropped_s)
            probes.add_metric([gpu], energy.probes)
        yield from (error, refits, host, attributed, probes)
