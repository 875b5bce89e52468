"""Tables that learn, on the real stack: sidecar → embedded Triton → emulated GPU."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from api.config import GatewayConfig, add_arguments, from_args
from api.embedded import EMULATED
from api.learning import EnergyReader, LearnedTableSaver, learned_path, load_learned, save_atomic
from api.runtime import TABLES_VERSION
from benchmarks.recovery import wrong_energy
from dvfs.energy import EnergyReading
from dvfs.profiles import get_profile
from dvfs.simulated import SimulatedDevice
from tests.api.live import LiveSidecar, embedded_config, simnet_tables
from tests.time2clock.test_online import V100_CLOCKS
from tests.time2clock.test_online_energy import floor_of
from time2clock.online import ExecutionSample, OnlineParams, OnlineTables
from time2clock.table import ModelTable, TableSet, Time2ClockTable

ADMIN = {"Authorization": "Bearer test-token"}
SIMBERT = "simbert"  # the embedded config of the tests profiles only simnet: no table here


def state(sc: LiveSidecar) -> dict[str, object]:
    reply = sc.get("/admin/state", headers=ADMIN)
    assert reply.status_code == 200
    return dict(reply.json())


def model_state(sc: LiveSidecar, model: str) -> dict[str, object]:
    models = state(sc)["models"]
    assert isinstance(models, dict)
    return dict(models.get(model, {"table": None}))  # listed once it is seen


def metric(sc: LiveSidecar, name: str, model: str | None = None) -> float | None:
    """The first sample of ``name`` (for ``model``, where given) in the sidecar's /metrics."""
    for family in text_string_to_metric_families(sc.get("/metrics").text):
        for s in family.samples:
            if s.name == name and (model is None or s.labels.get("model") == model):
                return float(s.value)
    return None


def test_a_model_without_a_table_learns_one_and_keeps_it_across_a_restart(
    tmp_path: Path,
) -> None:
    config = embedded_config(tmp_path, max_queue=100)
    x = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    with LiveSidecar(config) as sc:
        assert state(sc)["learning"] is True
        assert model_state(sc, SIMBERT)["table"] is None
        client = httpclient.InferenceServerClient(sc.url, network_timeout=60.0)
        deadline = time.monotonic() + 60.0
        while model_state(sc, SIMBERT)["table"] is None:  # served at the top clock meanwhile
            assert time.monotonic() < deadline, model_state(sc, SIMBERT)
            for _ in range(20):
                client.infer(SIMBERT, [x])
        for _ in range(20):  # measured against the table it now has
            client.infer(SIMBERT, [x])
        seen = model_state(sc, SIMBERT)
        learning = seen["learning"]
        assert isinstance(learning, dict)
        assert learning["samples_in_window"] > 10
        assert learning["refits"] >= 1
        assert 0.0 <= learning["last_refit_age_s"] < 30.0
        assert isinstance(learning["error"], float) and learning["error"] < 1.0
        table = seen["table"]
        assert isinstance(table, dict)
        top_ms = table["top_clock_ms"]["1"]
        truth = get_profile("v100").model(EMULATED[SIMBERT])
        top = truth.max_clock_mhz
        assert truth.mean_latency_ms(top) * 0.9 <= top_ms <= truth.mean_latency_ms(top) + 25.0
        samples = metric(sc, "sidecar_table_samples_total", SIMBERT)
        assert samples is not None and samples >= learning["samples_total"]
        error = metric(sc, "sidecar_table_error_ratio", SIMBERT)
        assert error is not None and error == pytest.approx(learning["error"], abs=0.05)
        assert (metric(sc, "sidecar_table_refits_total", SIMBERT) or 0) >= 1
    saved = learned_path(tmp_path, "v100", TABLES_VERSION)
    assert SIMBERT in load_learned(saved)  # written on the way out (atomically)

    with LiveSidecar(config) as sc:  # the next start begins from what was learned
        again = model_state(sc, SIMBERT)
        assert isinstance(again["table"], dict)
        assert again["table"]["top_clock_ms"]["1"] == pytest.approx(top_ms, rel=0.05)

    with LiveSidecar(embedded_config(tmp_path, learn=False)) as sc:  # --no-learn: none of it
        assert state(sc)["learning"] is False
        assert model_state(sc, SIMBERT)["table"] is None
        assert "sidecar_table_samples" not in sc.get("/metrics").text


