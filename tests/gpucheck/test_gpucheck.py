"""The GPU check without a GPU: it says so; its guard refuses every NVML write; its measuring
and shadow-sidecar path runs for real against the embedded Triton and the simulated GPU."""

from __future__ import annotations

import signal
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pynvml
import pytest

import dvfs.nvml
from api.embedded import INPUT_WIDTH, SIMNET, EmbeddedTriton
from dvfs.nvml import NvmlDevice
from dvfs.readonly import ReadOnlyDevice
from dvfs.simulated import SimulatedDevice
from gpucheck.__main__ import (
    LEVELS_LABEL,
    ShadowSidecar,
    one_clock_table,
    overhead_summary,
    print_report,
    report_markdown,
    two_levels,
)
from gpucheck.guard import NvmlWriteForbiddenError, forbid_nvml_writes, is_read
from gpucheck.measure import Measurement, calibrate, energy_counter, measure
from loadgen.classes import RequestClass
from tests.api.live import simnet_tables
from tests.dvfs.fake_nvml import FakeNvml

ROOT = Path(__file__).resolve().parents[2]
WRITERS = (
    "nvmlDeviceSetGpuLockedClocks",
    "nvmlDeviceResetGpuLockedClocks",
    "nvmlDeviceSetPowerManagementLimit",
    "nvmlDeviceSetApplicationsClocks",
    "nvmlDeviceResetApplicationsClocks",
    "nvmlDeviceSetMemoryLockedClocks",
    "nvmlDeviceSetPersistenceMode",
    "nvmlDeviceSetComputeMode",
    "nvmlDeviceSetEccMode",
    "nvmlDeviceClearEccErrorCounts",
    "nvmlDeviceSetMigMode",
    "nvmlDeviceSetFanSpeed_v2",
    "nvmlDeviceSetAutoBoostedClocksEnabled",
    "nvmlDeviceSetGpuOperationMode",
)
READERS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetSupportedGraphicsClocks",
)


