"""Physical profiles of GPUs for :class:`dvfs.simulated.SimulatedDevice`.

Each profile is a GPU running an Inception-like image model at batch 1, measured the way seed 003
measures it (perf_analyzer, concurrency 2; the time includes the copy to the GPU).

Where the numbers come from:

* Clock ladders: the graphics clocks ``nvidia-smi -q -d SUPPORTED_CLOCKS`` lists at the highest
  memory clock. Volta datacenter parts step in about 7.5 MHz (V100 SXM2: 135..1530 MHz, 187
  clocks); Turing, Ampere and Hopper in 15 MHz (A100 SXM4: 210..1410, 81 clocks; H100 SXM5:
  345..1980; GeForce RTX 3090: 210..2100; TITAN RTX: 300..2100).
* Power limits: the board TDPs of NVIDIA's data sheets (V100 SXM2 300 W, RTX 3090 350 W,
  TITAN RTX 280 W, A100 SXM4 400 W, H100/H200 SXM 700 W). A batch-1 CNN does not reach TDP:
  NVIDIA's inference technical overview (2018, pp. 23-24; table quoted in Y. Inoue, "Queueing
  analysis of GPU-based inference servers with dynamic batching", Performance Evaluation 2021,
  Table 1a) measured ResNet-50 on a V100 at 120 W at batch 1 and 285 W at batch 128. So
  ``busy_max_w`` (busy at the top clock, batch 1) is 120 W on the V100 and, for the GPUs with no
  such table, the same 40% of TDP (an assumption). Idle powers are the usual ``nvidia-smi``
  readings of an idle, unlocked board.
* Latency spread at one clock: seed 003 (Figure 1): std 2.39 ms on RTX 3090, 1.73 ms on
  TITAN RTX, 0.49 ms on V100. A100 and H100 are not in the seed; we assume datacenter-part spreads
  like the V100's (0.45 ms and 0.35 ms) and say so here.
* Mean latency: ``y(f) = 1 / (m·f + b)`` (seed 003's model), pinned by the latency at the top and
  at the bottom clock. The top-clock figures are typical Inception-v3 batch-1 latencies at
  concurrency 2 for each generation; the bottom-clock figures follow the 5-7x slow-down across the
  ladder that seed 003's Figure 1 shows.
* Busy power: ``P(f) = busy_floor_w + (busy_max_w − busy_floor_w)·(f/f_max)^power_exponent``.
  Dynamic power goes as ``C·V²·f`` and voltage rises roughly linearly with clock over the DVFS
  range, hence an exponent near 3. With a clock-independent floor this makes energy per
  inference U-shaped in clock, with its minimum near half the top clock, as measured on real GPUs.
* Clock-change delay: 5 ms is our assumption, not a measurement. A study that measures it
  on NVIDIA GPUs (Velička, Vysocký, Říha, "Methodology for GPU Frequency Switching Latency
  Measurement", 2025, arXiv 2502.20075: GH200, A100, Quadro RTX 6000) reports
  significant variation between GPUs; work citing it gives "roughly
  1-500 ms" (Lei et al., "The Energy Cost of Execution-Idle in GPU Clusters") and ≈10-100 ms
  on Hopper (Kypriotis et al., "PowerWeave"). Its own per-GPU figures were not read here.
  ``python -m scheduler compare --clock-change-ms`` runs the simulator with another delay
  (``docs/simulator.md``, "The clock-change delay").

Batches and models (:class:`ModelProfile`, :class:`BatchLaw`): every GPU runs two models, a CNN
(ResNet-50 class; the profile's own latency is its batch-1 latency) and a transformer (BERT-large,
sequence 384, class), each with the time and power of a batch relative to batch 1 from published
tables (the ``_*_LAW`` constants below name theirs). Through Triton, as seed 003 measures:

* CNN latency per batch: NVIDIA DeepLearningExamples, ``PyTorch/Classification/ConvNets/triton/
  resnet50/README.md`` ("Offline scenario", ONNX Runtime + TensorRT FP16, one instance): V100-32GB
  2.838, 3.35, 4.191, 5.979, 9.266, 15.664 ms at batch 1, 2, 4, 8, 16, 32; A100-80GB 2.128, 2.194,
  2.759, 3.895, 5.793, 11.193 ms. Largest batch 32 (past it that setup was client-bound).
* Transformer latency per batch: DeepLearningExamples ``PyTorch/LanguageModeling/BERT/triton/
  large/README.md`` (TensorRT FP16, sequence 384, max batch 16): V100-32GB 8.0, 38.3, 70.7 ms at
  batch 1, 8, 16; A100-80GB 3.6, 15.4, 29.4 ms. Its batch-1 time over the CNN's on the same GPU
  (V100 8.0 / 2.838, A100 3.6 / 2.128) sets the transformer's speed from the CNN's.
* Power per batch: the V100 ResNet-50 table above (board power 120, 109, 132, 153, 274, 285 W at
  batch 1, 2, 4, 8, 64, 128; interpolated between 8 and 64). No published table was found for the
  transformer or the other GPUs; they use the same ratios (an assumption).
* No published table of the other GPUs' batch scaling was found: the RTX 3090 and TITAN RTX use
  the V100's laws, the H100 and H200 the A100's (assumptions). Nor was any table of latency against
  clock at several batch sizes: the clock law scales every batch alike, ``t(f, b) = g(b)·t(f, 1)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace


def _ladder(min_mhz: float, max_mhz: float, step_mhz: float) -> tuple[int, ...]:
    count = round((max_mhz - min_mhz) / step_mhz)
    return tuple(
        sorted({round(min_mhz + i * step_mhz) for i in range(count + 1)} | {round(max_mhz)})
    )


CNN = "resnet50"
TRANSFORMER = "bert-large"


def _interp(x: float, xs: tuple[int, ...], ys: tuple[float, ...], *, extrapolate: bool) -> float:
    """Piecewise-linear ``y(x)`` through the points; past the last point, linear extrapolation
    from the last two (``extrapolate``) or the last value."""
    if x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if not extrapolate or len(xs) < 2:
        return ys[-1]
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return ys[-1] + slope * (x - xs[-1])


@dataclass(frozen=True)
class BatchLaw:
    """How one execution of ``b`` requests compares with one of a single request, at one clock.

    ``latency_ratio[i]``: time of a batch of ``batches[i]`` over the time of batch 1;
    ``power_ratio[i]``: board power above the busy floor, over that at batch 1. Both come from
    published tables (``source``); between the tabulated batches they are interpolated linearly.
    """

    batches: tuple[int, ...]
    latency_ratio: tuple[float, ...]
    power_ratio: tuple[float, ...]
    source: str

    def __post_init__(self) -> None:
        n = len(self.batches)
        if self.batches[0] != 1 or len(self.latency_ratio) != n or len(self.power_ratio) != n:
            raise ValueError("a batch law starts at batch 1 and has one ratio per batch size")

    def latency_factor(self, batch: float) -> float:
        return _interp(batch, self.batches, self.latency_ratio, extrapolate=True)

    def power_factor(self, batch: float) -> float:
        return _interp(batch, self.batches, self.power_ratio, extrapolate=False)


@dataclass(frozen=True)
class ModelProfile:
    """One model on one GPU: ``t(f, b) = g(b) / (m·f + c)`` and
    ``P(f, b) = floor + (r(b)·P₁ − floor)·(f/f_max)^exponent`` (capped at the TDP), ``P₁`` the
    board power at batch 1 and the top clock, so that at the top clock a batch draws the
    published ratio ``r(b)`` of it.

    ``g`` and ``r`` are the model's :class:`BatchLaw`; the batch-1 latency pins ``m`` and ``c``
    at the top and bottom clock, as for the GPU's profile.
    """

    name: str
    min_clock_mhz: int
    max_clock_mhz: int
    latency_at_max_ms: float
    latency_at_min_ms: float
    busy_floor_w: float
    busy_max_w: float
    tdp_w: float
    max_batch: int
    law: BatchLaw
    power_exponent: float = 3.0

    @property
    def m(self) -> float:
        span = self.max_clock_mhz - self.min_clock_mhz
        return (1.0 / self.latency_at_max_ms - 1.0 / self.latency_at_min_ms) / span

    @property
    def c(self) -> float:
        return 1.0 / self.latency_at_min_ms - self.m * self.min_clock_mhz

    def mean_latency_ms(self, clock_mhz: float, batch: float = 1) -> float:
        """Mean time of one execution of ``batch`` requests at ``clock_mhz`` (alone on the GPU)."""
        return self.law.latency_factor(batch) / (self.m * clock_mhz + self.c)

    def dynamic_w(self, batch: float = 1) -> float:
        """Power above the busy floor at the top clock, running batches of ``batch``: the batch's
        board power there is the published ratio times batch 1's."""
        return max(0.0, self.busy_max_w * self.law.power_factor(batch) - self.busy_floor_w)

    def busy_power_w(self, clock_mhz: float, batch: float = 1) -> float:
        x = clock_mhz / self.max_clock_mhz
        watts = self.busy_floor_w + self.dynamic_w(batch) * x**self.power_exponent
        return float(min(watts, self.tdp_w))

    def energy_per_inference_j(self, clock_mhz: float, batch: int = 1) -> float:
        """Busy energy per request, in batches of ``batch``."""
        t_ms = self.mean_latency_ms(clock_mhz, batch)
        return self.busy_power_w(clock_mhz, batch) * t_ms / 1000.0 / batch

    def capacity_rps(self, batch: int | None = None) -> float:
        """Requests per second at the top clock in full batches (``max_batch`` by default)."""
        b = self.max_batch if batch is None else batch
        return b * 1000.0 / self.mean_latency_ms(self.max_clock_mhz, b)


