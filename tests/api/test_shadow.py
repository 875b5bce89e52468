"""Shadow mode on the real stack: it decides and exports, and no clock is ever written."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.config import add_arguments, from_args
from api.metrics import GatewayMetrics
from api.shadow import ShadowLedger, energy_per_inference_j
from dvfs.readonly import DeviceWriteForbiddenError, ReadOnlyDevice
from dvfs.simulated import SimulatedDevice
from simulator.simulate import profiled_tables
from tests.api.live import LiveSidecar, embedded_config, simnet_tables
from tests.scheduler.helpers import make_table

ADMIN = {"Authorization": "Bearer test-token"}
BODY = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]}


class WriteSpy:
    """Every ``set_clock_mhz``/``reset`` any SimulatedDevice in this process receives."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writes: list[tuple[str, object]] = []
        set_clock, reset = SimulatedDevice.set_clock_mhz, SimulatedDevice.reset

        def spy_set(device: SimulatedDevice, clock_mhz: int) -> None:
            self.writes.append(("set_clock_mhz", clock_mhz))
            set_clock(device, clock_mhz)

        def spy_reset(device: SimulatedDevice) -> None:
            self.writes.append(("reset", None))
            reset(device)

        monkeypatch.setattr(SimulatedDevice, "set_clock_mhz", spy_set)
        monkeypatch.setattr(SimulatedDevice, "reset", spy_reset)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[WriteSpy]:
    spy = WriteSpy(monkeypatch)
    yield spy
    # The spy sits where the sidecar looks the methods up: a write would have been seen.
    SimulatedDevice("v100").set_clock_mhz(135)
    assert spy.writes[-1] == ("set_clock_mhz", 135)


