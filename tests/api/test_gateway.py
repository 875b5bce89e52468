"""The real stack: sidecar → embedded Triton (PyTriton) → emulated GPU, driven over HTTP."""

from __future__ import annotations

import gzip
import http.client
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from api.config import from_options
from api.embedded import free_port
from tests.api.live import LiveSidecar, embedded_config, timeout_in_queue

ADMIN = {"Authorization": "Bearer test-token"}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveSidecar]:
    """At most 2 requests at Triton, so that the queue's behaviours (429, priority, timeouts)
    show with a few requests; batching has its own tests."""
    config = embedded_config(tmp_path_factory.mktemp("state"), max_inflight=2)
    with LiveSidecar(config) as sc:
        yield sc


def tensor(
    values: npt.NDArray[np.float64] | npt.NDArray[np.float32], binary: bool = True
) -> httpclient.InferInput:
    t = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
    t.set_data_from_numpy(values.astype(np.float32), binary_data=binary)
    return t


def client(sc: LiveSidecar) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(sc.url, network_timeout=60.0)


def admin(sc: LiveSidecar, method: str, path: str, body: object = None) -> httpx.Response:
    return httpx.request(
        method, f"http://{sc.url}/admin{path}", json=body, headers=ADMIN, timeout=30
    )


@pytest.fixture
def slow_gpu(sidecar: LiveSidecar) -> Iterator[None]:
    """Hold the simulated V100 at its lowest clock (45 ms a request) for the test."""
    assert admin(sidecar, "PUT", "/clock", {"clock_mhz": 135}).status_code == 200
    try:
        yield
    finally:
        assert admin(sidecar, "PUT", "/clock", {"clock_mhz": None}).status_code == 200


def test_tritonclient_json_and_binary(sidecar: LiveSidecar) -> None:
    c = client(sidecar)
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    for binary in (True, False):
        out = c.infer("simnet", [tensor(x, binary)])
        np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), 2 * x)
    out = c.infer(
        "simnet",
        [tensor(x)],
        parameters={"nice": 5, "slo_ms": 80, "client_id": "t1"},
        headers={"x-nice": "-3"},
    )
    np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), 2 * x)
    out = c.infer("simnet", [tensor(x)], model_version="1")
    np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), 2 * x)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("simnet")
    assert c.get_model_metadata("simnet")["name"] == "simnet"
    assert c.get_model_config("noop")["name"] == "noop"
    assert "model_stats" in c.get_inference_statistics("simnet")