def test_without_a_gpu_it_says_so_and_checks_nothing(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(ROOT / "scripts" / "gpu-check"), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert proc.returncode == 2, proc.stderr
    assert "gpu-check: no NVIDIA GPU here, nothing was checked" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_guard_leaves_reads_and_refuses_every_write() -> None:
    module = types.ModuleType("pynvml_copy")
    module.__dict__.update(vars(pynvml))
    replaced = forbid_nvml_writes(module)
    assert set(WRITERS) <= set(replaced)
    for name in WRITERS:
        with pytest.raises(NvmlWriteForbiddenError, match="read-only"):
            getattr(module, name)("handle", 1, 2)
    for name in READERS:
        assert getattr(module, name) is getattr(pynvml, name) and is_read(name)
    assert pynvml.nvmlDeviceSetGpuLockedClocks is not module.nvmlDeviceSetGpuLockedClocks


def test_guarded_nvml_device_reads_and_cannot_write(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    monkeypatch.setattr(dvfs.nvml, "pynvml", fake)
    forbid_nvml_writes(fake)  # type: ignore[arg-type]
    dev = NvmlDevice(0)  # not even wrapped read-only: the guard alone stops the write
    assert dev.clock_mhz() == 1380 and dev.supported_clocks_mhz()[-1] == 1980
    with pytest.raises(NvmlWriteForbiddenError):
        dev.set_clock_mhz(1200)
    with pytest.raises(NvmlWriteForbiddenError):
        dev.reset()
    assert not [c for c in fake.calls if c[0] in ("lock", "reset")]
    dev.close()


def test_the_check_sidecar_is_shadow_only() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpucheck.sidecar", "--no-shadow"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "shadow mode only" in proc.stderr


def test_one_clock_table_carries_latency_by_inverse_clock() -> None:
    at = Measurement("direct", 1, 1, 3, 0, 100.0, 10.0, 10.0, 0.5, 50.0, 1000, 1000.0, 1000,
                     latencies_ms=(9.0, 10.0, 11.0))  # fmt: skip
    table, measured = one_clock_table(at, [500, 1000, 2000], "gpu")
    assert measured == 1000
    assert table.predict_ms(2000) == pytest.approx(5.0, rel=0.01)
    assert table.predict_ms(500) == pytest.approx(20.0, rel=0.01)
    assert table.lowest_clock_mhz(12.0) == (1000, True)
    assert [p.energy_per_inference_j for p in table.points] == [None, 0.5, None]


def test_one_clock_table_keeps_the_measured_tail_at_the_measured_clock() -> None:
    # 98 executions near 10 ms and a tail at 14 ms: the measured clock's p99 must come out as
    # measured, not widened by the spread of the extrapolated low clocks.
    rng = np.random.default_rng(3)
    lat = (*(float(x) for x in rng.normal(10.0, 0.2, 98)), 14.0, 14.0)
    measured_p99 = float(np.quantile(lat, 0.99))
    at = Measurement("direct", 1, 1, len(lat), 0, 100.0, 10.0, measured_p99, None, None,
                     1980, 1980.0, 1980, latencies_ms=lat)  # fmt: skip
    clocks = list(range(345, 1981, 15))
    table, measured = one_clock_table(at, clocks, "gpu")
    assert measured == 1980
    # within the law's own error: 1/(m·x + b) follows center/x + margin closely, not exactly
    assert table.fit_for("p99").predict_ms(1980) == pytest.approx(measured_p99, rel=0.05)
    # the center still scales by the inverse clock; the p99 margin is not scaled with it
    # (at half the clock a scaled margin would be twice the measured one)
    assert table.predict_ms(990) == pytest.approx(2 * table.predict_ms(1980), rel=0.01)
    margin_ms = measured_p99 - table.predict_ms(1980)
    assert table.fit_for("p99").predict_ms(990) - table.predict_ms(990) < 1.3 * margin_ms
    assert table.lowest_clock_mhz(measured_p99 + 1.0, "p99")[1]


def test_overhead_pairs_each_sidecar_run_with_the_direct_run_before_it() -> None:
    def run(label: str, conc: int, rate: float, p50: float) -> Measurement:
        return Measurement(label, 1, conc, 10, 0, rate, p50, 2 * p50, None, None, 1, 1.0, 1)

    runs = [
        run("direct", 16, 500.0, 20.0), run("sidecar:1", 16, 400.0, 30.0),
        run("direct", 16, 600.0, 25.0), run("sidecar:2", 16, 540.0, 26.0),
    ]  # fmt: skip
    first, second = overhead_summary(runs)
    assert (first["path"], first["throughput_kept"]) == ("sidecar:1", 0.8)
    assert first["p50_added_ms"] == 10.0 and first["p99_added_ms"] == 20.0
    assert (second["path"], second["throughput_kept"]) == ("sidecar:2", 0.9)
    assert second["p50_added_ms"] == 1.0
    with pytest.raises(ValueError, match="no direct run"):
        overhead_summary([run("sidecar:1", 1, 1.0, 1.0)])


def test_measuring_and_the_shadow_sidecar_on_the_embedded_stack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "gpu0.state"
    device = ReadOnlyDevice(SimulatedDevice("v100", state_path=state))
    counter = energy_counter(device)
    data = np.ones((2, INPUT_WIDTH), dtype=np.float32)
    table = tmp_path / "table.json"
    simnet_tables("v100").save(table)
    with EmbeddedTriton(state) as triton:
        with ShadowSidecar(
            tmp_path,
            triton.url,
            table,
            device_spec="sim:v100",
            slo_ms=200.0,
            max_inflight=4,
            triton_batches=None,  # the sidecar's own depths
        ) as sidecar:
            assert "--triton-batches" not in sidecar.argv
            calibrate(counter)

            def run(
                label: str, url: str, classes: tuple[RequestClass, ...] = (RequestClass("c"),)
            ) -> Measurement:
                return measure(label=label, url=url, model=SIMNET, data=data, concurrency=2,
                               device=device, counter=counter, warmup_s=0.3, window_s=1.0,
                               classes=classes)  # fmt: skip

            runs = [run("direct", triton.url), run("sidecar", sidecar.url)]
            # two priority levels through the sidecar, which simnet's batcher orders: the
            # sidecar keeps two batches of it at Triton all the same
            levels = run(LEVELS_LABEL, sidecar.url, classes=two_levels(0.5))
            state_reply = sidecar.admin("/admin/state")
        # stopped by SIGTERM, gracefully (uvicorn re-raises the signal once shut down)
        assert sidecar.proc is not None and sidecar.proc.returncode in (0, -signal.SIGTERM)
    assert levels.requests > 0 and levels.errors == 0
    assert state_reply["models"][SIMNET]["depth"] == 64  # simnet: batches of 32
    for m in runs:
        assert m.requests > 0 and m.errors == 0 and m.batch == 2
        assert m.inferences_per_s == pytest.approx(m.requests * 2 / 1.0, rel=0.5)
        assert m.energy_per_inference_j is not None and m.energy_per_inference_j > 0
        assert m.p99_ms >= m.p50_ms > 0 and len(m.latencies_ms) == m.requests
        assert "latencies_ms" not in m.to_json()
        # the GPU's busy share, from its own count: busy part of the time, never over all of it
        assert m.gpu_busy_share is not None and 0.0 < m.gpu_busy_share <= 1.0
    (summary,) = overhead_summary(runs)
    assert summary["concurrency"] == 2
    assert summary["throughput_kept"] == runs[1].inferences_per_s / runs[0].inferences_per_s
    assert summary["p99_added_ms"] == runs[1].p99_ms - runs[0].p99_ms
    assert state_reply["mode"] == "shadow"
    assert state_reply["shadow"]["completed"] >= runs[1].requests
    inner = device.inner
    assert isinstance(inner, SimulatedDevice) and inner.stats().clock_changes == 0
    # the report prints from these figures
    report = {
        "gpu": {"index": 0, "name": "sim", "uuid": "SIM", "clocks_mhz": [135, 1530],
                "clock_mhz_idle": 135, "power_w_idle": 30.0, "energy_counter_refresh_s": None},
        "slo_ms": 200.0,
        "batches": [runs[0].to_json()],
        "overhead": [m.to_json() for m in runs],
        "overhead_summary": [summary],
        "policy": {"offline_clock_mhz": 600, "offline_slo_met": True,
                   "shadow": state_reply["shadow"]},
    }  # fmt: skip
    print_report(report)
    out = capsys.readouterr().out
    assert "sidecar (--triton-batches 1) at concurrency 2" in out and "would choose 600 MHz" in out
    md = report_markdown(report)
    assert "| sidecar | 1 | 2 |" not in md  # batch 2 here
    assert f"| sidecar | 2 | 2 | {runs[1].inferences_per_s:.1f} |" in md
    assert f"| sidecar | 2 | {summary['throughput_kept']:.1%} |" in md
    assert "would choose 600 MHz" in md
    assert f"| {runs[0].gpu_busy_share:.0%} |" in md  # the GPU's busy share, a column
    # a report with the two-level run names it
    report["levels_share"] = 0.5
    report["overhead_summary"] = [{**summary, "path": LEVELS_LABEL}]
    print_report(report)
    assert f"{LEVELS_LABEL} (its default depth, 50% at priority 1)" in capsys.readouterr().out
    assert "`sidecar:levels`: the sidecar's default depth, 50% of the requests" in (
        report_markdown(report)
    )
