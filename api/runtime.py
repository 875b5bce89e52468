"""Everything the gateway holds while it runs, opened in order and closed in reverse.

One sidecar drives every GPU of its node (``--device nvml:0,1,2,3``): each GPU has its own
:class:`Gpu` (device, Triton, upstream, dispatcher with its queue and clock policy, watch,
lock record, learned tables), the queues share one ledger of virtual runtimes (shares are
counted over the node), and :meth:`Runtime.place` picks the GPU of each request
(:mod:`scheduler.placement`). With one GPU everything is as it always was.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from api.config import GatewayConfig
from api.dispatcher import GpuDispatcher, Job
from api.embedded import EMULATED, NOOP, EmbeddedTriton
from api.embedded_llm import SIMLLM, engine_prior
from api.learning import (
    EnergyReader,
    LearnedTableSaver,
    LearningCollector,
    learned_path,
    load_learned,
)
from api.looplag import LoopLagProbe
from api.metrics import GatewayMetrics
from api.models import ModelIndex
from api.tenants import Tenants
from api.upstream import Upstream
from api.watch import TritonWatch
from dvfs.device import Device
from dvfs.errors import DeviceError
from dvfs.factory import default_device_spec, open_device, parse_device_list, parse_device_spec
from dvfs.llm_profiles import LLM_GPUS
from dvfs.lockrecord import GpuLockRecord
from dvfs.profiles import get_profile
from dvfs.readonly import ReadOnlyDevice
from scheduler.config import TOKENS
from scheduler.core import Scheduler
from scheduler.placement import Placer
from scheduler.policies import ClockPolicy
from scheduler.queue import VruntimeLedger
from scheduler.request import Request
from scheduler.tokens import EnginePrior
from scheduler.view import ModelServing
from time2clock.engine import check_clocks, load_engine_profile
from time2clock.fit import fit_model_table
from time2clock.online import OnlineTables
from time2clock.online_energy import EnergyParams
from time2clock.profile import TritonMeasurer, select_clocks, sweep
from time2clock.table import TableError, TableSet

log = logging.getLogger(__name__)
# A decoupled model's engine batches on its own: as many sequences as vLLM runs by default
# (max_num_seqs); the token policy may hold fewer.
ENGINE_SEQUENCES = 256
# In the cache's file names: a new table format, or a new fit of the same samples, never reads an
# old cache (3: tail margins from the spread around each clock's own mean, not around the fit).
TABLES_VERSION = 3


def serving_from_config(config: dict[str, Any]) -> ModelServing:
    """How Triton serves a model, from its ``/v2/models/{m}/config``: batches of up to
    ``max_batch_size`` when its dynamic batcher is on (else Triton runs requests one by one),
    on as many instances as its instance groups count, with its batcher's priority levels."""
    instances = sum(int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1
    if config.get("model_transaction_policy", {}).get("decoupled"):
        return ModelServing(streams=ENGINE_SEQUENCES)
    batching = "dynamic_batching" in config and int(config.get("max_batch_size", 0)) > 0
    # priority: the batcher's priority levels, where the sidecar's level is sent (docs/priority.md)
    batcher = config.get("dynamic_batching") or {}
    levels = int(batcher.get("priority_levels", 0)) if batching else 0
    default_level = int(batcher.get("default_priority_level", 0)) if levels else 0
    return ModelServing(
        max_batch=int(config["max_batch_size"]) if batching else 1,
        instances=max(1, instances),
        priority_levels=levels,
        default_priority_level=default_level,
    )


@dataclass(eq=False)
class Gpu:
    """One GPU of the node and everything the sidecar holds for it."""

    index: str  # its label (``gpu`` in metrics and the admin state): 0, 1, ... in --device order
    spec: str  # its device spec (sim:v100, nvml:2)
    triton_url: str | None = None  # configured (None: the embedded one's)
    triton_grpc_url: str | None = None
    device: Device | None = None
    embedded: EmbeddedTriton | None = None
    upstream: Upstream | None = None
    dispatcher: GpuDispatcher | None = None
    watch: TritonWatch | None = None
    lock: GpuLockRecord | None = None
    learner: OnlineTables | None = None
    saver: LearnedTableSaver | None = None
    energy_reader: EnergyReader | None = None
    learned_models: list[str] = field(default_factory=list)  # loaded from its learned file
    # the tables given or profiled, which the learned ones move from (time2clock.online)
    reference: TableSet = field(default_factory=TableSet)
    name: str = ""  # the profile (simulated) or the GPU's name, for tables
    learned_key: str = ""  # what its learned tables are filed under
    idle_w: float | None = None  # board power with nothing to do, for energy placement
    engine_profile: Path | None = None  # its LLM engine's profile, measured at start

    @property
    def url(self) -> str:
        """Its Triton's HTTP endpoint."""
        if self.embedded is not None:
            return self.embedded.url
        assert self.triton_url is not None
        return self.triton_url

    @property
    def grpc_url(self) -> str:
        """Its Triton's gRPC: the embedded one's, the one configured, or Triton's convention
        (the HTTP port + 1, as 8000/8001)."""
        if self.embedded is not None:
            return self.embedded.ports.grpc_url
        if self.triton_grpc_url is not None:
            return self.triton_grpc_url
        host, _, port = self.url.removeprefix("http://").rpartition(":")
        return f"{host}:{int(port) + 1}"

    @property
    def up(self) -> bool:
        return self.watch is None or self.watch.up


class Runtime:
    """Every GPU's device, Triton (embedded or not), tables, scheduler and dispatcher; the
    placement of requests across them."""

    def __init__(self, config: GatewayConfig, metrics: GatewayMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.gpus: list[Gpu] = []
        self.openai: Upstream | None = None  # an OpenAI-compatible engine, when configured
        self.models = ModelIndex(self.upstream_up, on_config=self._model_config)
        metrics.model_label = self.models.label
        self.tenants = None if config.tenants is None else Tenants.load(config.tenants)
        self.draining = False
        self.pending: set[asyncio.Future[Any]] = set()  # inference requests being handled
        self.ledger = VruntimeLedger()  # virtual runtimes, shared by every GPU's queue
        self.placer = Placer(config.placement, default_slo_ms=config.slo_ms)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._learning_collector: LearningCollector | None = None
        self.loop_lag = LoopLagProbe(metrics.loop_lag)

    # -- GPU 0, as a runtime of one GPU has always exposed it ---------------------------

    def _first(self) -> Gpu:
        """GPU 0; before the start, as the configuration describes it."""
        if not self.gpus:
            cfg = self.config
            spec = parse_device_list(cfg.device)[0] if cfg.device else "sim:v100"
            url = cfg.triton_urls[0] if cfg.triton_urls else None
            grpc = cfg.triton_grpc_urls[0] if cfg.triton_grpc_urls else None
            self.gpus.append(Gpu("0", spec, triton_url=url, triton_grpc_url=grpc))
        return self.gpus[0]

    @property
    def dispatcher(self) -> GpuDispatcher | None:
        """GPU 0's dispatcher (None until started); :attr:`dispatchers` has every GPU's."""
        return self.gpus[0].dispatcher if self.gpus else None

    @dispatcher.setter
    def dispatcher(self, value: GpuDispatcher | None) -> None:
        self._first().dispatcher = value

    @property
    def device(self) -> Device | None:
        return self.gpus[0].device if self.gpus else None

    @device.setter
    def device(self, value: Device | None) -> None:
        self._first().device = value

    @property
    def watch(self) -> TritonWatch | None:
        return self.gpus[0].watch if self.gpus else None

    @watch.setter
    def watch(self, value: TritonWatch | None) -> None:
        self._first().watch = value

    @property
    def upstream(self) -> Upstream | None:
        return self.gpus[0].upstream if self.gpus else None

    @upstream.setter
    def upstream(self, value: Upstream | None) -> None:
        self._first().upstream = value

    @property
    def embedded(self) -> EmbeddedTriton | None:
        return self.gpus[0].embedded if self.gpus else None

    @property
    def learner(self) -> OnlineTables | None:
        return self.gpus[0].learner if self.gpus else None

    @property
    def gpu(self) -> str:
        return self.gpus[0].index if self.gpus else "0"

    @property
    def gpu_name(self) -> str:
        return self.gpus[0].name if self.gpus else ""

    @property
    def dispatchers(self) -> list[GpuDispatcher]:
        """Every GPU's dispatcher, in GPU order."""
        return [g.dispatcher for g in self.gpus if g.dispatcher is not None]

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            tables = await asyncio.to_thread(self._open_blocking)
            if self.config.openai_url is not None:
                self.openai = Upstream(
                    self.config.openai_url, max_connections=self.config.scheduler.max_inflight + 16
                )
                await self.openai.open()
            for gpu, gpu_tables in zip(self.gpus, tables, strict=True):
                await self._start_gpu(gpu, gpu_tables)
            self.placer.idle_w = [g.idle_w for g in self.gpus]
            self.metrics.set_placement(self.config.placement.mode, len(self.gpus))
            self.loop_lag.start()
            self.metrics.default_slo.set(self.config.slo_ms / 1000.0)
            for model in {m for t in tables for m in t.models}:  # how each profiled model
                await self.models.limits(model)  # batches, before any request
        except BaseException:
            await self.stop()
            raise

    async def _start_gpu(self, gpu: Gpu, tables: TableSet) -> None:
        assert gpu.device is not None
        gpu.upstream = Upstream(gpu.url, max_connections=self.config.scheduler.max_inflight + 16)
        await gpu.upstream.open()
        gpu.watch = TritonWatch(
            gpu.upstream,
            embedded=gpu.embedded,
            on_restart=self._triton_restarted,
            probe_interval_s=self.config.probe_interval_s,
            liveness_grace_s=self.config.liveness_grace_s,
        )
        clocks = gpu.device.supported_clocks_mhz()
        if self.config.profile_engine is not None:
            gpu.engine_profile = await self._profile_engine(gpu, self.config.profile_engine)
        if self.config.engine_profile is not None:
            self._engine_prior(gpu)  # a file it cannot use stops the start, whatever the policy
        policy = self.build_policy(gpu=gpu)
        if self.learning:
            gpu.learner = OnlineTables(
                clocks,
                gpu=tables.gpu or gpu.name,
                base=gpu.reference,
                energy_params=EnergyParams(probe=self.config.learn_energy_probe),
            )
        scheduler: Scheduler[Job] = Scheduler(
            tables, policy, self.config.scheduler, learner=gpu.learner, ledger=self.ledger
        )
        gpu.dispatcher = GpuDispatcher(
            gpu=gpu.index,
            scheduler=scheduler,
            device=gpu.device,
            upstream=gpu.upstream,
            metrics=self.metrics,
            shadow=self.config.shadow,
        )
        self.metrics.watch_device(gpu.device, gpu.index)
        gpu.dispatcher.start()
        if gpu.learner is not None:
            if self._learning_collector is None:
                self._learning_collector = LearningCollector(
                    gpu.learner, gpu.index, self.metrics.model_label
                )
                self.metrics.registry.register(self._learning_collector)
            else:
                self._learning_collector.add(gpu.learner, gpu.index)
            gpu.saver = LearnedTableSaver(
                gpu.learner,
                lambda: scheduler.tables,
                self.learned_path_of(gpu),
                keep=gpu.learned_models,
            )
            gpu.saver.start()
            if gpu.learner.energy is not None:  # energy that learns: read the counter
                params = gpu.learner.energy.params
                gpu.energy_reader = EnergyReader(
                    gpu.device,
                    scheduler.on_energy,
                    poll_s=params.poll_s,
                    idle_poll_s=params.idle_poll_s,
                    idle_after_s=params.idle_after_s,
                    last_work_s=functools.partial(_last_work_s, scheduler),
                )
                gpu.energy_reader.start()
        gpu.watch.start()

    def build_policy(self, name: str | None = None, gpu: Gpu | None = None) -> ClockPolicy:
        """The configured policy (or ``name``, with the configured parameters) for ``gpu``
        (default GPU 0); ``tokens`` gets the engine's profile (:meth:`_engine_prior`)."""
        gpu = gpu or self._first()
        assert gpu.device is not None
        engine = self._engine_prior(gpu) if (name or self.config.policy.name) == TOKENS else None
        config = self.config.policy
        if config.feedback.idle_power_w is None and gpu.idle_w is not None:
            # adaptive's energy floor counts what a request adds above the GPU's idle power
            config = replace(config, feedback=replace(config.feedback, idle_power_w=gpu.idle_w))
        return config.build(gpu.device.supported_clocks_mhz(), name, engine)

    async def _profile_engine(self, gpu: Gpu, model: str) -> Path:
        """``--profile-engine``: the engine's profile on ``gpu``, cached in the state directory
        or measured now, before the GPU serves (:mod:`api.engine_start`)."""
        from api.engine_start import cached_path, engine_profile_at_start, engine_target

        assert gpu.device is not None
        cfg = self.config
        first = self._first()
        if (
            cfg.openai_url is not None
            and gpu is not first
            and gpu.name != first.name
            and not cached_path(cfg.state_dir, gpu.name, model).exists()
        ):
            # One OpenAI engine for the node runs on one GPU: sweeping another GPU's clock while
            # driving it would measure nothing of that GPU.
            raise ValueError(
                f"--profile-engine with --upstream measures the engine on GPU {first.index} "
                f"({first.name}); GPU {gpu.index} is a {gpu.name}: put a profile made on that "
                f"kind (python -m time2clock profile-engine) at "
                f"{cached_path(cfg.state_dir, gpu.name, model)}, or drive one kind of GPU"
            )
        target = engine_target(model, gpu.url, cfg.openai_url, cfg.profile_engine_body)
        return await engine_profile_at_start(
            gpu.device, gpu.name, target, state_dir=cfg.state_dir, clocks=cfg.profile_clocks
        )

    def _engine_prior(self, gpu: Gpu) -> EnginePrior | None:
        """The LLM engine's profile for ``gpu``: the one ``--profile-engine`` measured or found
        cached at start, or the file ``--engine-profile`` names, read at each build (an admin
        switch to ``tokens`` reads it again), else the embedded engine's;
        EngineProfileError when the file is unusable or of a GPU with other clocks."""
        assert gpu.device is not None
        path = gpu.engine_profile or self.config.engine_profile
        if path is None:
            return engine_prior(gpu.name) if gpu.embedded is not None else None
        prior = load_engine_profile(path)
        check_clocks(prior, gpu.device.supported_clocks_mhz(), str(path))
        return prior

    @property
    def learning(self) -> bool:
        """Whether the tables learn from live traffic (never in shadow mode: the clock the
        policy decides is not the one the GPU runs)."""
        return self.config.learn and not self.config.shadow

    @property
    def learned_path(self) -> Path:
        """GPU 0's learned tables."""
        return self.learned_path_of(self._first())

    def learned_path_of(self, gpu: Gpu) -> Path:
        """Where ``gpu``'s learned tables are kept: by its name alone when the sidecar drives one
        GPU (as always), by name and identity when it drives several (two GPUs of one model
        learn apart)."""
        return learned_path(self.config.state_dir, gpu.learned_key or gpu.name, TABLES_VERSION)

    @property
    def triton_url(self) -> str:
        """GPU 0's Triton (every GPU's: ``gpus[i].url``)."""
        return self._first().url

    @property
    def triton_grpc_url(self) -> str:
        """GPU 0's Triton's gRPC (every GPU's: ``gpus[i].grpc_url``)."""
        return self._first().grpc_url

    def _devices(self) -> list[str]:
        cfg = self.config
        specs = parse_device_list(cfg.device or default_device_spec())
        if cfg.embedded and any(parse_device_spec(s)[0] != "sim" for s in specs):
            raise ValueError(
                "the embedded default emulates its GPU: use --device sim:<profile>, "
                "or point --triton-url at a Triton running on the real GPU"
            )
        return specs

    def _open_blocking(self) -> list[TableSet]:
        """Open every GPU, start the embedded Tritons (if any), load or profile the tables."""
        cfg = self.config
        specs = self._devices()
        none: list[str | None] = [None] * len(specs)
        urls: list[str | None] = list(cfg.triton_urls or none)
        grpc_urls: list[str | None] = list(cfg.triton_grpc_urls or none)
        self.gpus = [
            Gpu(str(i), spec, triton_url=url, triton_grpc_url=grpc)
            for i, (spec, url, grpc) in enumerate(zip(specs, urls, grpc_urls, strict=True))
        ]
        for gpu in self.gpus:
            self._open_gpu(gpu)
        # One after the other: started at once on a small machine, PyTriton's handshake with
        # its model instances timed out (seen on 2 cores).
        for gpu in self.gpus:
            if gpu.embedded is not None:
                gpu.embedded.start()
                self.models.known.update((*EMULATED, NOOP))
        return [self._tables_of(gpu) for gpu in self.gpus]

    def _open_gpu(self, gpu: Gpu) -> None:
        """Open ``gpu``'s device and lock record, and create its embedded Triton (if any)."""
        cfg = self.config
        kind, arg = parse_device_spec(gpu.spec)
        state_path = None
        if kind == "sim":
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="sidecar-")
            state_path = Path(self._tmp.name) / f"gpu{gpu.index}.state"
        device = open_device(gpu.spec, state_path=state_path, index=int(gpu.index))
        gpu.device = device
        if cfg.shadow:  # no write can reach the GPU, whatever asks for one; it locks nothing
            gpu.device = ReadOnlyDevice(device)
        else:
            gpu.lock = GpuLockRecord(cfg.state_dir, device)
            gpu.lock.acquire(
                None if self._tmp is None else Path(self._tmp.name), exclusive=kind != "sim"
            )
        if cfg.embedded:
            assert state_path is not None
            gpu.embedded = EmbeddedTriton(state_path)
        gpu.name = arg if kind == "sim" else device.identity.name
        if cfg.embedded and arg in LLM_GPUS:
            self.models.known.add(SIMLLM)
        if len(parse_device_list(cfg.device or default_device_spec())) > 1:
            gpu.learned_key = f"{gpu.name}-{device.identity.uuid}"
        gpu.idle_w = _idle_power_w(device, kind, arg)

    def _tables_of(self, gpu: Gpu) -> TableSet:
        """``gpu``'s tables: learned, given (--table), profiled through its embedded Triton."""
        cfg = self.config
        learned = load_learned(self.learned_path_of(gpu)) if self.learning else TableSet()
        gpu.learned_models = learned.models
        if cfg.table:
            gpu.reference = TableSet.load_many(cfg.table)
            return _prefer(gpu.reference, learned)
        if cfg.embedded:
            gpu.reference = self._profile_embedded(gpu.name, skip=set(learned.models), gpu=gpu)
            return _prefer(gpu.reference, learned)
        if len(learned):
            return learned
        if gpu is self.gpus[0] and cfg.policy.name in ("seed", "slack", "adaptive"):
            log.warning(
                "no --table: every model runs at the top clock until it has one; profile them "
                "with `python -m time2clock profile --device nvml:0 --triton-url HOST:PORT "
                "--model M [--model M2 ...]` and pass --table out/profile/table.json"
            )
        return TableSet()

    def _profile_embedded(
        self, gpu_name: str, skip: set[str] | None = None, gpu: Gpu | None = None
    ) -> TableSet:
        """Each emulated model's table: from the cache, or profiled through ``gpu``'s Triton
        (default GPU 0) and cached (the models in ``skip``, which have a learned table, only
        from the cache, as their learning's reference). GPUs of one profile share the cache:
        the first profiles, the others read it."""
        cfg = self.config
        gpu = gpu or self._first()
        skip = skip or set()
        tables = TableSet()
        unknown = sorted(set(cfg.profile_models) - set(EMULATED))
        if unknown:
            raise ValueError(
                f"--profile-models: no embedded model {', '.join(unknown)}; "
                f"known: {', '.join(EMULATED)}"
            )
        for name in cfg.profile_models:
            cache = cfg.state_dir / "tables" / f"{gpu_name}-{name}-v{TABLES_VERSION}.json"
            with contextlib.suppress(TableError, OSError):
                tables.add(next(iter(TableSet.load(cache))))
                learned = " (the reference of its learned one)" if name in skip else ""
                log.info("using the cached time2clock table %s%s", cache, learned)
                continue
            if name in skip:
                continue
            if cfg.shadow:
                raise ValueError(
                    "shadow mode never sets a clock, so it cannot profile one: pass --table, "
                    f"or run once without --shadow to profile and cache {cache}"
                )
            assert gpu.device is not None and gpu.embedded is not None
            model = get_profile(gpu_name).model(EMULATED[name])
            batches = sorted({1, max(1, model.max_batch // 4), model.max_batch})
            log.info(
                "profiling %s on %s (%d clocks × batches %s × %d requests; cached after)...",
                name,
                gpu.device.identity.name,
                cfg.profile_clocks,
                batches,
                cfg.profile_requests,
            )
            clocks = select_clocks(gpu.device.supported_clocks_mhz(), cfg.profile_clocks)
            result = sweep(
                gpu.device,
                TritonMeasurer(gpu.embedded.url, name),
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

    # -- requests -----------------------------------------------------------------------

    def place(self, request: Request[Job]) -> GpuDispatcher:
        """The dispatcher of the GPU that takes ``request`` (among those whose Triton is up,
        or all when none is): :mod:`scheduler.placement`, as ``--placement`` says."""
        gpus = [g for g in self.gpus if g.dispatcher is not None]
        if len(gpus) == 1:
            dispatcher = gpus[0].dispatcher
            assert dispatcher is not None
            return dispatcher
        dispatchers = [g.dispatcher for g in gpus if g.dispatcher is not None]
        up = [g.up for g in gpus]
        request.level = dispatchers[0].level_of(request.priority)
        choice = self.placer.place(
            [d.scheduler for d in dispatchers],
            request,
            request.arrival_s,
            available=up if any(up) else None,
        )
        return dispatchers[choice]

    async def model_exists(self, model: str) -> bool:
        """Whether Triton serves ``model``; the first time, also its config (the bounds of its
        inputs, and its batching, which the scheduler needs)."""
        if not await self.models.exists(model):
            return False
        await self.models.limits(model)
        return True

    def upstream_up(self) -> Upstream | None:
        """The first GPU's Triton that is up (each GPU's Triton serves the same models): where
        models are looked up and metadata asked."""
        for gpu in self.gpus:
            if gpu.up and gpu.upstream is not None:
                return gpu.upstream
        return self.upstream

    def _model_config(self, model: str, config: dict[str, Any]) -> None:
        """Triton's config of ``model``, read once: tell every GPU's scheduler how it batches."""
        if not self.dispatchers:
            return
        try:
            serving = serving_from_config(config)
        except (ValueError, KeyError, TypeError) as err:
            log.warning("could not read %s's batching from its config (%s); batch 1", model, err)
            serving = ModelServing()
        for dispatcher in self.dispatchers:
            dispatcher.set_serving(model, serving)
        log.info(
            "model %s: batches of up to %d on %d instance(s), %d priority level(s) at Triton",
            model,
            serving.max_batch,
            serving.instances,
            serving.priority_levels,
        )

    async def _triton_restarted(self) -> None:
        self.models.forget()

    @property
    def triton_up(self) -> bool:
        """Whether some GPU's Triton is up (requests are placed on those that are)."""
        return not self.gpus or any(g.up for g in self.gpus)

    def live(self) -> bool:
        """False once some GPU's Triton has been down past ``--liveness-grace-s``."""
        return all(g.watch is None or g.watch.live() for g in self.gpus)

    async def stop(self) -> None:
        self.loop_lag.stop()
        for gpu in self.gpus:
            if gpu.watch is not None:
                await gpu.watch.stop()
        for gpu in self.gpus:
            if gpu.dispatcher is not None:
                await gpu.dispatcher.stop()
        for gpu in self.gpus:
            if gpu.energy_reader is not None:
                await gpu.energy_reader.stop()
            if gpu.saver is not None:
                await gpu.saver.stop()
            if gpu.upstream is not None:
                await gpu.upstream.close()
        if self.openai is not None:
            await self.openai.close()
        await asyncio.to_thread(self._close_blocking)

    def _close_blocking(self) -> None:
        for gpu in self.gpus:
            self._close_gpu(gpu)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _close_gpu(self, gpu: Gpu) -> None:
        if gpu.device is not None:
            if not self.config.shadow:
                try:
                    gpu.device.reset()
                except Exception:
                    log.exception("could not give GPU %s's clock back", gpu.index)
                else:
                    if gpu.lock is not None:
                        gpu.lock.release()
            gpu.device.close()
            gpu.device = None
        if gpu.embedded is not None:
            gpu.embedded.close(timeout_s=3.0)
            gpu.embedded = None


def _last_work_s(scheduler: Scheduler[Job]) -> float:
    """When ``scheduler`` last had work (``time.monotonic()``'s, as its events' times): now
    while a request is at Triton or waiting, else its last completion. Asked from the energy
    reader's thread: a size, a length and a float, each read whole under the GIL."""
    if scheduler.inflight or len(scheduler.queue) > 0:
        return time.monotonic()
    return scheduler.last_done_s


def _idle_power_w(device: Device, kind: str, profile: str) -> float | None:
    """What the GPU draws with nothing to do: a simulated one's profile says; a real one is read
    now, before it serves (None when it cannot be read)."""
    if kind == "sim":
        return get_profile(profile).idle_w
    try:
        return device.power_w()
    except DeviceError:
        return None


def _prefer(tables: TableSet, learned: TableSet) -> TableSet:
    """``tables`` with each model that has a learned table taking that one instead."""
    merged = TableSet(list(tables))
    for table in learned:
        merged.add(table)
    return merged