def test_the_learned_table_is_written_atomically(tmp_path: Path) -> None:
    path = learned_path(tmp_path, "NVIDIA H100 80GB HBM3", TABLES_VERSION)
    assert path.name == "NVIDIA_H100_80GB_HBM3-learned-v3.json"
    tables = simnet_tables()
    save_atomic(tables, path)
    assert TableSet.load(path) == tables
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left
    path.write_text("{not json")
    assert len(load_learned(path)) == 0  # a broken file is ignored (with a warning), not fatal
    assert len(load_learned(tmp_path / "absent.json")) == 0


def test_learn_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    def parse(argv: list[str]) -> GatewayConfig:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return from_args(parser.parse_args(argv))

    assert parse([]).learn is True
    assert parse(["--no-learn"]).learn is False
    monkeypatch.setenv("SIDECAR_LEARN", "0")
    assert parse([]).learn is False
    assert parse(["--learn"]).learn is True
    assert parse([]).learn_energy_probe is True
    assert parse(["--no-learn-energy-probe"]).learn_energy_probe is False
    monkeypatch.setenv("SIDECAR_LEARN_ENERGY_PROBE", "false")
    assert parse([]).learn_energy_probe is False


def test_shadow_mode_does_not_learn(tmp_path: Path) -> None:
    """In shadow mode the GPU does not run the clock the policy decides: no measurement."""
    table = tmp_path / "table.json"
    simnet_tables().save(table)
    config = embedded_config(tmp_path, shadow=True, table=(table,))
    with LiveSidecar(config) as sc:
        assert state(sc)["learning"] is False
        reply = httpx.get(f"http://{sc.url}/metrics", timeout=30)
        assert "sidecar_table_samples" not in reply.text
    assert json.loads(table.read_text())["models"]  # the given table is left as it was


def test_the_saver_writes_what_was_learned_and_keeps_what_was_loaded(tmp_path: Path) -> None:
    """Only refits are saved (a profiled table is not a learned one), models loaded from the
    file at start stay in it, and nothing is written when nothing changed."""
    base = next(iter(simnet_tables()))
    tables = TableSet(replace(base, model=m, curves=_renamed(base, m)) for m in ("a", "b", "c"))
    learner = OnlineTables(V100_CLOCKS, gpu="v100", params=OnlineParams(refit_every_s=1.0))
    path = tmp_path / "learned.json"
    current = [tables]
    saver = LearnedTableSaver(learner, lambda: current[-1], path, keep=["b"])
    asyncio.run(saver.save())
    assert not path.exists()  # nothing learned yet
    for i in range(10):
        learner.observe(ExecutionSample("a", 1530, 1, 9.0, 0.1 * i), tables.get("a"))
    refitted = learner.refit(tables, 2.0)
    assert refitted is not None
    current.append(refitted)
    asyncio.run(saver.save())
    assert TableSet.load(path).models == ["a", "b"] and saver.saves == 1
    asyncio.run(saver.save())
    assert saver.saves == 1  # no refit since: not written again
    assert TableSet.load(path).get("a") == refitted.get("a")


def _renamed(table: ModelTable, model: str) -> dict[int, Time2ClockTable]:
    return {b: replace(c, model=model) for b, c in table.curves.items()}


