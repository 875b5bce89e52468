"""Everything the gateway holds while it runs, opened in order and closed in reverse."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from pathlib import Path
from typing import Any

from api.config import GatewayConfig
from api.dispatcher import GpuDispatcher
from api.embedded import NOOP, SIMNET, EmbeddedTriton
from api.metrics import GatewayMetrics
from api.models import ModelIndex
from api.tenants import Tenants
from api.upstream import Upstream
from api.watch import TritonWatch
from dvfs.device import Device
from dvfs.factory import default_device_spec, open_device, parse_device_spec
from dvfs.lockrecord import GpuLockRecord
from scheduler.core import Scheduler, SchedulerConfig
from scheduler.policies import make_policy
from time2clock.fit import fit_table
from time2clock.profile import TritonMeasurer, select_clocks, sweep
from time2clock.table import ClockPoint, InverseLinearFit, TableError, Time2ClockTable

log = logging.getLogger(__name__)


def placeholder_table(clocks_mhz: list[int], latency_ms: float) -> Time2ClockTable:
    """A flat table for ``max``/``default`` without a profile: it only seeds CFS's charges
    (each completion corrects them with the real time); clock choices never read it."""
    fit = InverseLinearFit(0.0, 1.0 / latency_ms, 0.0)
    points = tuple(ClockPoint(c, 0, latency_ms, 0, 0, 0, 0, 0, 0) for c in clocks_mhz)
    return Time2ClockTable("unprofiled", "any", 0.0, 2, fit, points)


class Runtime:
    """Device, Triton (embedded or not), table, scheduler, dispatcher."""

    def __init__(self, config: GatewayConfig, metrics: GatewayMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.device: Device | None = None
        self.embedded: EmbeddedTriton | None = None
        self.upstream: Upstream | None = None
        self.dispatcher: GpuDispatcher | None = None
        self.table: Time2ClockTable | None = None
        self.models = ModelIndex(lambda: self.upstream)
        metrics.model_label = self.models.label
        self.watch: TritonWatch | None = None
        self.lock: GpuLockRecord | None = None
        self.tenants = None if config.tenants is None else Tenants.load(config.tenants)
        self.draining = False
        self.pending: set[asyncio.Future[Any]] = set()  # inference requests being handled
        self.gpu = "0"
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    async def start(self) -> None:
        try:
            await asyncio.to_thread(self._open_blocking)
            assert self.device is not None and self.table is not None
            self.upstream = Upstream(
                self.triton_url, max_connections=4 * self.config.max_inflight + 16
            )
            await self.upstream.open()
            self.watch = TritonWatch(
                self.upstream,
                embedded=self.embedded,
                on_restart=self._triton_restarted,
                probe_interval_s=self.config.probe_interval_s,
                liveness_grace_s=self.config.liveness_grace_s,
            )
            policy = make_policy(self.config.policy, self.table, self.device.supported_clocks_mhz())
            scheduler = Scheduler(
                self.table,
                policy,
                SchedulerConfig(
                    max_inflight=self.config.max_inflight,
                    max_queue=self.config.max_queue,
                    priority_levels=self.config.priority_levels,
                    default_slo_ms=self.config.slo_ms,
                ),
            )
            self.dispatcher = GpuDispatcher(
                gpu=self.gpu,
                scheduler=scheduler,
                device=self.device,
                upstream=self.upstream,
                metrics=self.metrics,
            )
            self.metrics.watch_device(self.device, self.gpu)
            self.metrics.default_slo.set(self.config.slo_ms / 1000.0)
            self.dispatcher.start()
            self.watch.start()
        except BaseException:
            await self.stop()
            raise

    @property
    def triton_url(self) -> str:
        if self.embedded is not None:
            return self.embedded.url
        assert self.config.triton_url is not None
        return self.config.triton_url

    def _open_blocking(self) -> None:
        cfg = self.config
        spec = cfg.device or default_device_spec()
        kind, arg = parse_device_spec(spec)
        if cfg.embedded and kind != "sim":
            raise ValueError(
                "the embedded default emulates its GPU: use --device sim:<profile>, "
                "or point --triton-url at a Triton running on the real GPU"
            )
        state_path = None
        if kind == "sim":
            self._tmp = tempfile.TemporaryDirectory(prefix="sidecar-")
            state_path = Path(self._tmp.name) / f"gpu{self.gpu}.state"
        self.device = open_device(spec, state_path=state_path)
        self.lock = GpuLockRecord(cfg.state_dir, self.device)
        self.lock.acquire(
            None if self._tmp is None else Path(self._tmp.name), exclusive=kind != "sim"
        )
        if cfg.embedded:
            assert state_path is not None
            self.embedded = EmbeddedTriton(state_path)
            self.embedded.start()
            self.models.known.update((SIMNET, NOOP))
        self.table = self._table(arg if kind == "sim" else self.device.identity.name)

    def _table(self, gpu_name: str) -> Time2ClockTable:
        cfg = self.config
        assert self.device is not None
        if cfg.table is not None:
            return Time2ClockTable.load(cfg.table)
        if cfg.embedded:
            cache = cfg.state_dir / "tables" / f"{gpu_name}-{SIMNET}.json"
            with contextlib.suppress(TableError, OSError):
                table = Time2ClockTable.load(cache)
                log.info("using the cached time2clock table %s", cache)
                return table
            log.info(
                "profiling %s on the simulated %s (%d clocks × %d requests)...",
                SIMNET,
                gpu_name,
                cfg.profile_clocks,
                cfg.profile_requests,
            )
            assert self.embedded is not None
            clocks = select_clocks(self.device.supported_clocks_mhz(), cfg.profile_clocks)
            result = sweep(
                self.device,
                TritonMeasurer(self.embedded.url, SIMNET),
                clocks,
                requests_per_clock=cfg.profile_requests,
                concurrency=2,
            )
            table = fit_table(
                result.samples,
                gpu=gpu_name,
                model=SIMNET,
                concurrency=2,
                energy_j=result.energy_per_inference_j,
            )
            cache.parent.mkdir(parents=True, exist_ok=True)
            table.save(cache)
            log.info("cached the time2clock table at %s (R² %.3f)", cache, table.r2)
            return table
        if cfg.policy in ("seed", "slack"):
            raise ValueError(
                f"policy {cfg.policy!r} needs a time2clock table for this GPU and model: "
                "profile it with `python -m time2clock profile --device nvml:0 "
                "--triton-url HOST:PORT --model M` and pass --table out/profile/table.json"
            )
        return placeholder_table(self.device.supported_clocks_mhz(), cfg.slo_ms / 4)

    async def _triton_restarted(self) -> None:
        self.models.forget()

    @property
    def triton_up(self) -> bool:
        return self.watch is None or self.watch.up

    async def stop(self) -> None:
        if self.watch is not None:
            await self.watch.stop()
        if self.dispatcher is not None:
            await self.dispatcher.stop()
        if self.upstream is not None:
            await self.upstream.close()
        await asyncio.to_thread(self._close_blocking)

    def _close_blocking(self) -> None:
        if self.device is not None:
            try:
                self.device.reset()
            except Exception:
                log.exception("could not give the GPU clock back")
            else:
                if self.lock is not None:
                    self.lock.release()
            self.device.close()
            self.device = None
        if self.embedded is not None:
            self.embedded.close(timeout_s=3.0)
            self.embedded = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
