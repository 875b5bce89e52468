"""Hostile input, a dying Triton, abandoned requests: each on the real embedded stack."""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from api.config import from_options
from api.embedded import EmbeddedTriton, free_port, model_copies
from dvfs.simulated import SimulatedDevice
from tests.api.live import LiveSidecar, embedded_config

ADMIN = {"Authorization": "Bearer test-token"}
ROW = [1.0] * 16


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveSidecar]:
    # At most 2 requests at Triton, so that requests wait in the sidecar's queue.
    config = embedded_config(tmp_path_factory.mktemp("state"), max_queue=64, max_inflight=2)
    with LiveSidecar(config) as sc:
        yield sc


def infer_body(shape: list[int], data: object, **params: object) -> bytes:
    req: dict[str, object] = {
        "inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": data}]
    }
    if params:
        req["parameters"] = params
    return json.dumps(req).encode()


def triton_pids(sc: LiveSidecar) -> list[int]:
    """The tritonserver processes of this sidecar's embedded Triton."""
    assert sc.runtime.embedded is not None
    mark = f"\0--http-port\0{sc.runtime.embedded.ports.http}\0".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if cmd.split(b"\0")[0].endswith(b"/tritonserver") and mark in cmd:
                pids.append(int(entry.name))
    return pids


def set_clock(sc: LiveSidecar, clock_mhz: int | None) -> None:
    r = httpx.put(
        f"http://{sc.url}/admin/clock", json={"clock_mhz": clock_mhz}, headers=ADMIN, timeout=30
    )
    assert r.status_code == 200


def queue_length(sc: LiveSidecar) -> int:
    r = httpx.get(f"http://{sc.url}/admin/state", headers=ADMIN, timeout=30)
    return int(r.json()["queue_length"])


def test_the_start_up_heap_is_out_of_the_collectors_reach(sidecar: LiveSidecar) -> None:
    """What start-up made (libraries, tables, the app) is frozen: a full collection walking it
    would stop the event loop, and every request in flight, for tens of milliseconds."""
    assert gc.get_freeze_count() > 10_000


def test_absurd_shape_is_refused_and_triton_lives(sidecar: LiveSidecar) -> None:
    pids = triton_pids(sidecar)
    assert len(pids) == 1
    r = sidecar.post("/v2/models/simnet/infer", content=infer_body([1, 10**12], ROW))
    assert r.status_code == 400 and "elements" in r.json()["error"]
    r = sidecar.post("/v2/models/simnet/infer", content=infer_body([1, 16], ROW))
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [2.0] * 16
    assert triton_pids(sidecar) == pids


def _binary(header: dict[str, object], tail: bytes) -> tuple[bytes, dict[str, str]]:
    raw = json.dumps(header).encode()
    return raw + tail, {"Inference-Header-Content-Length": str(len(raw))}


@pytest.mark.parametrize(
    ("body", "headers", "message"),
    [
        (infer_body([1, 16], [1.0] * 15), {}, "data has 15"),
        (infer_body([1, -16], ROW), {}, "dims must be integers >= 0"),
        (infer_body([1, 16], ROW) .replace(b"FP32", b"FP33"), {}, "datatype must be one of"),
        (infer_body([1, 16], ROW, priority="1"), {}, "priority must be an integer"),
        (infer_body([1, 16], ROW, timeout="5"), {}, "timeout must be an integer"),
        (infer_body([1, 16], ROW, timeout=2**64), {}, "timeout must be in 0.."),
        (b"[" * 1000 + b"]" * 1000, {}, "malformed request body"),
        (b'{"inputs": [' + b"7" * 5000 + b"]}", {}, "malformed request body"),
        (b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": '
         + b"[" * 200 + b"1" + b"]" * 200 + b"}]}", {}, "nested deeper"),
        (*_binary(
            {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                         "parameters": {"binary_data_size": 60}}]},
            b"\0" * 60,
        ), "is 64 bytes, but 60 bytes were sent"),
        (*_binary(
            {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                         "parameters": {"binary_data_size": 64}}]},
            b"\0" * 8,
        ), "but 8 bytes follow the JSON header"),
        (infer_body([33, 16], [1.0] * 528), {}, "the model takes at most 512"),
    ],
)  # fmt: skip
def test_bad_tensors_are_400_in_the_protocol_shape(
    sidecar: LiveSidecar, body: bytes, headers: dict[str, str], message: str
) -> None:
    r = sidecar.post("/v2/models/simnet/infer", content=body, headers=headers)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]


