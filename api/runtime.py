"""Everything the gateway holds while it runs, opened in order and closed in reverse."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from pathlib import Path
from typing import Any

from api.config import GatewayConfig
from api.dispatcher import GpuDispatcher, Job
from api.embedded import EMULATED, NOOP, EmbeddedTriton
from api.embedded_llm import SIMLLM, engine_prior
from api.learning import LearnedTableSaver, LearningCollector, learned_path, load_learned
from api.metrics import GatewayMetrics
from api.models import ModelIndex
from api.tenants import Tenants
from api.upstream import Upstream
from api.watch import TritonWatch
from dvfs.device import Device
from dvfs.factory import default_device_spec, open_device, parse_device_spec
from dvfs.llm_profiles import LLM_GPUS
from dvfs.lockrecord import GpuLockRecord
from dvfs.profiles import get_profile
from dvfs.readonly import ReadOnlyDevice
from scheduler.core import Scheduler
from scheduler.policies import ClockPolicy
from scheduler.view import ModelServing
from time2clock.fit import fit_model_table
from time2clock.online import OnlineTables
from time2clock.profile import TritonMeasurer, select_clocks, sweep
from time2clock.table import TableError, TableSet

log = logging.getLogger(__name__)
# A decoupled model's engine batches on its own: as many sequences as vLLM runs by default
# (max_num_seqs); the token policy may hold fewer.
ENGINE_SEQUENCES = 256
TABLES_VERSION = 2  # in the cache's file names: a new table format never reads an old cache


def serving_from_config(config: dict[str, Any]) -> ModelServing:
    """How Triton serves a model, from its ``/v2/models/{m}/config``: batches of up to
    ``max_batch_size`` when its dynamic batcher is on (else Triton runs requests one by one),
    on as many instances as its instance groups count."""
    instances = sum(int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1
    if config.get("model_transaction_policy", {}).get("decoupled"):
        return ModelServing(streams=ENGINE_SEQUENCES)
    batching = "dynamic_batching" in config and int(config.get("max_batch_size", 0)) > 0
    return ModelServing(
        max_batch=int(config["max_batch_size"]) if batching else 1, instances=max(1, instances)
    )


class Runtime:
    """Device, Triton (embedded or not), table, scheduler, dispatcher."""

    def __init__(self, config: GatewayConfig, metrics: GatewayMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.device: Device | None = None
        self.embedded: EmbeddedTriton | None = None
        self.upstream: Upstream | None = None
        self.openai: Upstream | None = None  # an OpenAI-compatible engine, when configured
        self.dispatcher: GpuDispatcher | None = None
        self.models = ModelIndex(lambda: self.upstream, on_config=self._model_config)
        metrics.model_label = self.models.label
        self.watch: TritonWatch | None = None
        self.lock: GpuLockRecord | None = None
        self.tenants = None if config.tenants is None else Tenants.load(config.tenants)
        self.draining = False
        self.pending: set[asyncio.Future[Any]] = set()  # inference requests being handled
        self.gpu = "0"
        self.gpu_name = ""
        self.learner: OnlineTables | None = None
        self.saver: LearnedTableSaver | None = None
        self.learned_models: list[str] = []  # loaded from the learned file at start
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    async def start(self) -> None:
        try:
            tables = await asyncio.to_thread(self._open_blocking)
            assert self.device is not None
            self.upstream = Upstream(
                self.triton_url, max_connections=self.config.scheduler.max_inflight + 16
            )
            await self.upstream.open()
            if self.config.openai_url is not None:
                self.openai = Upstream(
                    self.config.openai_url, max_connections=self.config.scheduler.max_inflight + 16
                )
                await self.openai.open()
            self.watch = TritonWatch(
                self.upstream,
                embedded=self.embedded,
                on_restart=self._triton_restarted,
                probe_interval_s=self.config.probe_interval_s,
                liveness_grace_s=self.config.liveness_grace_s,
            )
            policy = self.build_policy()
            if self.learning:
                self.learner = OnlineTables(
                    self.device.supported_clocks_mhz(), gpu=tables.gpu or self.gpu_name
                )
            scheduler: Scheduler[Job] = Scheduler(
                tables, policy, self.config.scheduler, learner=self.learner
            )
            self.dispatcher = GpuDispatcher(
                gpu=self.gpu,
                scheduler=scheduler,
                device=self.device,
                upstream=self.upstream,
                metrics=self.metrics,
                shadow=self.config.shadow,
            )
            self.metrics.watch_device(self.device, self.gpu)
            self.metrics.default_slo.set(self.config.slo_ms / 1000.0)
            self.dispatcher.start()
            if self.learner is not None:
                self.metrics.registry.register(
                    LearningCollector(self.learner, self.gpu, self.metrics.model_label)
                )
                self.saver = LearnedTableSaver(
                    self.learner,
                    lambda: scheduler.tables,
                    self.learned_path,
                    keep=self.learned_models,
                )
                self.saver.start()
            self.watch.start()
            for model in tables.models:  # how each profiled model batches, before any request
                await self.models.limits(model)
        except BaseException:
            await self.stop()
            raise

    def build_policy(self, name: str | None = None) -> ClockPolicy:
        """The configured policy (or ``name``, with the configured parameters) for this GPU;
        ``tokens`` gets the embedded engine's profile."""
        assert self.device is not None
        engine = engine_prior(self.gpu_name) if self.embedded is not None else None
        return self.config.policy.build(self.device.supported_clocks_mhz(), name, engine)

    @property
    def learning(self) -> bool:
        """Whether the tables learn from live traffic (never in shadow mode: the clock the
        policy decides is not the one the GPU runs)."""
        return self.config.learn and not self.config.shadow

    @property
    def learned_path(self) -> Path:
        return learned_path(self.config.state_dir, self.gpu_name, TABLES_VERSION)

    @property
    def triton_url(self) -> str:
        if self.embedded is not None:
            return self.embedded.url
        assert self.config.triton_url is not None
        return self.config.triton_url

    @property
    def triton_grpc_url(self) -> str:
        """Triton's gRPC: the embedded one's, the one configured, or Triton's convention (the
        HTTP port + 1, as 8000/8001)."""
        if self.embedded is not None:
            return self.embedded.ports.grpc_url
        if self.config.triton_grpc_url is not None:
            return self.config.triton_grpc_url
        host, _, port = self.triton_url.removeprefix("http://").rpartition(":")
        return f"{host}:{int(port) + 1}"

    def _open_blocking(self) -> TableSet:
        """Open the device, start the embedded Triton (if any), load or profile the tables."""
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
        if cfg.shadow:  # no write can reach the GPU, whatever asks for one; it locks nothing
            self.device = ReadOnlyDevice(self.device)
        else:
            self.lock = GpuLockRecord(cfg.state_dir, self.device)
            self.lock.acquire(
                None if self._tmp is None else Path(self._tmp.name), exclusive=kind != "sim"
            )
        if cfg.embedded:
            assert state_path is not None
            self.embedded = EmbeddedTriton(state_path)
            self.embedded.start()
            self.models.known.update((*EMULATED, NOOP))
            if arg in LLM_GPUS:
                self.models.known.add(SIMLLM)
        gpu_name = self.gpu_name = arg if kind == "sim" else self.device.identity.name
        learned = load_learned(self.learned_path) if self.learning else TableSet()
        self.learned_models = learned.models
        if cfg.table:
            return _prefer(TableSet.load_many(cfg.table), learned)
        if cfg.embedded:
            return _prefer(self._profile_embedded(gpu_name, skip=set(learned.models)), learned)
        if len(learned):
            return learned
        if cfg.policy.name in ("seed", "slack", "adaptive"):
            log.warning(
                "no --table: every model runs at the top clock until it has one; profile them "
                "with `python -m time2clock profile --device nvml:0 --triton-url HOST:PORT "
                "--model M [--model M2 ...]` and pass --table out/profile/table.json"
            )
        return TableSet()

    def _profile_embedded(self, gpu_name: str, skip: set[str] | None = None) -> TableSet:
        """Each emulated model's table: from the cache, or profiled through Triton and cached
        (not the models in ``skip``: they have a learned table)."""
        cfg = self.config
        tables = TableSet()
        unknown = sorted(set(cfg.profile_models) - set(EMULATED))
        if unknown:
            raise ValueError(
                f"--profile-models: no embedded model {', '.join(unknown)}; "
                f"known: {', '.join(EMULATED)}"
            )
        for name in cfg.profile_models:
            if name in (skip or ()):
                continue
            cache = cfg.state_dir / "tables" / f"{gpu_name}-{name}-v{TABLES_VERSION}.json"
            with contextlib.suppress(TableError, OSError):
                tables.add(next(iter(TableSet.load(cache))))
                log.info("using the cached time2clock table %s", cache)
                continue
            if cfg.shadow:
                raise ValueError(
                    "shadow mode never sets a clock, so it cannot profile one: pass --table, "
                    f"or run once without --shadow to profile and cache {cache}"
                )
            assert self.device is not None and self.embedded is not None
            model = get_profile(gpu_name).model(EMULATED[name])
            batches = sorted({1, max(1, model.max_batch // 4), model.max_batch})
            log.info(
                "profiling %s on %s (%d clocks × batches %s × %d requests; cached after)...",
                name,
                self.device.identity.name,
                cfg.profile_clocks,
                batches,
                cfg.profile_requests,
            )
            clocks = select_clocks(self.device.supported_clocks_mhz(), cfg.profile_clocks)
            result = sweep(
                self.device,
                TritonMeasurer(self.embedded.url, name),
                clocks,
                batches=batches,
                requests_per_clock=cfg.profile_requests,
                concurrency=1,
            )
            table = fit_model_table(
                result.samples,
                gpu=gpu_name,
                model=name,
                concurrency=1,
                energy_j=result.energy_per_inference_j,
            )
            cache.parent.mkdir(parents=True, exist_ok=True)
            TableSet([table]).save(cache)
            log.info("cached the time2clock table at %s", cache)
            tables.add(table)
        return tables

    async def model_exists(self, model: str) -> bool:
        """Whether Triton serves ``model``; the first time, also its config (the bounds of its
        inputs, and its batching, which the scheduler needs)."""
        if not await self.models.exists(model):
            return False
        await self.models.limits(model)
        return True

    def _model_config(self, model: str, config: dict[str, Any]) -> None:
        """Triton's config of ``model``, read once: tell the scheduler how it batches."""
        if self.dispatcher is None:
            return
        try:
            serving = serving_from_config(config)
        except (ValueError, KeyError, TypeError) as err:
            log.warning("could not read %s's batching from its config (%s); batch 1", model, err)
            serving = ModelServing()
        self.dispatcher.set_serving(model, serving)
        log.info(
            "model %s: batches of up to %d on %d instance(s)",
            model,
            serving.max_batch,
            serving.instances,
        )

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
        if self.saver is not None:
            await self.saver.stop()
        if self.upstream is not None:
            await self.upstream.close()
        if self.openai is not None:
            await self.openai.close()
        await asyncio.to_thread(self._close_blocking)

    def _close_blocking(self) -> None:
        if self.device is not None:
            if not self.config.shadow:
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


def _prefer(tables: TableSet, learned: TableSet) -> TableSet:
    """``tables`` with each model that has a learned table taking that one instead."""
    merged = TableSet(list(tables))
    for table in learned:
        merged.add(table)
    return merged