def test_energy_refits_show_in_the_admin_state_and_the_metrics(tmp_path: Path) -> None:
    """Served from a table whose energy curve is wrong, with learning on: the GPU's energy
    counter is attributed to clock windows, the model's energy is refitted, and the admin
    state and the metrics say so (refits, windows, the table's energy error, the host's part of
    each execution); the learned batch-1 floor comes down from the top clock.

    The SLO is loose so that only the wrong floor keeps the clock at the top: on a loaded
    machine the emulated GPU runs up to twice its law's time, and a 40 ms SLO then needs the top
    clock itself, so no clock under it would be measured (nothing to learn from, rightly)."""
    table = tmp_path / "table.json"
    wrong_energy(simnet_tables()).save(table)
    top = get_profile("v100").max_clock_mhz
    assert floor_of(TableSet.load(table).get("simnet")) >= top - 60
    config = embedded_config(tmp_path, table=(table,), slo_ms=200.0, max_queue=100, policy="slack")
    x = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    with LiveSidecar(config) as sc:
        # about 30 s on a quiet machine; one probe every 10 s, so a loaded one needs longer
        stop = time.monotonic() + 180.0

        def send(seed: int) -> None:
            client = httpclient.InferenceServerClient(sc.url, network_timeout=60.0)
            rng = np.random.default_rng(seed)
            while time.monotonic() < stop:
                time.sleep(float(rng.exponential(0.1)))
                client.infer("simnet", [x])
                energy = model_state(sc, "simnet")["learning"]["energy"]  # type: ignore[index]
                if energy["refits"] >= 3 and energy["optimal_clock_mhz"]["1"] < top - 60:
                    return

        threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        learning = model_state(sc, "simnet")["learning"]
        assert isinstance(learning, dict)
        energy = learning["energy"]
        assert energy["refits"] >= 3, energy
        assert energy["windows_in_window"] > 50 and energy["busy_s_in_window"] > 1.0
        assert 0.0 <= energy["last_refit_age_s"] < 30.0
        assert energy["optimal_clock_mhz"]["1"] < top - 60  # the floor came down
        assert isinstance(energy["error"], float)
        # the emulated GPU reports its busy time: the host's part of each execution (the hop to
        # Triton and the hand-off to the Python backend, the GPU idle) is measured, not nil
        assert isinstance(energy["host_ms"], float) and energy["host_ms"] > 0.1, energy
        host = metric(sc, "sidecar_energy_host_seconds", "simnet")
        assert host == pytest.approx(energy["host_ms"] / 1000.0, rel=0.01)
        assert metric(sc, "sidecar_table_energy_refits_total", "simnet") == energy["refits"]
        error = metric(sc, "sidecar_table_energy_error_ratio", "simnet")
        assert error is not None and error == pytest.approx(energy["error"], abs=0.05)
        text = sc.get("/metrics").text
        kept = [
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("sidecar_energy_attributed_seconds_total")
            and 'outcome="kept"' in line
        ]
        assert kept and kept[0] >= energy["busy_s_in_window"]
        probes = metric(sc, "sidecar_energy_probes_total") or 0
        assert probes >= 1  # the floor was lowered to measure under it
    saved = TableSet.load(learned_path(tmp_path, "v100", TABLES_VERSION)).get("simnet")
    assert floor_of(saved) < top - 60  # kept on disk


def test_with_probes_off_the_energy_fit_measures_only_the_clocks_the_policy_runs(
    tmp_path: Path,
) -> None:
    """``--no-learn-energy-probe``: the energy counter is still attributed to clock windows,
    but the floor is never lowered to measure a clock under it (with probes on, the first
    window closed starts one: the test above)."""
    table = tmp_path / "table.json"
    wrong_energy(simnet_tables()).save(table)
    config = embedded_config(
        tmp_path,
        table=(table,),
        slo_ms=200.0,
        max_queue=100,
        policy="slack",
        learn_energy_probe=False,
    )
    x = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    with LiveSidecar(config) as sc:
        client = httpclient.InferenceServerClient(sc.url, network_timeout=60.0)
        deadline = time.monotonic() + 120.0
        while True:
            for _ in range(20):
                client.infer("simnet", [x])
            energy = model_state(sc, "simnet")["learning"]["energy"]  # type: ignore[index]
            if energy["windows_in_window"] > 20:
                break
            assert time.monotonic() < deadline, energy
        assert metric(sc, "sidecar_energy_probes_total") == 0


def test_the_energy_reader_hands_every_new_value_in_order_to_the_loop() -> None:
    """Values read in the reader's thread reach ``on_reading`` in the event loop's thread, in
    order, each once; stopping joins the thread."""
    device = SimulatedDevice("v100", rng=np.random.default_rng(0))
    got: list[tuple[EnergyReading, int]] = []

    async def run() -> EnergyReader:
        loop_thread = threading.get_ident()
        reader = EnergyReader(
            device, lambda r, _i: got.append((r, threading.get_ident())), poll_s=0.005,
            deliver_s=0.05,
        )  # fmt: skip
        reader.start()
        await asyncio.sleep(0.6)
        await reader.stop()
        assert all(ident == loop_thread for _r, ident in got)
        return reader

    reader = asyncio.run(run())
    assert reader._thread is None and not any(
        t.name == "energy-reader" for t in threading.enumerate()
    )
    assert len(got) == reader.readings >= 5
    times = [r.as_of_s for r, _ in got]
    energies = [r.energy_j for r, _ in got]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert energies == sorted(energies)
    with pytest.raises(ValueError, match="poll_s"):
        EnergyReader(device, lambda r, i: None, poll_s=0.0)


