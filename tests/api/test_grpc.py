"""The real stack over gRPC: tritonclient.grpc → sidecar → embedded Triton's gRPC → emulated GPU."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.utils.shared_memory as shm
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from api.config import GatewayConfig, from_options
from api.embedded import free_port
from api.grpc_frontend.protocol import method_path
from tests.api.live import LiveSidecar, embedded_config, failed_start, timeout_in_queue
from tests.api.test_gateway import admin, slow_gpu  # noqa: F401 (a fixture, used by name)
from tests.api.test_gateway import client as http_client
from tests.api.test_gateway import tensor as http_tensor

Code = grpc.StatusCode


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveSidecar]:
    # One request at Triton at a time: with the slow GPU (45 ms a request) a queue builds up and
    # stays long enough to be seen, however busy the machine.
    with LiveSidecar(embedded_config(tmp_path_factory.mktemp("state"), max_inflight=1)) as sc:
        yield sc


def gclient(url: str) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(url)


def gtensor(values: npt.NDArray[Any]) -> grpcclient.InferInput:
    t = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
    t.set_data_from_numpy(values.astype(np.float32))
    return t


def raw_call(url: str, method: str, payload: bytes, metadata: tuple[Any, ...] = ()) -> bytes:
    """One unary call with the bytes as they are, the reply's bytes as they come."""
    with grpc.insecure_channel(url) as channel:
        reply: bytes = channel.unary_unary(method_path(method))(
            payload, metadata=metadata, timeout=60
        )
        return reply


def infer_request(model: str, x: npt.NDArray[np.float32], **parameters: Any) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model, id="r1")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=list(x.shape))
    del tensor
    request.raw_input_contents.append(x.tobytes())
    for key, value in parameters.items():
        if isinstance(value, str):
            request.parameters[key].string_param = value
        else:
            request.parameters[key].int64_param = value
    data: bytes = request.SerializeToString()
    return data


def test_tritonclient_grpc_unchanged(sidecar: LiveSidecar) -> None:
    c = gclient(sidecar.grpc_url)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("simnet")
    assert c.get_server_metadata().name == "triton"
    assert c.get_model_metadata("simnet").name == "simnet"
    assert c.get_model_config("noop").config.name == "noop"
    assert c.get_inference_statistics("simnet").model_stats[0].name == "simnet"
    direct = gclient(sidecar.runtime.triton_grpc_url)
    assert c.get_model_repository_index() == direct.get_model_repository_index()
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    for kwargs in (
        {},
        {"priority": 1},
        {"priority": 2, "timeout": 10_000_000},
        {"parameters": {"nice": 5, "slo_ms": 80, "client_id": "g1"}},
        {"parameters": {"slo_ms": 12.5}, "headers": {"x-nice": "-3", "x-client-id": "g2"}},
        {"model_version": "1", "request_id": "abc"},
    ):
        out = c.infer("simnet", [gtensor(x)], **kwargs)
        np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), 2 * x)
    assert c.infer("simnet", [gtensor(x)], request_id="abc").get_response().id == "abc"


def test_passthrough_and_replies_byte_for_byte(sidecar: LiveSidecar) -> None:
    direct = sidecar.runtime.triton_grpc_url
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    for model in ("noop", "simnet"):
        payload = infer_request(model, x, client_id="bytes")
        via = raw_call(sidecar.grpc_url, "ModelInfer", payload)
        assert via == raw_call(direct, "ModelInfer", payload)
        reply = service_pb2.ModelInferResponse.FromString(via)
        assert reply.model_name == model and reply.id == "r1"
    for method, message in (
        ("ServerMetadata", service_pb2.ServerMetadataRequest()),
        ("ModelMetadata", service_pb2.ModelMetadataRequest(name="simnet")),
        ("ModelConfig", service_pb2.ModelConfigRequest(name="simnet")),
        ("RepositoryIndex", service_pb2.RepositoryIndexRequest()),
        ("ModelReady", service_pb2.ModelReadyRequest(name="noop", version="1")),
        ("SystemSharedMemoryStatus", service_pb2.SystemSharedMemoryStatusRequest()),
    ):
        payload = message.SerializeToString()
        assert raw_call(sidecar.grpc_url, method, payload) == raw_call(direct, method, payload)
    # A map's order on the wire is Triton's choice, call by call: compared as messages.
    payload = service_pb2.LogSettingsRequest().SerializeToString()
    settings = [
        service_pb2.LogSettingsResponse.FromString(raw_call(url, "LogSettings", payload))
        for url in (sidecar.grpc_url, direct)
    ]
    assert settings[0] == settings[1] and "log_verbose_level" in settings[0].settings
    # Triton's own errors pass through as Triton sent them (status and message).
    errors = []
    for url in (sidecar.grpc_url, direct):
        with pytest.raises(grpc.RpcError) as info:
            raw_call(
                url, "ModelMetadata", service_pb2.ModelMetadataRequest(name="x").SerializeToString()
            )
        errors.append((info.value.code(), info.value.details()))
    assert errors[0] == errors[1] and errors[0][0] == Code.NOT_FOUND