@dataclass(frozen=True)
class GpuProfile:
    """A GPU and a model running on it: clock ladder, latency law, power law."""

    name: str
    full_name: str
    clocks_mhz: tuple[int, ...]
    latency_at_max_ms: float
    latency_at_min_ms: float
    latency_std_ms: float
    idle_w: float
    idle_locked_max_w: float
    busy_floor_w: float
    busy_max_w: float
    tdp_w: float
    power_exponent: float = 3.0
    clock_change_delay_s: float = 0.005
    idle_downclock_s: float = 0.2
    noise_shape: float = 4.0
    models: dict[str, ModelProfile] = field(default_factory=dict, compare=False)
    m: float = field(init=False)
    b: float = field(init=False)

    def __post_init__(self) -> None:
        f_min, f_max = self.clocks_mhz[0], self.clocks_mhz[-1]
        m = (1.0 / self.latency_at_max_ms - 1.0 / self.latency_at_min_ms) / (f_max - f_min)
        object.__setattr__(self, "m", m)
        object.__setattr__(self, "b", 1.0 / self.latency_at_min_ms - m * f_min)

    @property
    def default_model(self) -> str:
        """The model the profile's own latency and power fields describe (the CNN)."""
        return CNN

    def model(self, name: str | None = None) -> ModelProfile:
        """A model running on this GPU (default: the CNN); KeyError lists the known ones."""
        key = name or CNN
        try:
            return self.models[key]
        except KeyError:
            raise KeyError(
                f"no model {key!r} on the simulated {self.name}; known: {', '.join(self.models)}"
            ) from None

    @property
    def min_clock_mhz(self) -> int:
        return self.clocks_mhz[0]

    @property
    def max_clock_mhz(self) -> int:
        return self.clocks_mhz[-1]

    def mean_latency_ms(self, clock_mhz: float) -> float:
        """Mean inference time at a clock (concurrency 2, as measured in seed 003)."""
        return 1.0 / (self.m * clock_mhz + self.b)

    def busy_power_w(self, clock_mhz: float) -> float:
        """Board power while the GPU works at ``clock_mhz``."""
        x = clock_mhz / self.max_clock_mhz
        span_w = self.busy_max_w - self.busy_floor_w
        return float(self.busy_floor_w + span_w * x**self.power_exponent)

    def idle_power_w(self, clock_mhz: float) -> float:
        """Board power with no work; a clock locked high costs a little even when idle."""
        x = clock_mhz / self.max_clock_mhz
        return float(self.idle_w + (self.idle_locked_max_w - self.idle_w) * x**self.power_exponent)

    def energy_per_inference_j(self, clock_mhz: float, concurrency: int = 2) -> float:
        """Busy energy per request when ``concurrency`` requests share the GPU."""
        return self.busy_power_w(clock_mhz) * self.mean_latency_ms(clock_mhz) / 1000.0 / concurrency

    def energy_optimal_clock_mhz(self) -> int:
        """The clock that minimises energy per inference; slower than this costs more, not less."""
        return min(self.clocks_mhz, key=self.energy_per_inference_j)

    def capacity_rps(self, concurrency: int = 2) -> float:
        """Requests per second the GPU sustains at its top clock."""
        return concurrency * 1000.0 / self.mean_latency_ms(self.max_clock_mhz)

    def noise_gamma_params_ms(self) -> tuple[float, float]:
        """The gamma noise's shape parameters: (scale θ in ms, shift in ms), mean 0, std σ."""
        theta = self.latency_std_ms / math.sqrt(self.noise_shape)
        return theta, self.noise_shape * theta


