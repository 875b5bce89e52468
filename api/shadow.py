"""Shadow mode's ledger: the clock the policy would set, the clock the GPU runs, and the energy
the difference would have saved.

In shadow mode the scheduler decides exactly as it would, but no clock is ever written (the
device is a :class:`dvfs.readonly.ReadOnlyDevice`). What an operator wants to know before letting
it act is what acting would change, so for every completed request the ledger adds the table's
measured energy per inference at the clock the GPU ran (sampled every ``sample_interval_s``) and
at the clock the policy asked for when the request was sent. Their difference is the estimated
saving; it can be negative (the GPU ran below what the policy would have held), which is why both
are counted rather than one "saved" counter that Prometheus would not let go down.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Callable

from api.metrics import GatewayMetrics
from api.tasks import cancel_and_wait
from dvfs.device import Device
from dvfs.errors import DeviceError
from time2clock.table import TableSet, Time2ClockTable

log = logging.getLogger(__name__)


def energy_per_inference_j(table: Time2ClockTable, clock_mhz: int) -> float | None:
    """The table's measured energy per inference at ``clock_mhz``, linearly interpolated between
    measured clocks and held flat beyond them; None when the table measured no energy."""
    measured = sorted(
        (p.clock_mhz, p.energy_per_inference_j)
        for p in table.points
        if p.energy_per_inference_j is not None
    )
    if not measured:
        return None
    clocks = [c for c, _ in measured]
    i = bisect.bisect_left(clocks, clock_mhz)
    if i == 0:
        return measured[0][1]
    if i == len(measured):
        return measured[-1][1]
    (c0, e0), (c1, e1) = measured[i - 1], measured[i]
    return e0 + (e1 - e0) * (clock_mhz - c0) / (c1 - c0)


class ShadowLedger:
    """Counts what shadow mode would have done on one GPU; lives beside its dispatcher."""

    def __init__(
        self,
        *,
        gpu: str,
        device: Device,
        tables: Callable[[], TableSet],
        metrics: GatewayMetrics,
        sample_interval_s: float = 0.25,
    ) -> None:
        self.gpu = gpu
        self.device = device
        self.tables = tables
        self.metrics = metrics
        self.sample_interval_s = sample_interval_s
        self.target_mhz: int | None = None
        self.gpu_clock_mhz: int | None = None
        self.completed = 0
        self.estimated = 0
        self.energy_at_gpu_clock_j = 0.0
        self.energy_at_shadow_clock_j = 0.0
        self._task: asyncio.Task[None] | None = None
        self._at_gpu = metrics.shadow_energy.labels(gpu, "gpu_clock")
        self._at_shadow = metrics.shadow_energy.labels(gpu, "shadow_clock")

    def start(self) -> None:
        self._task = asyncio.create_task(self._sample(), name="shadow-clock-sampler")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def would_set(self, clock_mhz: int | None) -> None:
        """The policy's target (None: it would leave the clock to the GPU)."""
        self.target_mhz = clock_mhz
        self.metrics.clock_shadow.labels(self.gpu).set(
            0.0 if clock_mhz is None else clock_mhz * 1e6
        )

    def on_complete(self, model: str, planned_mhz: int | None) -> None:
        """One request of ``model`` answered: add its estimated energy at both clocks (from its
        model's batch-1 curve: the batch Triton formed is not known here). ``planned_mhz`` is
        the policy's target when the request was sent (None: the GPU's own clock): the clock
        it would have run at. The target when it completes may already be another one (a
        policy that idles low drops the clock as the last request finishes)."""
        self.completed += 1
        actual = self.gpu_clock_mhz
        model_table = self.tables().get(model)  # in force: /admin/table may have swapped it
        if actual is None or model_table is None:
            return
        wanted = actual if planned_mhz is None else planned_mhz
        table = model_table.curve(1)
        at_gpu = energy_per_inference_j(table, actual)
        at_shadow = energy_per_inference_j(table, wanted)
        if at_gpu is None or at_shadow is None:
            return
        self.estimated += 1
        self.energy_at_gpu_clock_j += at_gpu
        self.energy_at_shadow_clock_j += at_shadow
        self._at_gpu.inc(at_gpu)
        self._at_shadow.inc(at_shadow)

    def state(self) -> dict[str, object]:
        """For ``/admin/state``."""
        return {
            "clock_target_mhz": self.target_mhz,
            "gpu_clock_mhz": self.gpu_clock_mhz,
            "completed": self.completed,
            "estimated": self.estimated,
            "energy_at_gpu_clock_j": round(self.energy_at_gpu_clock_j, 6),
            "energy_at_shadow_clock_j": round(self.energy_at_shadow_clock_j, 6),
            "estimated_saved_j": round(
                self.energy_at_gpu_clock_j - self.energy_at_shadow_clock_j, 6
            ),
            "table_has_energy": any(
                energy_per_inference_j(t.curve(1), 0) is not None for t in self.tables()
            ),
        }

    async def _sample(self) -> None:
        """Read the clock the GPU runs, off the event loop (an NVML read takes a while)."""
        failing = False
        while True:
            try:
                self.gpu_clock_mhz = await asyncio.to_thread(self.device.clock_mhz)
                failing = False
            except DeviceError:
                if not failing:  # once per run of failures, not four times a second
                    log.exception("shadow mode could not read GPU %s's clock", self.gpu)
                failing = True
            await asyncio.sleep(self.sample_interval_s)
