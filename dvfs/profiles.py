"""Physical profiles of GPUs for :class:`dvfs.simulated.SimulatedDevice`.

Each profile is a GPU running an Inception-like image model at batch 1, measured the way seed 003
measures it (perf_analyzer, concurrency 2; the time includes the copy to the GPU).

Where the numbers come from:

* Clock ladders: the graphics clocks ``nvidia-smi -q -d SUPPORTED_CLOCKS`` lists at the highest
  memory clock. Volta datacenter parts step in about 7.5 MHz (V100 SXM2: 135..1530 MHz, 187
  clocks); Turing, Ampere and Hopper in 15 MHz (A100 SXM4: 210..1410, 81 clocks; H100 SXM5:
  345..1980; GeForce RTX 3090: 210..2100; TITAN RTX: 300..2100).
* Power limits: the board TDPs of NVIDIA's data sheets (V100 SXM2 300 W, RTX 3090 350 W,
  TITAN RTX 280 W, A100 SXM4 400 W, H100/H200 SXM 700 W). A batch-1 CNN does not reach TDP, so
  ``busy_max_w`` (the power busy at the top clock) sits below it. Idle powers are the usual
  ``nvidia-smi`` readings of an idle, unlocked board.
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
* Clock-change delay: a locked-clock request through NVML takes effect within a few
  milliseconds; 5 ms is our assumption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace


def _ladder(min_mhz: float, max_mhz: float, step_mhz: float) -> tuple[int, ...]:
    count = round((max_mhz - min_mhz) / step_mhz)
    return tuple(
        sorted({round(min_mhz + i * step_mhz) for i in range(count + 1)} | {round(max_mhz)})
    )


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
    m: float = field(init=False)
    b: float = field(init=False)

    def __post_init__(self) -> None:
        f_min, f_max = self.clocks_mhz[0], self.clocks_mhz[-1]
        m = (1.0 / self.latency_at_max_ms - 1.0 / self.latency_at_min_ms) / (f_max - f_min)
        object.__setattr__(self, "m", m)
        object.__setattr__(self, "b", 1.0 / self.latency_at_min_ms - m * f_min)

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


PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in (
        GpuProfile(
            name="v100",
            full_name="Tesla V100-SXM2-32GB",
            clocks_mhz=_ladder(135, 1530, 7.5),
            latency_at_max_ms=7.0,
            latency_at_min_ms=45.0,
            latency_std_ms=0.49,
            idle_w=40.0,
            idle_locked_max_w=55.0,
            busy_floor_w=60.0,
            busy_max_w=250.0,
            tdp_w=300.0,
        ),
        GpuProfile(
            name="rtx3090",
            full_name="NVIDIA GeForce RTX 3090",
            clocks_mhz=_ladder(210, 2100, 15),
            latency_at_max_ms=6.5,
            latency_at_min_ms=40.0,
            latency_std_ms=2.39,
            idle_w=30.0,
            idle_locked_max_w=60.0,
            busy_floor_w=60.0,
            busy_max_w=320.0,
            tdp_w=350.0,
        ),
        GpuProfile(
            name="titanrtx",
            full_name="NVIDIA TITAN RTX",
            clocks_mhz=_ladder(300, 2100, 15),
            latency_at_max_ms=7.5,
            latency_at_min_ms=38.0,
            latency_std_ms=1.73,
            idle_w=25.0,
            idle_locked_max_w=50.0,
            busy_floor_w=50.0,
            busy_max_w=250.0,
            tdp_w=280.0,
        ),
        GpuProfile(
            name="a100",
            full_name="NVIDIA A100-SXM4-40GB",
            clocks_mhz=_ladder(210, 1410, 15),
            latency_at_max_ms=5.0,
            latency_at_min_ms=30.0,
            latency_std_ms=0.45,
            idle_w=55.0,
            idle_locked_max_w=75.0,
            busy_floor_w=80.0,
            busy_max_w=330.0,
            tdp_w=400.0,
        ),
        GpuProfile(
            name="h100",
            full_name="NVIDIA H100 80GB HBM3",
            clocks_mhz=_ladder(345, 1980, 15),
            latency_at_max_ms=3.5,
            latency_at_min_ms=18.0,
            latency_std_ms=0.35,
            idle_w=70.0,
            idle_locked_max_w=110.0,
            busy_floor_w=120.0,
            busy_max_w=600.0,
            tdp_w=700.0,
        ),
    )
}
# Same die, clock ladder and power envelope as the H100 SXM; faster HBM3e trims the latency.
PROFILES["h200"] = replace(
    PROFILES["h100"],
    name="h200",
    full_name="NVIDIA H200",
    latency_at_max_ms=3.3,
    latency_at_min_ms=17.0,
)


def get_profile(name: str) -> GpuProfile:
    """Look a profile up by name, with an error that lists the known ones."""
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise KeyError(
            f"unknown GPU profile {name!r}; known: {', '.join(sorted(PROFILES))}"
        ) from None