# Latency of a batch over batch 1, through Triton (sources in the module docstring).
_CNN_LATENCY_V100 = tuple(ms / 2.838 for ms in (2.838, 3.35, 4.191, 5.979, 9.266, 15.664))
_CNN_LATENCY_A100 = tuple(ms / 2.128 for ms in (2.128, 2.194, 2.759, 3.895, 5.793, 11.193))
_CNN_BATCHES = (1, 2, 4, 8, 16, 32)
_BERT_BATCHES = (1, 8, 16)
_BERT_LATENCY_V100 = (1.0, 38.3 / 8.0, 70.7 / 8.0)
_BERT_LATENCY_A100 = (1.0, 15.4 / 3.6, 29.4 / 3.6)
# Board power of a batch over batch 1: V100 ResNet-50 (120 W at batch 1), 16 and 32 interpolated
# between the published 8 (153 W) and 64 (274 W).
_POWER_V100 = {1: 120.0, 2: 109.0, 4: 132.0, 8: 153.0, 64: 274.0, 128: 285.0}
_BATCH1_POWER_OF_TDP = 120.0 / 300.0  # V100 ResNet-50 at batch 1 over the V100 SXM2's TDP


def _power_ratios(batches: tuple[int, ...]) -> tuple[float, ...]:
    xs = tuple(sorted(_POWER_V100))
    ys = tuple(_POWER_V100[x] / _POWER_V100[1] for x in xs)
    return tuple(_interp(b, xs, ys, extrapolate=False) for b in batches)


