"""One sidecar, several GPUs: the device list, one Triton per GPU, placement through the one
admission path, and every GPU in the metrics and the admin state."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from api.admission import Inbound, Outcome, admit
from api.config import from_options
from api.dispatcher import GpuDispatcher, Job
from api.http_infer import HttpBody
from api.metrics import GatewayMetrics
from api.runtime import Gpu, Runtime
from api.upstream import Upstream, UpstreamResponse
from dvfs.factory import parse_device_list
from dvfs.simulated import SimulatedDevice
from loadgen.classes import RequestClass
from loadgen.engine import InputTensor
from loadgen.grpc_client import GrpcClient, grpc_payloads
from scheduler.core import Scheduler
from tests.api.live import LiveSidecar, simnet_tables

ADMIN = {"Authorization": "Bearer test-token"}
BODY = (
    b'{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":'
    + str([1.0] * 16).encode()
    + b"}]}"
)


def test_device_lists() -> None:
    assert parse_device_list("nvml:0,1,2,3") == ["nvml:0", "nvml:1", "nvml:2", "nvml:3"]
    assert parse_device_list("sim:v100x2") == ["sim:v100", "sim:v100"]
    assert parse_device_list("sim:V100, a100") == ["sim:v100", "sim:a100"]
    assert parse_device_list("sim:h100,nvml:1") == ["sim:h100", "nvml:1"]
    for bad, message in [
        ("nvml:0,0", "an NVML GPU named twice"),
        ("v100", "expected 'sim:<profile>' or 'nvml:<index>'"),
        ("sim:v100,,a100", "an empty item"),
        ("sim:v100x0", "at least one GPU"),
        ("sim:b200", "unknown profile"),
        ("nvml:0,one", "the NVML index must be a non-negative integer"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_device_list(bad)


def test_one_triton_per_gpu_or_a_clear_error() -> None:
    ok = from_options(device="nvml:0,1", triton_url="a:8000,b:8000", triton_grpc_url="a:1,b:1")
    assert ok.triton_urls == ["a:8000", "b:8000"] and ok.triton_grpc_urls == ["a:1", "b:1"]
    with pytest.raises(ValueError, match=r"--triton-url names 3 Triton\(s\) for the 2 GPU\(s\)"):
        from_options(device="nvml:0,1", triton_url="a:1,b:1,c:1")
    with pytest.raises(ValueError, match="--triton-grpc-url names 1 Triton"):
        from_options(device="sim:v100x2", triton_url="a:1,b:1", triton_grpc_url="a:2")
    with pytest.raises(ValueError, match="give --device with as many GPUs"):
        from_options(triton_url="a:1,b:1")
    with pytest.raises(ValueError, match="placement must be one of spread, energy, round-robin"):
        from_options(placement="random")
    assert from_options(placement="energy", pack_slo_share=0.4).placement.pack_slo_share == 0.4


def two_gpu_runtime(tmp_path: Path, **options: Any) -> Runtime:
    """A started-looking runtime of two simulated GPUs, with real dispatchers sharing one
    ledger; Triton is never asked (each test's ``send`` answers)."""
    config = from_options(
        device="sim:v100x2", triton_url="127.0.0.1:1,127.0.0.1:2", policy="max", **options
    )
    rt = Runtime(config, GatewayMetrics())
    tables = simnet_tables()
    for i in range(2):
        device = SimulatedDevice("v100", index=i, state_path=tmp_path / f"gpu{i}.state")
        scheduler: Scheduler[Job] = Scheduler(
            tables, config.policy.build(device.supported_clocks_mhz()), config.scheduler,
            ledger=rt.ledger,
        )  # fmt: skip
        upstream = Upstream(f"127.0.0.1:{i + 1}")
        dispatcher = GpuDispatcher(
            gpu=str(i), scheduler=scheduler, device=device, upstream=upstream,
            metrics=rt.metrics, shadow=True,
        )  # fmt: skip
        rt.gpus.append(Gpu(str(i), "sim:v100", device=device, upstream=upstream,
                           dispatcher=dispatcher))  # fmt: skip
    rt.models.known.add("simnet")
    return rt


def test_admission_places_each_request_and_says_where(tmp_path: Path) -> None:
    rt = two_gpu_runtime(tmp_path)
    sent_to: list[str] = []

    async def send(upstream: Upstream) -> UpstreamResponse:
        sent_to.append(upstream.url)
        return UpstreamResponse(200, b"{}", {})

    async def main() -> list[str | None]:
        for d in rt.dispatchers:
            d.start()
        try:
            out = []
            for i in range(4):
                body = HttpBody(BODY, {})
                inbound = Inbound("http", "simnet", body, {}, float(i), Job(send=send))
                admission = await admit(rt, inbound)
                assert admission.outcome is Outcome.OK
                out.append(admission.gpu)
            rt.gpus[1].watch = type("Down", (), {"up": False, "live": lambda self: True})()
            inbound = Inbound("http", "simnet", HttpBody(BODY, {}), {}, 9.0, Job(send=send))
            out.append((await admit(rt, inbound)).gpu)
            return out
        finally:
            for d in rt.dispatchers:
                await d.stop()

    placed = asyncio.run(main())
    # An idle node spreads (each request alone finishes as soon on either GPU); a GPU whose
    # Triton is down takes nothing.
    assert placed[:4] == ["0", "1", "0", "1"] and placed[4] == "0"
    assert sent_to == ["http://127.0.0.1:1", "http://127.0.0.1:2"] * 2 + ["http://127.0.0.1:1"]
    served = {
        g: rt.metrics.registry.get_sample_value("sidecar_gpu_requests_total", {"gpu": g})
        for g in ("0", "1")
    }
    assert served == {"0": 3.0, "1": 2.0}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveSidecar]:
    """The embedded default on two simulated GPUs: two Tritons, one sidecar."""
    state = tmp_path_factory.mktemp("state")
    table = state / "simnet.json"
    simnet_tables().save(table)
    config = from_options(
        device="sim:v100x2",
        state_dir=state,
        table=(table,),
        learn=False,
        slo_ms=200.0,
        admin_token="test-token",
    )
    with LiveSidecar(config) as sc:
        yield sc