def test_async_infer_callback_and_asyncio(sidecar: LiveSidecar) -> None:
    x = np.ones((1, 16), dtype=np.float32)
    c = gclient(sidecar.grpc_url)
    done: list[tuple[Any, Any]] = []
    finished = threading.Event()

    def callback(result: Any, error: Any) -> None:
        done.append((result, error))
        if len(done) == 4:
            finished.set()

    for i in range(4):
        c.async_infer("simnet", [gtensor(x * i)], callback, priority=1, request_id=str(i))
    assert finished.wait(30)
    assert all(error is None for _, error in done)
    for result, _ in done:
        i = int(result.get_response().id)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * x * i)

    async def run() -> list[Any]:
        ac = aioclient.InferenceServerClient(sidecar.grpc_url)
        try:
            assert await ac.is_server_live()
            return list(
                await asyncio.gather(
                    *(
                        ac.infer("noop", [gtensor(x * i)], parameters={"client_id": "aio"})
                        for i in range(6)
                    )
                )
            )
        finally:
            await ac.close()

    for i, result in enumerate(asyncio.run(run())):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * i)


def test_stream_of_requests(sidecar: LiveSidecar) -> None:
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    c = gclient(sidecar.grpc_url)
    results: list[tuple[Any, Any]] = []
    c.start_stream(callback=lambda result, error: results.append((result, error)))
    try:
        for i in range(6):
            c.async_stream_infer(
                "simnet",
                [gtensor(x + i)],
                request_id=str(i),
                priority=1 + i % 2,
                parameters={"client_id": f"s{i % 2}"},
            )
        c.async_stream_infer("ghost", [gtensor(x)], request_id="ghost")
        c.async_stream_infer("simnet", [gtensor(x)], request_id="bad", parameters={"nice": 99})
    finally:
        c.stop_stream()  # waits for every answer
    answered = {r.get_response().id: r for r, e in results if e is None}
    errors = {str(e) for r, e in results if e is not None}
    assert len(results) == 8 and sorted(answered) == [str(i) for i in range(6)]
    for i, result in answered.items():
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * (x + int(i)))
    assert errors == {
        "nice must be in -20..19, got 99",
        "Request for unknown model: 'ghost' is not found",
    }


def stream_once(url: str, payload: bytes) -> list[bytes]:
    """One request on its own stream, every reply's bytes."""
    with grpc.insecure_channel(url) as channel:
        call = channel.stream_stream(method_path("ModelStreamInfer"))
        return list(call(iter([payload]), timeout=60))