_CNN_SOURCE = "DeepLearningExamples resnet50 Triton README; power: NVIDIA inference overview 2018"
_BERT_SOURCE = "DeepLearningExamples BERT-large Triton README; power: as the CNN's (assumed)"
_LAWS: dict[str, dict[str, BatchLaw]] = {
    "volta": {
        CNN: BatchLaw(_CNN_BATCHES, _CNN_LATENCY_V100, _power_ratios(_CNN_BATCHES), _CNN_SOURCE),
        TRANSFORMER: BatchLaw(
            _BERT_BATCHES, _BERT_LATENCY_V100, _power_ratios(_BERT_BATCHES), _BERT_SOURCE
        ),
    },
    "ampere": {
        CNN: BatchLaw(_CNN_BATCHES, _CNN_LATENCY_A100, _power_ratios(_CNN_BATCHES), _CNN_SOURCE),
        TRANSFORMER: BatchLaw(
            _BERT_BATCHES, _BERT_LATENCY_A100, _power_ratios(_BERT_BATCHES), _BERT_SOURCE
        ),
    },
}
# The transformer's batch-1 time over the CNN's on the same GPU, through Triton.
_BERT_OVER_CNN = {"volta": 8.0 / 2.838, "ampere": 3.6 / 2.128}


def _with_models(gpu: GpuProfile, family: str) -> GpuProfile:
    """``gpu`` running the CNN (its own latency) and the transformer, with ``family``'s laws."""
    laws, slower = _LAWS[family], _BERT_OVER_CNN[family]

    def model(name: str, scale: float, max_batch: int) -> ModelProfile:
        return ModelProfile(
            name=name,
            min_clock_mhz=gpu.min_clock_mhz,
            max_clock_mhz=gpu.max_clock_mhz,
            latency_at_max_ms=gpu.latency_at_max_ms * scale,
            latency_at_min_ms=gpu.latency_at_min_ms * scale,
            busy_floor_w=gpu.busy_floor_w,
            busy_max_w=gpu.busy_max_w,
            tdp_w=gpu.tdp_w,
            max_batch=max_batch,
            law=laws[name],
            power_exponent=gpu.power_exponent,
        )

    models = {CNN: model(CNN, 1.0, _CNN_BATCHES[-1]), TRANSFORMER: model(TRANSFORMER, slower, 16)}
    return replace(gpu, models=models)