def metrics(sc: LiveSidecar) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = sc.get("/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def drive(sc: LiveSidecar, n: int, slo_ms: float) -> None:
    body = {**BODY, "parameters": {"slo_ms": slo_ms}}

    def send(_: int) -> int:
        return httpx.post(
            f"http://{sc.url}/v2/models/simnet/infer", json=body, timeout=60
        ).status_code

    with ThreadPoolExecutor(2) as pool:
        assert set(pool.map(send, range(n))) == {200}


def test_shadow_decides_exports_and_never_writes(tmp_path: Path, spy: WriteSpy) -> None:
    table_path = tmp_path / "v100.json"
    simnet_tables("v100").save(table_path)
    spy.writes.clear()  # the table's sweep ran on its own simulated GPU, before the sidecars
    # slack: its floor is the table's energy-optimal clock, the measure the ledger prices with
    # (adaptive's floor counts energy above idle, which the ledger's estimate does not).
    config = embedded_config(
        tmp_path, shadow=True, table=(table_path,), slo_ms=200.0, policy="slack"
    )
    with LiveSidecar(config) as embedded:
        assert embedded.runtime.embedded is not None
        # In front of a real Triton too: a second shadow sidecar before the same server.
        front = replace(config, triton_url=embedded.runtime.embedded.url, device="sim:v100")
        with LiveSidecar(front) as external:
            for sc in (embedded, external):
                drive(sc, 40, slo_ms=200.0)
                state = sc.get("/admin/state", headers=ADMIN).json()
                assert state["mode"] == "shadow"
                shadow = state["shadow"]
                assert shadow["completed"] == 40 and shadow["table_has_energy"]
                assert shadow["estimated"] > 0
                # Unlocked, the simulated GPU boosts to its top clock while busy; the policy
                # would hold a lower one: positive estimated saving.
                assert shadow["clock_target_mhz"] < 1530
                assert shadow["estimated_saved_j"] > 0
                m = metrics(sc)
                assert m[("sidecar_shadow_mode", (("gpu", "0"),))] == 1.0
                would = m[("sidecar_gpu_clock_shadow_hertz", (("gpu", "0"),))]
                assert would == shadow["clock_target_mhz"] * 1e6
                at_gpu = m[
                    ("sidecar_shadow_energy_joules_total", (("at", "gpu_clock"), ("gpu", "0")))
                ]
                at_shadow = m[
                    ("sidecar_shadow_energy_joules_total", (("at", "shadow_clock"), ("gpu", "0")))
                ]
                assert at_gpu - at_shadow == pytest.approx(shadow["estimated_saved_j"], abs=1e-5)
                assert ("sidecar_gpu_clock_set_hertz", (("gpu", "0"),)) not in m
                assert m.get(("sidecar_gpu_clock_changes_total", (("gpu", "0"),)), 0.0) == 0.0
            # The admin API's forced clock is only recorded, too.
            r = httpx.put(
                f"http://{embedded.url}/admin/clock", json={"clock_mhz": 405}, headers=ADMIN
            )
            assert r.status_code == 200
            drive(embedded, 2, slo_ms=200.0)
            state = embedded.get("/admin/state", headers=ADMIN).json()
            assert state["shadow"]["clock_target_mhz"] == 405
            inner = embedded.runtime.device
            assert isinstance(inner, ReadOnlyDevice)
            assert isinstance(inner.inner, SimulatedDevice)
            assert not inner.inner.is_locked() and inner.inner.stats().clock_changes == 0
    assert spy.writes == []


def test_shadow_without_a_table_cannot_profile(tmp_path: Path) -> None:
    from api.metrics import GatewayMetrics
    from api.runtime import Runtime

    runtime = Runtime(embedded_config(tmp_path, shadow=True), GatewayMetrics())
    runtime.device = ReadOnlyDevice(SimulatedDevice("v100"))
    with pytest.raises(ValueError, match="shadow mode never sets a clock, so it cannot profile"):
        runtime._profile_embedded("v100")


def test_read_only_device_refuses_every_write() -> None:
    inner = SimulatedDevice("v100")
    device = ReadOnlyDevice(inner)
    assert device.supported_clocks_mhz() == inner.supported_clocks_mhz()
    assert device.clock_mhz() == inner.clock_mhz() and device.identity == inner.identity
    with pytest.raises(DeviceWriteForbiddenError, match="read-only"):
        device.set_clock_mhz(135)
    with pytest.raises(DeviceWriteForbiddenError, match="read-only"):
        device.reset()
    assert inner.stats().clock_changes == 0


def test_energy_per_inference_interpolates_measured_clocks() -> None:
    table = next(iter(profiled_tables("v100"))).curve(1)
    points = {p.clock_mhz: p.energy_per_inference_j for p in table.points}
    clocks = sorted(points)
    lo, hi = clocks[3], clocks[4]
    mid = (lo + hi) // 2
    e_lo, e_hi = points[lo], points[hi]
    assert e_lo is not None and e_hi is not None
    assert energy_per_inference_j(table, lo) == e_lo
    expected = e_lo + (e_hi - e_lo) * (mid - lo) / (hi - lo)
    assert energy_per_inference_j(table, mid) == pytest.approx(expected)
    assert energy_per_inference_j(table, 1) == points[clocks[0]]
    assert energy_per_inference_j(table, 10_000) == points[clocks[-1]]
    assert energy_per_inference_j(make_table(energy_optimal_mhz=None), 1000) is None


def test_the_ledger_prices_a_request_at_the_clock_planned_when_it_was_sent() -> None:
    """A policy that idles low has already dropped its target when the last request completes:
    the request is priced at the clock the policy held when it was sent, not at that one."""
    tables = profiled_tables("v100")
    model_table = next(iter(tables))
    curve = model_table.curve(1)
    clocks = sorted(p.clock_mhz for p in curve.points)
    ledger = ShadowLedger(
        gpu="0", device=SimulatedDevice("v100"), tables=lambda: tables, metrics=GatewayMetrics()
    )
    ledger.gpu_clock_mhz = clocks[-1]  # the GPU ran at its top clock
    ledger.would_set(clocks[0])  # the policy dropped to its lowest as the request completed
    ledger.on_complete(model_table.model, clocks[len(clocks) // 2])
    at_gpu = energy_per_inference_j(curve, clocks[-1])
    planned = energy_per_inference_j(curve, clocks[len(clocks) // 2])
    assert at_gpu is not None and planned is not None
    state = ledger.state()
    assert state["energy_at_gpu_clock_j"] == pytest.approx(at_gpu, abs=1e-6)
    assert state["energy_at_shadow_clock_j"] == pytest.approx(planned, abs=1e-6)
    ledger.on_complete(model_table.model, None)  # a policy that leaves the clock to the GPU
    assert ledger.state()["estimated_saved_j"] == pytest.approx(at_gpu - planned, abs=1e-5)


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        ([], None, False),
        (["--shadow"], None, True),
        ([], "1", True),
        ([], "false", False),
        (["--no-shadow"], "yes", False),
    ],
)
def test_shadow_flag_and_environment(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], env: str | None, expected: bool
) -> None:
    if env is None:
        monkeypatch.delenv("SIDECAR_SHADOW", raising=False)
    else:
        monkeypatch.setenv("SIDECAR_SHADOW", env)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert from_args(parser.parse_args(argv)).shadow is expected


def test_bad_shadow_environment_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIDECAR_SHADOW", "maybe")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match="SIDECAR_SHADOW must be one of"):
        from_args(parser.parse_args([]))
    assert os.environ["SIDECAR_SHADOW"] == "maybe"