def test_stream_replies_and_errors_byte_for_byte(sidecar: LiveSidecar) -> None:
    x = np.ones((1, 16), dtype=np.float32)
    ok = infer_request("noop", x)
    ghost = infer_request("ghost", x)  # the sidecar answers this one itself, as Triton would
    wrong = service_pb2.ModelInferRequest.FromString(ok)
    wrong.inputs[0].name = "NOPE"  # Triton answers this one
    for payload in (ok, ghost, wrong.SerializeToString()):
        via = stream_once(sidecar.grpc_url, payload)
        assert via == stream_once(sidecar.runtime.triton_grpc_url, payload)
        assert len(via) == 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        # Each parameter type gRPC has (int64, uint64, double, bool, string), then metadata.
        ({"parameters": {"nice": 50}}, "nice must be in -20..19, got 50"),
        ({"priority": 9}, "priority must be in 0..2, got 9"),
        ({"parameters": {"slo_ms": 0.0}}, "slo_ms must be a positive number"),
        ({"parameters": {"nice": True}}, "nice must be an integer, got True"),
        ({"parameters": {"client_id": "c" * 200}}, "client_id must be a string of 1..128"),
        ({"headers": {"x-nice": "-30"}}, "nice must be in -20..19, got -30"),
        ({"headers": {"x-slo-ms": "soon"}}, "slo_ms must be a positive number"),
        ({"headers": {"x-priority": "one"}}, "priority must be an integer"),
    ],
)
def test_bad_hints_are_invalid_argument(
    sidecar: LiveSidecar, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(InferenceServerException) as info:
        gclient(sidecar.grpc_url).infer("simnet", [gtensor(np.ones((1, 16)))], **kwargs)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert field in info.value.message()


def test_error_statuses(sidecar: LiveSidecar) -> None:
    c = gclient(sidecar.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        c.infer("ghost", [gtensor(np.ones((1, 16)))])
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert info.value.message() == "Request for unknown model: 'ghost' is not found"
    with pytest.raises(grpc.RpcError) as raw:
        raw_call(sidecar.grpc_url, "ModelInfer", b"\xff\xff\xff")
    assert raw.value.code() == Code.INVALID_ARGUMENT
    assert "malformed ModelInferRequest" in raw.value.details()
    # Triton's complaint about the tensors comes back with Triton's status and message.
    bad = service_pb2.ModelInferRequest(model_name="simnet")
    bad.inputs.add(name="NOPE", datatype="FP32", shape=[1, 16])
    bad.raw_input_contents.append(np.ones(16, dtype=np.float32).tobytes())
    answers = []
    for url in (sidecar.grpc_url, sidecar.runtime.triton_grpc_url):
        with pytest.raises(grpc.RpcError) as info2:
            raw_call(url, "ModelInfer", bad.SerializeToString())
        answers.append((info2.value.code(), info2.value.details()))
    assert answers[0] == answers[1] and answers[0][0] == Code.INVALID_ARGUMENT


@pytest.mark.usefixtures("slow_gpu")
def test_full_queue_is_resource_exhausted_and_every_accepted_request_is_answered(
    sidecar: LiveSidecar,
) -> None:
    x = np.ones((1, 16), dtype=np.float32)

    def send(_: int) -> str:
        try:
            out = gclient(sidecar.grpc_url).infer("simnet", [gtensor(x)])
        except InferenceServerException as err:
            return f"{err.status()}:{err.message()}"
        np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), 2 * x)
        return "ok"

    with ThreadPoolExecutor(30) as pool:
        outcomes = list(pool.map(send, range(30)))
    refused = [o for o in outcomes if o != "ok"]
    assert outcomes.count("ok") >= 8 and refused
    assert all(o.startswith("StatusCode.RESOURCE_EXHAUSTED:") for o in refused), refused
    assert all("retry later" in o for o in refused)


@pytest.mark.usefixtures("slow_gpu")
def test_timeout_expired_in_the_queue_is_unavailable(sidecar: LiveSidecar) -> None:
    x = np.ones((1, 16), dtype=np.float32)
    clients = [gclient(sidecar.grpc_url) for _ in range(8)]
    others, last = timeout_in_queue(
        sidecar, lambda i, timeout_us: clients[i].infer("simnet", [gtensor(x)], timeout=timeout_us)
    )
    assert last == "StatusCode.UNAVAILABLE:Request timeout expired"  # as Triton says it
    assert others == ["ok"] * len(others)