_V100 = GpuProfile(
    name="v100",
    full_name="Tesla V100-SXM2-32GB",
    clocks_mhz=_ladder(135, 1530, 7.5),
    latency_at_max_ms=7.0,
    latency_at_min_ms=45.0,
    latency_std_ms=0.49,
    idle_w=40.0,
    idle_locked_max_w=55.0,
    busy_floor_w=60.0,
    busy_max_w=_BATCH1_POWER_OF_TDP * 300.0,
    tdp_w=300.0,
)
_RTX3090 = GpuProfile(
    name="rtx3090",
    full_name="NVIDIA GeForce RTX 3090",
    clocks_mhz=_ladder(210, 2100, 15),
    latency_at_max_ms=6.5,
    latency_at_min_ms=40.0,
    latency_std_ms=2.39,
    idle_w=30.0,
    idle_locked_max_w=60.0,
    busy_floor_w=60.0,
    busy_max_w=_BATCH1_POWER_OF_TDP * 350.0,
    tdp_w=350.0,
)
_TITANRTX = GpuProfile(
    name="titanrtx",
    full_name="NVIDIA TITAN RTX",
    clocks_mhz=_ladder(300, 2100, 15),
    latency_at_max_ms=7.5,
    latency_at_min_ms=38.0,
    latency_std_ms=1.73,
    idle_w=25.0,
    idle_locked_max_w=50.0,
    busy_floor_w=50.0,
    busy_max_w=_BATCH1_POWER_OF_TDP * 280.0,
    tdp_w=280.0,
)
_A100 = GpuProfile(
    name="a100",
    full_name="NVIDIA A100-SXM4-40GB",
    clocks_mhz=_ladder(210, 1410, 15),
    latency_at_max_ms=5.0,
    latency_at_min_ms=30.0,
    latency_std_ms=0.45,
    idle_w=55.0,
    idle_locked_max_w=75.0,
    busy_floor_w=80.0,
    busy_max_w=_BATCH1_POWER_OF_TDP * 400.0,
    tdp_w=400.0,
)
_H100 = GpuProfile(
    name="h100",
    full_name="NVIDIA H100 80GB HBM3",
    clocks_mhz=_ladder(345, 1980, 15),
    latency_at_max_ms=3.5,
    latency_at_min_ms=18.0,
    latency_std_ms=0.35,
    idle_w=70.0,
    idle_locked_max_w=110.0,
    busy_floor_w=120.0,
    busy_max_w=_BATCH1_POWER_OF_TDP * 700.0,
    tdp_w=700.0,
)
# Same die, clock ladder and power envelope as the H100 SXM; faster HBM3e trims the latency.
_H200 = replace(
    _H100, name="h200", full_name="NVIDIA H200", latency_at_max_ms=3.3, latency_at_min_ms=17.0
)

PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in (
        _with_models(_V100, "volta"),
        _with_models(_RTX3090, "volta"),
        _with_models(_TITANRTX, "volta"),
        _with_models(_A100, "ampere"),
        _with_models(_H100, "ampere"),
        _with_models(_H200, "ampere"),
    )
}


def get_profile(name: str) -> GpuProfile:
    """Look a profile up by name, with an error that lists the known ones."""
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise KeyError(
            f"unknown GPU profile {name!r}; known: {', '.join(sorted(PROFILES))}"
        ) from None