def test_bodies_and_replies_pass_byte_for_byte(sidecar: LiveSidecar) -> None:
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16)
    body, json_size = httpclient.InferenceServerClient.generate_request_body([tensor(x)])
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(json_size),
    }
    plain = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": x.ravel().tolist()}
            ]
        }
    ).encode()
    direct_url = f"http://{sidecar.runtime.triton_url}"
    for payload, hdrs in ((body, headers), (plain, {"Content-Type": "application/json"})):
        via = sidecar.post("/v2/models/noop/infer", content=payload, headers=hdrs)
        direct = httpx.post(f"{direct_url}/v2/models/noop/infer", content=payload, headers=hdrs)
        assert via.status_code == direct.status_code == 200
        assert via.content == direct.content
        for h in ("content-type", "inference-header-content-length"):
            assert via.headers.get(h) == direct.headers.get(h)
    # A client that asks for no compression gets none (and one that asks gets Triton's gzip).
    for accept in (None, "gzip"):
        replies = []
        for url in (sidecar.url, sidecar.runtime.triton_url):
            conn = http.client.HTTPConnection(url, timeout=30)
            # Like curl: no Accept-Encoding at all (http.client would otherwise add "identity").
            conn.putrequest("POST", "/v2/models/noop/infer", skip_accept_encoding=True)
            hdrs = {"Content-Type": "application/json", "Content-Length": str(len(plain))}
            for name, value in (hdrs | ({"Accept-Encoding": accept} if accept else {})).items():
                conn.putheader(name, value)
            conn.endheaders(plain)
            resp = conn.getresponse()
            replies.append((resp.status, resp.getheader("Content-Encoding"), resp.read()))
            conn.close()
        assert replies[0] == replies[1]
        if accept is None:
            assert json.loads(replies[0][2])["outputs"][0]["name"] == "OUTPUT0"
        else:
            assert replies[0][1] == "gzip" and gzip.decompress(replies[0][2]).startswith(b"{")
    for path in (
        "/v2",
        "/v2/models/simnet",
        "/v2/models/simnet/config",
        "/v2/models/simnet/versions/1/ready",
    ):
        assert sidecar.get(path).content == httpx.get(f"{direct_url}{path}").content


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"parameters": {"nice": 50}}, "nice must be in -20..19"),
        ({"parameters": {"slo_ms": -1}}, "slo_ms must be a positive"),
        ({"priority": 9}, "priority must be in 0..2"),
        ({"parameters": {"client_id": ""}}, "client_id"),
    ],
)
def test_bad_hints_are_400_in_the_protocol_shape(
    sidecar: LiveSidecar, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        client(sidecar).infer("simnet", [tensor(np.ones((1, 16)))], **kwargs)
    assert info.value.status() == "400"
    assert field in info.value.message()


def test_error_cases(sidecar: LiveSidecar) -> None:
    r = sidecar.post(
        "/v2/models/simnet/infer", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400 and "malformed request body" in r.json()["error"]
    r = sidecar.post(
        "/v2/models/simnet/infer", content=b"{}", headers={"Inference-Header-Content-Length": "99"}
    )
    assert r.status_code == 400 and "Inference-Header-Content-Length".lower() in r.json()["error"]
    r = sidecar.post("/v2/models/ghost/infer", content=b'{"inputs": []}')
    assert r.status_code == 404 and "ghost" in r.json()["error"]
    r = sidecar.get("/v2/models/ghost")
    assert r.status_code == 404 and "error" in r.json()
    r = sidecar.get("/v2/models/simnet/bogus")
    assert r.status_code == 404 and "error" in r.json()
    # Triton's own complaint about the tensors comes back as Triton sent it.
    r = sidecar.post("/v2/models/simnet/infer", content=b'{"inputs": []}')
    assert r.status_code == 400 and "error" in r.json()


def test_full_queue_is_429_and_every_accepted_request_is_answered(
    sidecar: LiveSidecar, slow_gpu: None
) -> None:
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]}
    ).encode()

    def send(_: int) -> httpx.Response:
        return sidecar.post("/v2/models/simnet/infer", content=body)

    with ThreadPoolExecutor(30) as pool:
        replies = list(pool.map(send, range(30)))
    codes = [r.status_code for r in replies]
    assert set(codes) <= {200, 429}
    assert codes.count(429) > 0 and codes.count(200) >= 8
    for r in replies:
        if r.status_code == 429:
            assert r.headers["retry-after"] == "1" and "retry later" in r.json()["error"]
        else:
            assert r.json()["outputs"][0]["data"] == [2.0] * 16


def test_priority_one_overtakes_the_queue(sidecar: LiveSidecar, slow_gpu: None) -> None:
    x = np.ones((1, 16), dtype=np.float32)
    finished: list[tuple[float, str]] = []
    lock = threading.Lock()
    clients = [client(sidecar) for _ in range(9)]
    go = threading.Barrier(8)

    def send(i: int, name: str, priority: int) -> None:
        if priority == 2:
            go.wait()
        clients[i].infer("simnet", [tensor(x)], priority=priority, parameters={"client_id": name})
        with lock:
            finished.append((time.monotonic(), name))

    bulk = [threading.Thread(target=send, args=(i, f"bulk{i}", 2)) for i in range(8)]
    for t in bulk:
        t.start()
    deadline = time.monotonic() + 10
    while admin(sidecar, "GET", "/state").json()["queue_length"] < 4:
        assert time.monotonic() < deadline, "the bulk requests never queued up"
        time.sleep(0.005)
    vip = threading.Thread(target=send, args=(8, "vip", 1))
    vip.start()
    for t in [*bulk, vip]:
        t.join(30)
    order = [name for _, name in sorted(finished)]
    # At least four bulk requests were waiting when the VIP came; it goes before all of them,
    # so at least three finish after it (one may finish alongside it in the other lane).
    assert len(order) == 9 and len(order) - 1 - order.index("vip") >= 3