@pytest.mark.usefixtures("slow_gpu")
def test_priority_one_grpc_overtakes_queued_http(sidecar: LiveSidecar) -> None:
    x = np.ones((1, 16), dtype=np.float32)
    finished: list[tuple[float, str]] = []
    lock = threading.Lock()
    go = threading.Barrier(8)
    https = [http_client(sidecar) for _ in range(8)]  # made first: the eight leave together
    grpc_client = gclient(sidecar.grpc_url)

    def bulk(i: int) -> None:
        go.wait()
        https[i].infer("simnet", [http_tensor(x)], parameters={"client_id": "bulk"})
        with lock:
            finished.append((time.monotonic(), f"http{i}"))

    def vip() -> None:
        grpc_client.infer("simnet", [gtensor(x)], priority=1)
        with lock:
            finished.append((time.monotonic(), "vip"))

    threads = [threading.Thread(target=bulk, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while admin(sidecar, "GET", "/state").json()["queue_length"] < 4:
        assert time.monotonic() < deadline, "the HTTP requests never queued up"
        time.sleep(0.005)
    threads.append(threading.Thread(target=vip))
    threads[-1].start()
    for t in threads:
        t.join(30)
    order = [name for _, name in sorted(finished)]
    # At least four priority-0 HTTP requests were waiting when the priority-1 gRPC one came; it
    # goes before all of them.
    assert len(order) == 9 and len(order) - 1 - order.index("vip") >= 4, order


def outcomes_of(sidecar: LiveSidecar, client: str) -> dict[tuple[str, str], float]:
    """``sidecar_requests_total`` of one client, by (outcome, protocol)."""
    families = {f.name: f for f in text_string_to_metric_families(sidecar.get("/metrics").text)}
    return {
        (s.labels["outcome"], s.labels["protocol"]): s.value
        for s in families["sidecar_requests"].samples
        if s.labels.get("client") == client
    }


def _simnet_executions(sidecar: LiveSidecar) -> int:
    """Requests Triton has run, once settled (it counts a request a moment after answering)."""
    direct = gclient(sidecar.runtime.triton_grpc_url)
    counts = [-1]
    while True:
        stats = direct.get_inference_statistics("simnet")
        counts.append(int(stats.model_stats[0].inference_stats.success.count))
        if counts[-1] == counts[-2]:
            return counts[-1]
        time.sleep(0.1)


@pytest.mark.usefixtures("slow_gpu")
@pytest.mark.parametrize(("how", "status"), [("cancel", "CANCELLED"), ("deadline", "DEADLINE")])
def test_a_cancelled_call_leaves_the_queue(sidecar: LiveSidecar, how: str, status: str) -> None:
    x = np.ones((1, 16), dtype=np.float32)
    before = _simnet_executions(sidecar)
    c = gclient(sidecar.grpc_url)
    answers: list[Any] = []
    flow = {"client_id": f"{how}-me"}  # one flow: FIFO, so the last one sent waits longest
    for _ in range(8):  # one in flight, seven waiting: 8 × 45 ms of work
        c.async_infer(
            "simnet", [gtensor(x)], lambda result, error: answers.append(error), parameters=flow
        )
    deadline = time.monotonic() + 10
    while admin(sidecar, "GET", "/state").json()["queue_length"] < 5:
        assert time.monotonic() < deadline, "the requests never queued up"
        time.sleep(0.002)
    cancelled: list[Any] = []
    call = c.async_infer(
        "simnet",
        [gtensor(x)],
        lambda result, error: cancelled.append(error),
        parameters=flow,
        client_timeout=0.05 if how == "deadline" else None,
    )
    time.sleep(0.015)  # it reaches the queue (the metric below says so), behind 5 × 45 ms
    if how == "cancel":
        call.cancel()
    while len(answers) < 8:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.1)  # time enough for the cancelled one to have been sent, had it been
    assert answers == [None] * 8
    assert cancelled and status in str(cancelled[0])
    assert _simnet_executions(sidecar) == before + 8, outcomes_of(sidecar, flow["client_id"])
    assert admin(sidecar, "GET", "/state").json()["queue_length"] == 0
    # It reached the sidecar's queue, then left it.
    assert outcomes_of(sidecar, flow["client_id"]) == {
        ("ok", "grpc"): 8.0,
        ("abandoned", "grpc"): 1.0,
    }


def test_system_shared_memory_beside_triton(sidecar: LiveSidecar) -> None:
    c = gclient(sidecar.grpc_url)
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    key = f"/sidecar-test-{free_port()}"
    region = shm.create_shared_memory_region("io", key, 2 * x.nbytes)
    try:
        shm.set_shared_memory_region(region, [x])
        c.register_system_shared_memory("io", key, 2 * x.nbytes)
        assert c.get_system_shared_memory_status().regions["io"].byte_size == 2 * x.nbytes
        inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_shared_memory("io", x.nbytes)
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("io", x.nbytes, offset=x.nbytes)
        c.infer("simnet", [inp], outputs=[out])
        got = shm.get_contents_as_numpy(region, np.float32, [1, 16], offset=x.nbytes)
        np.testing.assert_array_equal(got, 2 * x)
    finally:
        c.unregister_system_shared_memory("io")
        shm.destroy_shared_memory_region(region)
    assert "io" not in c.get_system_shared_memory_status().regions


def test_metrics_and_admin_count_grpc_and_http(sidecar: LiveSidecar) -> None:
    x = np.ones((1, 16), dtype=np.float32)
    before = admin(sidecar, "GET", "/state").json()["requests_by_protocol"]
    gclient(sidecar.grpc_url).infer("noop", [gtensor(x)], parameters={"client_id": "both"})
    for _ in range(2):
        http_client(sidecar).infer("noop", [http_tensor(x)], parameters={"client_id": "both"})
    assert outcomes_of(sidecar, "both") == {("ok", "grpc"): 1.0, ("ok", "http"): 2.0}
    state = admin(sidecar, "GET", "/state").json()
    after = state["requests_by_protocol"]
    assert after["grpc"] - before.get("grpc", 0) == 1
    assert after["http"] - before.get("http", 0) == 2
    assert state["triton_grpc_url"] == sidecar.runtime.triton_grpc_url


def test_embedded_triton_grpc_listens_on_localhost_only(sidecar: LiveSidecar) -> None:
    assert sidecar.runtime.embedded is not None
    port = f"{sidecar.runtime.embedded.ports.grpc:04X}"
    listening = []  # (address, port) of every listening IPv4/IPv6 TCP socket, in hex
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":
                listening.append(tuple(local.split(":")))
    loopback = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1, ::ffff:127.0.0.1
    addresses = [address for address, p in listening if p == port]
    assert addresses and set(addresses) <= loopback, addresses


def test_triton_down_is_unavailable(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    cfg = from_options(
        triton_url=dead, triton_grpc_url=dead, device="sim:v100", policy="max", state_dir=tmp_path
    )
    with LiveSidecar(cfg) as sc:
        c = gclient(sc.grpc_url)
        for call in (
            lambda: c.infer("simnet", [gtensor(np.ones((1, 16)))]),
            c.is_server_live,
        ):
            with pytest.raises(InferenceServerException) as info:
                call()
            assert info.value.status() == "StatusCode.UNAVAILABLE"


def test_grpc_port_option(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from api.config import add_arguments, from_args
    from api.metrics import GatewayMetrics
    from api.runtime import Runtime

    monkeypatch.setenv("SIDECAR_GRPC_PORT", "9101")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert from_args(parser.parse_args([])).grpc_port == 9101
    assert from_args(parser.parse_args(["--grpc-port", "0"])).grpc_port == 0
    with pytest.raises(ValueError, match=r"--grpc-port must be in 0\.\.65535"):
        from_options(grpc_port=70000)
    assert GatewayConfig().grpc_port == 8001
    # In front of an existing Triton: its gRPC as given, else Triton's convention (HTTP port + 1).
    rt = Runtime(from_options(triton_url="10.0.0.5:8010"), GatewayMetrics())
    assert rt.triton_grpc_url == "10.0.0.5:8011"
    rt = Runtime(
        from_options(triton_url="http://h:8010", triton_grpc_url="g:9001"), GatewayMetrics()
    )
    assert rt.triton_grpc_url == "g:9001"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # uvicorn exits
def test_grpc_port_taken_fails_the_start_cleanly(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cfg = from_options(
            port=free_port(),
            grpc_port=taken.getsockname()[1],
            triton_url=dead,
            device="sim:v100",
            policy="max",
            state_dir=tmp_path,
        )
        failed_start(cfg)


def test_shutdown_answers_every_queued_call(tmp_path: Path) -> None:
    x = np.ones((1, 16), dtype=np.float32)
    answers: list[str] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        answers.append("ok" if error is None else f"{error.status()}:{error.message()}")
        if len(answers) == 6:
            done.set()

    with LiveSidecar(embedded_config(tmp_path, max_inflight=1)) as sc:
        assert admin(sc, "PUT", "/clock", {"clock_mhz": 135}).status_code == 200
        c = gclient(sc.grpc_url)
        for _ in range(6):
            c.async_infer("simnet", [gtensor(x)], callback)
        deadline = time.monotonic() + 10
        while admin(sc, "GET", "/state").json()["queue_length"] < 3:
            assert time.monotonic() < deadline, "the calls never queued"
            time.sleep(0.002)
    assert done.wait(30)
    # The one in flight finishes; those still queued are told why, none is left hanging.
    assert "ok" in answers
    assert set(answers) <= {"ok", "StatusCode.UNAVAILABLE:the sidecar is shutting down"}, answers
    assert "StatusCode.UNAVAILABLE:the sidecar is shutting down" in answers