def test_timeout_zero_means_no_timeout(sidecar: LiveSidecar) -> None:
    r = sidecar.post("/v2/models/simnet/infer", content=infer_body([1, 16], ROW, timeout=0))
    assert r.status_code == 200, r.text


def test_made_up_models_and_clients_do_not_grow_metrics(sidecar: LiveSidecar) -> None:
    def series() -> list[tuple[str, dict[str, str]]]:
        text = sidecar.get("/metrics").text
        return [
            (s.name, s.labels)
            for f in text_string_to_metric_families(text)
            if f.name.startswith("sidecar_requests")
            for s in f.samples
        ]

    names = ["x" * 10_000, "nul\x00model", *(f"ghost-{i}" for i in range(200))]
    for i, name in enumerate(names):
        r = sidecar.post(
            f"/v2/models/{quote(name)}/infer",
            content=infer_body([1, 16], ROW, client_id=f"c\x00{'y' * 100}{i % 3}"),
        )
        assert r.status_code == 404 and "error" in r.json()
    samples = series()
    models = {labels["model"] for _, labels in samples}
    assert models <= {"simnet", "noop", "unknown"} and "unknown" in models
    clients = {labels["client"] for _, labels in samples}
    assert all(len(c) <= 64 and "\x00" not in c for c in clients)
    assert len(samples) < 40


def test_hostile_admin_requests_are_4xx(sidecar: LiveSidecar) -> None:
    r = httpx.get(
        f"http://{sidecar.url}/admin/state",
        headers={b"Authorization": "Bearer t\u00e9st".encode()},
    )
    assert r.status_code == 401 and "error" in r.json()
    r = httpx.post(
        f"http://{sidecar.url}/admin/table", json={"path": "/"}, headers=ADMIN, timeout=30
    )
    assert r.status_code == 400 and "error" in r.json()