def test_metrics(sidecar: LiveSidecar) -> None:
    client(sidecar).infer("simnet", [tensor(np.ones((1, 16)))], parameters={"client_id": "m1"})
    text = sidecar.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "sidecar_requests",
        "sidecar_request_duration_seconds",
        "sidecar_queue_delay_seconds",
        "sidecar_slo_requests",
        "sidecar_gpu_time_seconds",
        "sidecar_queue_length",
        "sidecar_inflight",
        "sidecar_gpu_clock_set_hertz",
        "sidecar_gpu_clock_hertz",
        "sidecar_gpu_power_watts",
        "sidecar_gpu_energy_joules",
        "sidecar_gpu_clock_changes",
        "sidecar_policy_info",
    ):
        assert name in families, name
    ok = [
        s
        for s in families["sidecar_requests"].samples
        if s.labels.get("client") == "m1" and s.labels.get("outcome") == "ok"
    ]
    assert ok and ok[0].value >= 1
    policy = {s.labels["policy"]: s.value for s in families["sidecar_policy_info"].samples}
    assert policy["adaptive"] == 1.0 and policy["max"] == 0.0
    energy = families["sidecar_gpu_energy_joules"].samples[0].value
    assert energy > 0
    assert families["sidecar_gpu_clock_hertz"].samples[0].value >= 135e6
    # the event loop's lag, sampled since the start (a timer every 50 ms), and its worst
    lag = {s.name: s.value for s in families["sidecar_event_loop_lag_seconds"].samples}
    assert lag["sidecar_event_loop_lag_seconds_count"] > 0
    worst_ms = sidecar.get("/admin/state", headers=ADMIN).json()["event_loop_lag_worst_ms"]
    assert (
        worst_ms
        >= 1000.0
        * lag["sidecar_event_loop_lag_seconds_sum"]
        / lag["sidecar_event_loop_lag_seconds_count"]
    )
    # One family asked for (as a sampler does several times a second): that family alone.
    wanted = "?name[]=sidecar_gpu_clock_hertz&name[]=sidecar_requests_total"
    only = {f.name for f in text_string_to_metric_families(sidecar.get(f"/metrics{wanted}").text)}
    assert only == {"sidecar_gpu_clock_hertz", "sidecar_requests"}