def test_both_gpus_serve_tritonclient_over_http_and_grpc(node: LiveSidecar) -> None:
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    http = httpclient.InferenceServerClient(node.url)
    tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(x)
    assert (http.infer("simnet", [tensor]).as_numpy("OUTPUT0") == 2 * x).all()
    grpc = grpcclient.InferenceServerClient(node.grpc_url)
    gtensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    gtensor.set_data_from_numpy(x)
    assert (grpc.infer("simnet", [gtensor]).as_numpy("OUTPUT0") == 2 * x).all()
    assert grpc.is_model_ready("simnet") and grpc.get_model_metadata("simnet").name == "simnet"

    def one(_: int) -> str:
        reply = httpx.post(f"http://{node.url}/v2/models/simnet/infer", content=BODY, timeout=30)
        assert reply.status_code == 200
        return reply.headers["x-sidecar-gpu"]

    with ThreadPoolExecutor(8) as pool:
        by_gpu = Counter(pool.map(one, range(80)))
    assert set(by_gpu) == {"0", "1"}, by_gpu

    state = httpx.get(f"http://{node.url}/admin/state", headers=ADMIN, timeout=30).json()
    assert [g["gpu"] for g in state["gpus"]] == ["0", "1"]
    assert state["gpus"][0]["triton_url"] != state["gpus"][1]["triton_url"]
    assert state["placement"]["mode"] == "spread" and state["gpu"] == "0"

    text = httpx.get(f"http://{node.url}/metrics", timeout=30).text
    families = {f.name: f for f in text_string_to_metric_families(text)}  # one family per name
    served = {s.labels["gpu"]: s.value for s in families["sidecar_gpu_requests"].samples
              if s.name.endswith("_total")}  # fmt: skip
    assert served["0"] > 0 and served["1"] > 0
    assert sum(served.values()) >= 82
    clocks = {s.labels["gpu"] for s in families["sidecar_gpu_clock_hertz"].samples}
    assert clocks == {"0", "1"}
    assert {s.labels["gpu"] for s in families["sidecar_gpu_clock_set_hertz"].samples} == {"0", "1"}
    assert (
        "# HELP sidecar_gpu_clock_hertz " in text
        and text.count("# HELP sidecar_gpu_clock_hertz ") == 1
    )


def test_grpc_traffic_alone_is_placed_on_both_gpus(node: LiveSidecar) -> None:
    """tritonclient's gRPC client, unchanged, sends the requests; each GPU's Triton answers
    some (the counters under ``gpu``), and the raw reply names its GPU in trailing metadata."""

    def served() -> dict[str, float]:
        text = httpx.get(f"http://{node.url}/metrics", timeout=30).text
        family = next(
            f for f in text_string_to_metric_families(text) if f.name == "sidecar_gpu_requests"
        )
        return {s.labels["gpu"]: s.value for s in family.samples if s.name.endswith("_total")}

    before = served()
    x = np.arange(16, dtype=np.float32).reshape(1, 16)

    def one(_: int) -> None:
        client = grpcclient.InferenceServerClient(node.grpc_url)
        tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(x)
        assert (client.infer("simnet", [tensor]).as_numpy("OUTPUT0") == 2 * x).all()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(40)))
    after = served()
    by_gpu = {g: after[g] - before.get(g, 0.0) for g in after}
    assert by_gpu["0"] > 0 and by_gpu["1"] > 0, by_gpu
    assert sum(by_gpu.values()) == 40  # nothing else reached a Triton meanwhile

    async def gpus_named() -> set[str | None]:
        request = grpc_payloads(
            [RequestClass("default")], [InputTensor("INPUT0", "FP32", x)], "simnet", None
        )[0].body
        async with GrpcClient(node.grpc_url) as client:
            replies = [await client.infer(request) for _ in range(4)]
        assert all(status == 200 for status, _, _ in replies)
        return {gpu for _, _, gpu in replies}

    assert asyncio.run(gpus_named()) == {"0", "1"}  # an idle node spreads