def test_a_learned_model_keeps_its_profiled_table_as_the_reference(tmp_path: Path) -> None:
    """A model with a learned table is not profiled again, but its cached profile is read: the
    online fit moves from it (time2clock.online). With no cache, nothing is profiled for it."""
    from api.metrics import GatewayMetrics
    from api.runtime import Runtime

    runtime = Runtime(embedded_config(tmp_path), GatewayMetrics())
    runtime.device = SimulatedDevice("v100")
    assert len(runtime._profile_embedded("v100", skip={"simnet"})) == 0  # nothing to read
    cache = tmp_path / "tables" / f"v100-simnet-v{TABLES_VERSION}.json"
    cache.parent.mkdir(parents=True)
    simnet_tables().save(cache)
    reference = runtime._profile_embedded("v100", skip={"simnet"})
    assert reference.models == ["simnet"]
    assert reference.get("simnet") == simnet_tables().get("simnet")


def test_the_energy_reader_reads_less_often_once_the_gpu_has_been_idle_a_while() -> None:
    """Every ``poll_s`` while the scheduler has work or had it within ``idle_after_s``; every
    ``idle_poll_s`` after that, until it has work again (time injected). However little of
    each second the GPU is busy, one request a second keeps the reader at ``poll_s``."""
    device = SimulatedDevice("v100", rng=np.random.default_rng(0))
    now = [100.0]
    last_work = [100.0]
    reader = EnergyReader(
        device, lambda r, i: None, poll_s=0.02, idle_poll_s=0.25, idle_after_s=1.0,
        last_work_s=lambda: last_work[0], time_source=lambda: now[0],
    )  # fmt: skip
    assert reader.next_wait_s() == 0.02  # work now
    now[0] += 0.99
    assert reader.next_wait_s() == 0.02  # idle, not for long yet
    now[0] += 0.02
    assert reader.next_wait_s() == 0.25  # idle for over a second
    now[0] += 5.0
    assert reader.next_wait_s() == 0.25
    last_work[0] = now[0]
    assert reader.next_wait_s() == 0.02  # work again: at once
    for _ in range(10):  # a short request every 0.9 s, idle in between
        now[0] += 0.9
        assert reader.next_wait_s() == 0.02
        last_work[0] = now[0] + 0.001
    always = EnergyReader(device, lambda r, i: None, poll_s=0.02, time_source=lambda: now[0])
    now[0] += 60.0
    assert always.next_wait_s() == 0.02  # not told of the work: every poll_s
    with pytest.raises(ValueError, match="idle_poll_s"):
        EnergyReader(device, lambda r, i: None, poll_s=0.02, idle_poll_s=0.01)


def test_the_sidecar_times_its_raises_on_the_emulated_gpu(tmp_path: Path) -> None:
    """Live: requests arriving one at a time to an idle GPU at ``slack``'s floor, each raising
    its clock, are timed from the policy's ask to the clock read back from the emulated GPU
    (which lands a change 5 ms after it is asked for); the admin state and the metric show it."""
    config = embedded_config(tmp_path, policy="slack")
    x = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    delay_s = get_profile("v100").clock_change_delay_s  # the embedded default's GPU (sim:v100)
    with LiveSidecar(config) as sc:
        client = httpclient.InferenceServerClient(sc.url, network_timeout=60.0)
        deadline = time.monotonic() + 60.0

        def timed() -> dict[str, object]:
            seen = state(sc)["clock_change_delay"]  # GPU 0's, the only one
            assert isinstance(seen, dict)
            return seen

        while (seen := timed())["landed"] < 8:  # type: ignore[operator]
            assert time.monotonic() < deadline, seen
            client.infer("simnet", [x], parameters={"slo_ms": 15})
            time.sleep(0.15)  # idle again: the clock drops, the next request raises it
        measured = seen["measured_ms"]
        assert isinstance(measured, float) and measured >= delay_s * 1000.0
        assert seen["configured_ms"] == 5.0
        assert seen["planned_ms"] in (5.0, measured)  # within 1 ms of 5: planned as configured
        families = text_string_to_metric_families(sc.get("/metrics").text)
        figures = {
            s.labels["figure"]: s.value
            for f in families
            for s in f.samples
            if s.name == "sidecar_gpu_clock_change_delay_seconds"
        }
        planned = seen["planned_ms"]
        assert isinstance(planned, float)
        assert figures == {"measured": measured / 1000.0, "planned": planned / 1000.0}