def test_admin(sidecar: LiveSidecar) -> None:
    assert sidecar.get("/admin/state").status_code == 401
    assert sidecar.get("/admin/state", headers={"Authorization": "Bearer nope"}).status_code == 401
    # curl -d sends a form Content-Type; the body is read as JSON all the same.
    r = httpx.put(
        f"http://{sidecar.url}/admin/clock",
        content=b'{"clock_mhz": null}',
        headers={**ADMIN, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200 and r.json()["policy"] == "adaptive"
    r = admin(sidecar, "PUT", "/policy", {"nope": 1})
    assert r.status_code == 400 and "policy" in r.json()["error"]
    state = admin(sidecar, "GET", "/state").json()
    assert state["policy"] == "adaptive" and state["max_inflight"] == 2
    simnet = state["models"]["simnet"]
    assert simnet["max_batch"] == 32 and simnet["instances"] == 2
    assert simnet["table"]["batches"] == [1, 8, 32]
    try:
        assert admin(sidecar, "PUT", "/policy", {"policy": "warp"}).status_code == 400
        r = admin(sidecar, "PUT", "/policy", {"policy": "max"})
        assert r.json() == {"policy": "max", "clock_target_mhz": 1530}
        deadline = time.monotonic() + 5
        while admin(sidecar, "GET", "/state").json()["clock_mhz"] != 1530:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = admin(sidecar, "PUT", "/clock", {"clock_mhz": 777})
        assert r.status_code == 400 and "not a supported clock" in r.json()["error"]
        assert admin(sidecar, "PUT", "/clock", {"clock_mhz": 990}).json()["policy"] == "fixed"
        r = admin(sidecar, "POST", "/table", {"path": "/nonexistent.json"})
        assert r.status_code == 400 and "no time2clock table" in r.json()["error"]
        cached = next(Path(sidecar.config.state_dir, "tables").glob("*.json"))
        r = admin(sidecar, "POST", "/table", {"path": str(cached)})
        assert r.status_code == 200 and r.json()["policy"] == "adaptive"
    finally:
        admin(sidecar, "PUT", "/clock", {"clock_mhz": None})
        admin(sidecar, "PUT", "/policy", {"policy": "adaptive"})
    schema = sidecar.get("/openapi.json").json()
    assert "/admin/state" in schema["paths"] and "HTTPBearer" in json.dumps(schema["components"])


def test_the_adaptive_policys_classes_are_in_the_admin_state_and_metrics(
    sidecar: LiveSidecar,
) -> None:
    x = np.ones((1, 16), dtype=np.float32)
    for _ in range(5):
        client(sidecar).infer("simnet", [tensor(x)], parameters={"slo_ms": 250})
    classes = admin(sidecar, "GET", "/state").json()["feedback"]
    mine = next(c for c in classes if c["model"] == "simnet" and c["slo_ms"] == 250.0)
    # Counts and their consistency, not timings (a host that stalls a request for most of
    # 250 ms makes a near miss of it): a request past its SLO is a near miss too.
    assert mine["completions"] == 5 and 0 <= mine["near_misses"] <= 5
    assert isinstance(mine["base_mhz"], int) and mine["base_mhz"] > 0
    # JSON null, not NaN: fewer completions than the tail needs. A refit adopted meanwhile
    # (on the loop, whenever its fits are done) may have had the class judged afresh: its
    # window emptied, and then nothing measured yet is null too.
    attainment = mine["attainment"]
    assert attainment is None or 0.0 <= attainment <= 1.0
    assert attainment is not None or mine["rebases"] > 0
    if not mine["near_misses"] and attainment is not None:
        assert attainment == 1.0
    assert mine["tail_over_slo"] is None
    families = {f.name: f for f in text_string_to_metric_families(sidecar.get("/metrics").text)}
    speeds = {s.labels["model"]: s.value for s in families["sidecar_base_speed"].samples}
    assert 0.0 < speeds["simnet"] <= 1.0
    # The model's base speed is its fastest class's (earlier tests' classes may still be kept).
    fastest = max(c["scale"] for c in classes if c["model"] == "simnet")
    assert speeds["simnet"] == pytest.approx(fastest, abs=1e-4)
    assert mine["scale"] <= fastest


def _clock_target_mhz(sc: LiveSidecar) -> int:
    return int(admin(sc, "GET", "/state").json()["clock_target_mhz"])


def _resting_clock_mhz(sc: LiveSidecar, still_s: float = 0.3, timeout_s: float = 20.0) -> int:
    """The clock target once it has stayed put for ``still_s``: the earlier tests' requests are
    done and any hold after them is over (how long that takes depends on how busy the machine
    is, so it is waited for, not slept)."""
    deadline = time.monotonic() + timeout_s
    last, since = _clock_target_mhz(sc), time.monotonic()
    while time.monotonic() - since < still_s:
        assert time.monotonic() < deadline, "the clock never came to rest"
        time.sleep(0.02)
        now = _clock_target_mhz(sc)
        if now != last:
            last, since = now, time.monotonic()
    return last


def _clocks_asked_since(sc: LiveSidecar, since_s: float) -> list[int | None]:
    """The clock targets the sidecar's policy asked for since ``since_s`` (this process's
    monotonic clock), from the admin state's list of recent targets. Their ages are counted at
    the sidecar while it answers, so the time since ``since_s`` is read once the answer is in:
    every target asked for after ``since_s`` is then no older than it."""
    recent = admin(sc, "GET", "/state").json()["recent_clock_targets"]
    elapsed_s = time.monotonic() - since_s
    return [s["clock_mhz"] for s in recent if s["age_s"] <= elapsed_s]


def test_the_default_policy_moves_the_clock_with_the_queue(sidecar: LiveSidecar) -> None:
    """A queue that needs a faster clock gets it, and the clock comes back down after it. The
    clocks asked for are read from the admin state's list of recent targets (a rise lasts tens
    of milliseconds: polling the target can miss it on a busy machine, and an applier slowed by
    the machine applies only the latest target, so a rise may never be applied)."""
    floor = _resting_clock_mhz(sidecar)
    mark = time.monotonic()
    x = np.ones((1, 16), dtype=np.float32)
    # 8 at once with a 15 ms SLO: one alone takes about 12 ms at the top clock (1,530 MHz) by
    # the table, so the queue needs a faster clock whatever the resting one (the energy fit's
    # floor moves: with a 25 ms SLO, 8 at once fit at 705 MHz)
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda _: client(sidecar).infer("simnet", [tensor(x)], parameters={"slo_ms": 15}),
                range(8),
            )
        )
    asked = _clocks_asked_since(sidecar, mark)
    rise = max((c for c in asked if c is not None), default=0)
    assert rise > floor, (floor, asked)
    # Back down once the queue is served: under the rise, to the idle clock. The idle clock is
    # one a request alone of the last SLO seen must still meet its SLO from, woken up; after
    # a 15 ms SLO, on a machine slow enough that one alone takes most of it, that is the rise
    # itself, rightly. One request with a loose SLO after the queue makes the idle clock the
    # energy's choice, as the resting clock was before.
    client(sidecar).infer("simnet", [tensor(x)], parameters={"slo_ms": 1000})
    deadline = time.monotonic() + 20.0
    while _clock_target_mhz(sidecar) >= rise:
        assert time.monotonic() < deadline, "the clock stayed up after the queue was served"
        time.sleep(0.02)