def test_abandoned_requests_leave_the_queue(sidecar: LiveSidecar) -> None:
    set_clock(sidecar, 135)  # 45 ms a request
    try:
        stats_url = f"http://{sidecar.runtime.triton_url}/v2/models/simnet/stats"

        def executed() -> int:
            stats = httpx.get(stats_url).json()["model_stats"][0]
            return int(stats["inference_count"])

        before = executed()
        results: list[int | str] = []
        # 40 clients, connected up front and released together, that give up after 0.3 s; at
        # about 100 ms a request, two at a time, the last would wait 2 s.
        clients = [httpx.Client(base_url=f"http://{sidecar.url}", timeout=0.3) for _ in range(40)]
        go = threading.Barrier(40)

        def send(i: int) -> None:
            go.wait()
            try:
                r = clients[i].post(
                    "/v2/models/simnet/infer", content=infer_body([1, 16], ROW, client_id="patient")
                )
                results.append(r.status_code)
            except httpx.TimeoutException:
                results.append("gave up")

        threads = [threading.Thread(target=send, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for c in clients:
            c.close()
        gave_up = results.count("gave up")
        assert gave_up >= 10
        deadline = time.monotonic() + 5
        while queue_length(sidecar) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert queue_length(sidecar) == 0
        time.sleep(0.5)  # whatever was in flight finishes
        ran = executed() - before
        # Before: Triton ran all 40. Now those that gave up while queued (most: only 2 are in
        # flight at a time) left the queue with their clients and never ran.
        assert ran <= 40 - gave_up // 2, f"Triton ran {ran} of 40 requests, {gave_up} abandoned"
        print(f"abandoned: {gave_up} of 40; Triton ran {ran}")
    finally:
        set_clock(sidecar, None)


def test_queued_timeout_is_answered_when_it_expires(sidecar: LiveSidecar) -> None:
    set_clock(sidecar, 135)
    clients = [httpx.Client(base_url=f"http://{sidecar.url}", timeout=30) for _ in range(5)]
    try:
        done: list[tuple[float, str]] = []
        lock = threading.Lock()

        def send(i: int, tag: str, **params: object) -> None:
            r = clients[i].post(
                "/v2/models/simnet/infer", content=infer_body([1, 16], ROW, **params)
            )
            with lock:
                done.append((time.monotonic(), f"{tag}:{r.status_code}"))

        # Two run at a time and the third waits about one execution (45 ms): a poll slowed by
        # a loaded machine may miss that wait, and the scene is then set again.
        for _ in range(5):
            busy = [threading.Thread(target=send, args=(i, f"busy{i}")) for i in range(3)]
            for t in busy:
                t.start()
            while clients[4].get("/admin/state", headers=ADMIN).json()["queue_length"] < 1:
                if not any(t.is_alive() for t in busy):
                    break
                time.sleep(0.002)
            else:
                break
            done.clear()
        else:
            pytest.fail("never saw a request queued behind the two running")
        late = threading.Thread(target=send, args=(3, "late"), kwargs={"timeout": 5000})
        late.start()
        for t in [*busy, late]:
            t.join(30)
        order = [tag for _, tag in sorted(done)]
        assert order[0] == "late:503", order  # answered at 5 ms, before any 45 ms request ends
    finally:
        for c in clients:
            c.close()
        set_clock(sidecar, None)


def test_triton_killed_is_restarted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="api.watch")
    with LiveSidecar(embedded_config(tmp_path, probe_interval_s=0.2)) as sc:
        assert sc.runtime.embedded is not None
        body = infer_body([1, 16], ROW)
        pids = triton_pids(sc)
        assert len(pids) == 1
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        saw_not_ready = False
        while True:
            assert time.monotonic() - killed < 90, "the service did not come back"
            saw_not_ready |= sc.get("/v2/health/ready").status_code == 503
            r = sc.post("/v2/models/simnet/infer", content=body)
            if r.status_code == 200:
                break
            assert r.status_code == 503 and "error" in r.json()
            time.sleep(0.1)
        assert saw_not_ready and sc.runtime.embedded.restarts >= 1
        # the sidecar's log says why: how Triton's process ended and the end of Triton's log
        said = [r.getMessage() for r in caplog.records if "restarting" in r.getMessage()]
        assert said and "exited with code" in said[0] and ".triton.log" in said[0], said
        assert "a fresh one" in said[0], said  # the child's own line, from Triton's log
        assert sc.get("/v2/health/live").status_code == 200
        print(f"back {time.monotonic() - killed:.1f} s after kill -9")


def test_liveness_fails_after_the_grace_period(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    cfg = from_options(
        triton_url=dead,
        device="sim:v100",
        policy="max",
        state_dir=tmp_path,
        probe_interval_s=0.1,
        liveness_grace_s=0.5,
    )
    with LiveSidecar(cfg) as sc:
        assert sc.get("/v2/health/ready").status_code == 503
        deadline = time.monotonic() + 10
        while sc.get("/v2/health/live").status_code == 200:
            assert time.monotonic() < deadline, "liveness never turned false"
            time.sleep(0.05)
        r = sc.post("/v2/models/simnet/infer", content=infer_body([1, 16], ROW))
        assert r.status_code == 503 and r.headers["retry-after"] == "1"


def test_tritonclient_still_works(sidecar: LiveSidecar) -> None:
    c = httpclient.InferenceServerClient(sidecar.url)
    x = np.ones((2, 16), dtype=np.float32)
    t = httpclient.InferInput("INPUT0", [2, 16], "FP32")
    t.set_data_from_numpy(x, binary_data=True)
    out = c.infer("simnet", [t], timeout=0)
    np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), 2 * x)


def test_an_external_triton_that_returns_is_served_again(tmp_path: Path) -> None:
    triton = EmbeddedTriton(tmp_path / "gpu.state")
    SimulatedDevice("v100", state_path=tmp_path / "gpu.state").close()
    with triton:
        cfg = from_options(
            triton_url=triton.url,
            device="sim:v100",
            policy="max",
            state_dir=tmp_path,
            probe_interval_s=0.1,
        )
        with LiveSidecar(cfg) as sc:
            body = infer_body([1, 16], ROW)
            assert sc.post("/v2/models/simnet/infer", content=body).status_code == 200
            triton.stop()
            deadline = time.monotonic() + 10
            while sc.get("/v2/health/ready").status_code != 503:
                assert time.monotonic() < deadline, "readiness stayed 200 with Triton gone"
                time.sleep(0.05)
            r = sc.post("/v2/models/simnet/infer", content=body)
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            ports = triton.ports  # where the sidecar's --triton-url still points
            for _ in range(3):
                triton.ports = ports
                triton.start()  # a start that fails once (PyTriton's rare race) moves ports
                if triton.ports == ports:
                    break
                triton.stop()
            else:
                pytest.fail(f"Triton never came back at {ports.url} in three starts")
            deadline = time.monotonic() + 30
            while sc.post("/v2/models/simnet/infer", content=body).status_code != 200:
                assert time.monotonic() < deadline, "not served again after Triton came back"
                time.sleep(0.1)
            assert sc.get("/v2/health/ready").status_code == 200


