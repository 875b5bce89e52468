"""A simulated GPU: clock ladder, latency with spread, power, energy counter, clock-change delay.

Time and randomness are injected: the simulator passes its virtual clock and a seeded generator;
the live stack passes ``time.monotonic`` (the same clock in every process on the host), so the
sidecar and the emulated Triton model agree on when things happened.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dvfs.device import Device, DeviceIdentity
from dvfs.profiles import GpuProfile, ModelProfile, get_profile
from dvfs.state import MAX_MODELS, DeviceState, FileStateStore, MemoryStateStore, StateStore

TimeSource = Callable[[], float]


@dataclass(frozen=True)
class SimulatedStats:
    """Counters of a simulated GPU, for reports and tests."""

    energy_j: float
    busy_energy_j: float
    busy_s: float
    clock_changes: int
    completed: int
    active: int
    clock_mhz_s: float


def shared_time_ms(
    model: ModelProfile, clock_mhz: float, batch: int, running: int, models: int
) -> float:
    """How long an execution of ``batch`` would take, on average, if the GPU stayed shared as it
    is now: ``t(f, B)·G``.

    Instances of one model running at once (``running`` requests of it in all, this batch
    among them) use the GPU as one batch of their combined size ``B`` would, since concurrent
    kernels fill the SMs as a bigger batch does; different models (``G`` of them running)
    time-share it equally. The one published measurement of concurrent Triton instances found
    (triton-inference-server/server issue #366, 2019: two instances each running a batch of 1
    or 2 took 12.84 and 18.51 ms, one instance running 2 or 4 at once 11.79 and 16.71 ms) has
    them 9-11% slower than the combined batch, so this law is if anything kind to concurrent
    instances. A small batch beside a large one taking the large one's time is an assumption:
    no measurement of it was found.
    """
    return model.mean_latency_ms(clock_mhz, max(batch, running)) * max(1, models)


class SimulatedDevice(Device):
    """A physical model of one GPU (see :mod:`dvfs.profiles` for the laws and their sources).

    Locked (after :meth:`set_clock_mhz`), the GPU runs at the locked clock, reached
    ``clock_change_delay_s`` after the call. Unlocked (initially, and after :meth:`reset`), it
    behaves like the GPU's own boost logic: top clock while any work is running, bottom clock once
    it has been idle for ``idle_downclock_s``.
    """

    def __init__(
        self,
        profile: GpuProfile | str,
        *,
        index: int = 0,
        time_source: TimeSource = time.monotonic,
        rng: np.random.Generator | None = None,
        state_path: Path | None = None,
        _store: StateStore | None = None,
    ) -> None:
        self.profile = get_profile(profile) if isinstance(profile, str) else profile
        self._index = index
        self._now = time_source
        self._rng = rng if rng is not None else np.random.default_rng(0)
        if _store is not None:
            self._store = _store
        else:
            initial = DeviceState(
                clock_mhz=self.profile.min_clock_mhz,
                target_clock_mhz=self.profile.min_clock_mhz,
                last_t_s=self._now(),
            )
            self._store = (
                FileStateStore(state_path, self.profile.name, initial)
                if state_path is not None
                else MemoryStateStore(self.profile.name, initial)
            )
        self._clocks = list(self.profile.clocks_mhz)

    @classmethod
    def attach(
        cls,
        state_path: Path,
        *,
        time_source: TimeSource = time.monotonic,
        rng: np.random.Generator | None = None,
    ) -> SimulatedDevice:
        """Open the device another process created at ``state_path`` (same GPU, same state)."""
        store = FileStateStore(Path(state_path))
        return cls(store.profile_name, time_source=time_source, rng=rng, _store=store)

    # -- the Device interface -------------------------------------------------------------

    @property
    def identity(self) -> DeviceIdentity:
        return DeviceIdentity(
            index=self._index,
            name=f"{self.profile.full_name} (simulated)",
            uuid=f"SIM-{self.profile.name}-{self._index}",
        )

    def supported_clocks_mhz(self) -> list[int]:
        return list(self._clocks)

    def clock_mhz(self) -> int:
        with self._store.transaction() as st:
            self._advance(st, self._now())
            return int(st.clock_mhz)

    def set_clock_mhz(self, clock_mhz: int) -> None:
        self.check_clock_mhz(clock_mhz)
        now = self._now()
        with self._store.transaction() as st:
            if st.locked and st.target_clock_mhz == clock_mhz:
                return
            self._advance(st, now)
            st.locked = 1.0
            st.target_clock_mhz = clock_mhz
            st.clock_changes += 1
            self._move_to(st, clock_mhz, now)

    def reset(self) -> None:
        now = self._now()
        with self._store.transaction() as st:
            self._advance(st, now)
            if not st.locked:
                return
            st.locked = 0.0
            if st.active:
                self._move_to(st, self.profile.max_clock_mhz, now)
            else:
                st.pending_at_s = math.inf

    def power_w(self) -> float:
        with self._store.transaction() as st:
            self._advance(st, self._now())
            return self._power(st)

    def energy_j(self) -> float:
        with self._store.transaction() as st:
            self._advance(st, self._now())
            return st.energy_j

    def gpu_busy_s(self) -> float:
        """Seconds with an execution running (:meth:`begin_work` to :meth:`end_work`, or an
        engine's iteration): NVML's utilization counter integrated, as this model has it."""
        with self._store.transaction() as st:
            self._advance(st, self._now())
            return st.busy_s

    # -- work, as the emulated model or the simulator reports it -----------------------------

    def begin_work(self, model: str | None = None, batch: int = 1) -> int:
        """An execution of ``batch`` requests of ``model`` starts; returns its starting clock."""
        slot = self._slot(model)
        now = self._now()
        with self._store.transaction() as st:
            self._advance(st, now)
            st.active += 1
            setattr(st, slot, getattr(st, slot) + batch)
            if not st.locked and st.clock_mhz < self.profile.max_clock_mhz:
                self._move_to(st, self.profile.max_clock_mhz, now)
            return int(st.clock_mhz)

    def end_work(self, model: str | None = None, batch: int = 1) -> None:
        """An execution started by :meth:`begin_work` (same model and batch) finished."""
        slot = self._slot(model)
        now = self._now()
        with self._store.transaction() as st:
            self._advance(st, now)
            if st.active <= 0 or getattr(st, slot) < batch:
                raise RuntimeError("end_work() without a matching begin_work()")
            st.active -= 1
            st.completed += batch
            setattr(st, slot, getattr(st, slot) - batch)
            if not st.active:
                st.last_busy_end_s = now

    def engine_power(self, power_w: float | None) -> int:
        """A generative engine runs an iteration drawing ``power_w`` (None: it went idle); its
        laws price the iteration, this GPU integrates the energy. Returns the clock now."""
        now = self._now()
        with self._store.transaction() as st:
            self._advance(st, now)
            running = st.engine_power_w > 0
            if power_w is None or power_w <= 0:
                if running:
                    st.engine_power_w = 0.0
                    st.active -= 1
                    if not st.active:
                        st.last_busy_end_s = now
                return int(st.clock_mhz)
            if not running:
                st.active += 1
                if not st.locked and st.clock_mhz < self.profile.max_clock_mhz:
                    self._move_to(st, self.profile.max_clock_mhz, now)
            st.engine_power_w = power_w
            return int(st.clock_mhz)

    def sharing(self, model: str | None = None) -> tuple[int, int, int]:
        """``(clock_mhz, requests of model running, models running)``: what a running
        execution's speed depends on (see :func:`execution_speed`)."""
        slot = self._slot(model)
        with self._store.transaction() as st:
            self._advance(st, self._now())
            return int(st.clock_mhz), int(getattr(st, slot)), len(self._running(st))

    def _slot(self, model: str | None) -> str:
        name = self.profile.model(model).name
        index = list(self.profile.models).index(name)
        if index >= MAX_MODELS:
            raise ValueError(f"a simulated GPU runs at most {MAX_MODELS} models")
        return f"batch_{index}"

    def _running(self, st: DeviceState) -> list[tuple[ModelProfile, float]]:
        """``(model, requests running)`` of every model with work on the GPU."""
        models = list(self.profile.models.values())[:MAX_MODELS]
        running = ((m, getattr(st, f"batch_{i}")) for i, m in enumerate(models))
        return [(m, b) for m, b in running if b > 0]

    def sample_latency_ms(
        self, clock_mhz: float | None = None, *, model: str | None = None, batch: int = 1
    ) -> float:
        """One execution's time at ``clock_mhz`` (default: the clock now), alone on the GPU.

        Mean ``g(b)/(m·f+c)``; a right-skewed (gamma) spread of the profile's std, so slow
        outliers are rarer but farther than fast ones, as in seed 003's measurements. Seed 003
        measured the spread at batch 1 only; a batch carries the same spread (an assumption).
        """
        f = self.clock_mhz() if clock_mhz is None else clock_mhz
        mean = self.profile.model(model).mean_latency_ms(f, batch)
        theta, shift = self.profile.noise_gamma_params_ms()
        noise = float(self._rng.gamma(self.profile.noise_shape, theta)) - shift
        return max(mean + noise, 0.3 * mean)

    def pending_change(self) -> tuple[float, int] | None:
        """``(when_s, clock_mhz)`` of the clock change on its way, if any."""
        with self._store.transaction() as st:
            self._advance(st, self._now())
            at, clock = self._next_switch(st)
            return None if at == math.inf else (at, int(clock))

    def stats(self) -> SimulatedStats:
        with self._store.transaction() as st:
            self._advance(st, self._now())
            return SimulatedStats(
                energy_j=st.energy_j,
                busy_energy_j=st.busy_energy_j,
                busy_s=st.busy_s,
                clock_changes=int(st.clock_changes),
                completed=int(st.completed),
                active=int(st.active),
                clock_mhz_s=st.clock_mhz_s,
            )

    def is_locked(self) -> bool:
        with self._store.transaction() as st:
            return bool(st.locked)

    def close(self) -> None:
        """Release the state file (the file itself stays for other processes)."""
        self._store.close()

    # -- the physics ----------------------------------------------------------------------

    def _power(self, st: DeviceState) -> float:
        """Busy: the floor plus the running models' dynamic power at this clock, each model's
        at the batch it runs in all (time-shared between models: their mean)."""
        p = self.profile
        if st.engine_power_w > 0:  # an engine owns the GPU while it runs (it sets the power)
            return float(min(st.engine_power_w, p.tdp_w))
        running = self._running(st)
        if running:
            x = st.clock_mhz / p.max_clock_mhz
            mean_w = sum(m.dynamic_w(b) for m, b in running) / len(running)
            return float(min(p.busy_floor_w + mean_w * x**p.power_exponent, p.tdp_w))
        return p.idle_power_w(st.clock_mhz)

    def _move_to(self, st: DeviceState, clock_mhz: float, now: float) -> None:
        if clock_mhz == st.clock_mhz:
            st.pending_at_s = math.inf
            return
        st.pending_clock_mhz = clock_mhz
        st.pending_at_s = now + self.profile.clock_change_delay_s

    def _next_switch(self, st: DeviceState) -> tuple[float, float]:
        """When the clock next changes by itself, and to what."""
        if st.pending_at_s < math.inf:
            return st.pending_at_s, st.pending_clock_mhz
        if not st.locked and not st.active and st.clock_mhz > self.profile.min_clock_mhz:
            return st.last_busy_end_s + self.profile.idle_downclock_s, self.profile.min_clock_mhz
        return math.inf, st.clock_mhz

    def _integrate(self, st: DeviceState, until: float) -> None:
        dt = until - st.last_t_s
        if dt <= 0:
            return
        joules = self._power(st) * dt
        st.energy_j += joules
        st.clock_mhz_s += st.clock_mhz * dt
        if st.active:
            st.busy_energy_j += joules
            st.busy_s += dt
        st.last_t_s = until

    def _advance(self, st: DeviceState, now: float) -> None:
        """Integrate energy up to ``now``, applying any clock change that fell due on the way."""
        while True:
            at, clock = self._next_switch(st)
            if at > now:
                break
            self._integrate(st, max(at, st.last_t_s))
            st.clock_mhz = clock
            st.pending_at_s = math.inf
        self._integrate(st, now)