def test_triton_down_is_503_and_admin_can_be_disabled(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    # slack with no table for any model: served at the top clock (a warning says so)
    cfg = from_options(triton_url=dead, device="sim:v100", policy="slack", state_dir=tmp_path)
    with LiveSidecar(cfg) as sc:
        r = sc.post("/v2/models/simnet/infer", content=b'{"inputs": []}')
        assert r.status_code == 503 and "unavailable" in r.json()["error"]
        assert sc.get("/v2/health/ready").status_code == 503
        assert sc.get("/v2/health/live").status_code == 200
        r = sc.get("/admin/state")
        assert r.status_code == 403 and "admin API disabled" in r.json()["error"]
    proc = subprocess.run(
        [sys.executable, "-m", "api", "serve", "--policy", "warp"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--policy must be one of" in proc.stderr


def triton_processes_on(port: int) -> list[str]:
    """The pids of running processes whose command line names ``--http-port port``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
                state = (entry / "status").read_text()
            except OSError:
                continue
            if f"\0--http-port\0{port}\0".encode() in cmd and "zombie" not in state:
                found.append(entry.name)
    return found


def test_nothing_is_left_running(tmp_path: Path) -> None:
    """After the sidecar stops, its Triton and Triton's children are gone within 10 s."""
    with LiveSidecar(embedded_config(tmp_path)) as sc:
        assert sc.runtime.embedded is not None
        proc = sc.runtime.embedded._proc
        assert proc is not None and proc.pid is not None
        pid, port = proc.pid, sc.runtime.embedded.ports.http
        assert triton_processes_on(port), "the test cannot see Triton's process"
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    deadline = time.monotonic() + 10.0
    while (left := triton_processes_on(port)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"tritonserver left running: {left}"


def test_timeout_expired_in_the_queue_is_503(sidecar: LiveSidecar, slow_gpu: None) -> None:
    x = np.ones((1, 16), dtype=np.float32)
    clients = [client(sidecar) for _ in range(8)]
    others, last = timeout_in_queue(
        sidecar, lambda i, timeout_us: clients[i].infer("simnet", [tensor(x)], timeout=timeout_us)
    )
    assert last == "503:Request timeout expired"
    assert others == ["ok"] * len(others)