@pytest.mark.parametrize("stop_timeout_s", [0.0, 30.0])
def test_a_stopped_triton_leaves_no_copy_of_triton_or_its_models_behind(
    tmp_path: Path, stop_timeout_s: float
) -> None:
    # PyTriton removes its workspace (a copy of Triton) only on an orderly stop; the sidecar
    # gives Triton 3 s and then kills it, so the workspace is the sidecar's to remove. Triton
    # copies each model it loads into /tmp and removes the copy only when the model unloads,
    # which no stop does, orderly (30 s) or killed at once (0 s).
    SimulatedDevice("v100", state_path=tmp_path / "gpu.state").close()
    triton = EmbeddedTriton(tmp_path / "gpu.state")
    triton.start()
    space = triton._space
    assert space is not None and (space / "ws" / "tritonserver").is_dir()
    copies = model_copies(space)
    assert len(copies) == 3  # simnet, simbert, noop
    triton.stop(timeout_s=stop_timeout_s)
    assert not space.exists()
    assert not any(c.exists() for c in copies)
    triton.close()


def test_a_start_that_never_becomes_ready_is_retried_then_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A model that never loads stands for a start-up stuck in PyTriton's handshake. The GPU's
    # state exists, so that a child quick enough to bind its models within the 2 s serves
    # them (and is still never ready) rather than exiting without the state.
    SimulatedDevice("v100", state_path=tmp_path / "gpu.state").close()
    triton = EmbeddedTriton(tmp_path / "gpu.state", start_timeout_s=2.0, ready_model="absent")
    with pytest.raises(TimeoutError, match=r"not ready after 2 s; the end of its log"):
        triton.start(attempts=2)
    assert [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()], caplog.text
    assert triton._proc is None  # each attempt's child stopped, none left behind
    triton.close()


def test_grpc_refuses_an_absurd_shape_and_a_message_over_the_limit(
    sidecar: LiveSidecar, tmp_path: Path
) -> None:
    """Every limit is every protocol's: over gRPC an absurd shape is INVALID_ARGUMENT before the
    queue, and a message over ``--max-body-bytes`` is RESOURCE_EXHAUSTED from its length prefix
    (the sidecar never holds it whole); Triton keeps running."""
    import grpc
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    pids = triton_pids(sidecar)
    assert sidecar.runtime.embedded is not None
    config = embedded_config(
        tmp_path,
        triton_url=sidecar.runtime.embedded.url,
        triton_grpc_url=sidecar.runtime.embedded.ports.grpc_url,
        device="sim:v100",
        profile_models=(),
        max_body_bytes=1 << 20,
    )
    with LiveSidecar(config) as small:
        client = grpcclient.InferenceServerClient(small.grpc_url)
        try:
            absurd = grpcclient.InferInput("INPUT0", [1, 10**12], "FP32")
            absurd._raw_content = b"\0" * 64  # the shape lies about the data that follows
            with pytest.raises(InferenceServerException) as refused:
                client.infer("simnet", [absurd])
            assert refused.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
            assert "elements" in refused.value.message()
            big = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
            big._raw_content = b"\0" * (2 << 20)
            with pytest.raises(InferenceServerException) as too_big:
                client.infer("simnet", [big])
            assert too_big.value.status() == str(grpc.StatusCode.RESOURCE_EXHAUSTED)
            ok = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
            ok.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
            assert client.infer("simnet", [ok]).as_numpy("OUTPUT0") is not None
        finally:
            client.close()
    assert triton_pids(sidecar) == pids
