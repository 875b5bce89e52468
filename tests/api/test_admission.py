"""The one admission path, without Triton: every outcome, the same over HTTP and gRPC bodies.

The runtime is real (metrics, model index, dispatcher, scheduler core, policy); the upstream is a
future the test answers, and the device a simulated GPU.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tritonclient.grpc import service_pb2

from api.admission import Admission, Inbound, Outcome, RequestBody, admit
from api.config import from_options
from api.dispatcher import GpuDispatcher, Job
from api.grpc_frontend.unary import GrpcBody
from api.http_infer import HttpBody
from api.metrics import GatewayMetrics
from api.runtime import Runtime
from api.upstream import Upstream, UpstreamResponse
from dvfs.simulated import SimulatedDevice
from scheduler.core import Scheduler
from time2clock.table import TableSet

OK = UpstreamResponse(200, b"{}", {})
Send = Callable[[Upstream], Awaitable[Any]]


@pytest.fixture
def device(tmp_path: Path) -> Iterator[SimulatedDevice]:
    dev = SimulatedDevice("v100", state_path=tmp_path / "gpu.state")
    yield dev
    dev.close()


def runtime(device: SimulatedDevice, **options: Any) -> Runtime:
    """A started-looking runtime: its dispatcher real, its Triton never asked (no upstream)."""
    config = from_options(triton_url="127.0.0.1:1", policy="max", max_queue=2, **options)
    rt = Runtime(config, GatewayMetrics())
    scheduler: Scheduler[Job] = Scheduler(
        TableSet(), config.policy.build(device.supported_clocks_mhz()), config.scheduler
    )
    rt.dispatcher = GpuDispatcher(
        gpu="0",
        scheduler=scheduler,
        device=device,
        upstream=Upstream("127.0.0.1:1"),
        metrics=rt.metrics,
        shadow=True,
    )
    rt.models.known.add("m")  # with no upstream, any other name also "exists" (503 later)
    return rt


def http_body(params: dict[str, object] | None = None, shape: list[int] | None = None) -> bytes:
    shape = shape or [1, 2]
    tensor = {"name": "x", "datatype": "FP32", "shape": shape, "data": [0.0] * (shape[0] * 2)}
    return json.dumps({"inputs": [tensor], "parameters": params or {}}).encode()


def grpc_body(params: dict[str, int] | None = None, shape: list[int] | None = None) -> GrpcBody:
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=shape or [1, 2])
    tensor.contents.fp32_contents.extend([0.0] * 2)
    for key, value in (params or {}).items():
        request.parameters[key].int64_param = value
    return GrpcBody(request)


def inbound(body: RequestBody, send: Send, headers: dict[str, str] | None = None) -> Inbound:
    protocol = "grpc" if isinstance(body, GrpcBody) else "http"
    return Inbound(protocol, "m", body, headers or {}, 0.0, Job(send=send))


async def answered(_: Upstream) -> UpstreamResponse:
    return OK


def counted(rt: Runtime, outcome: Outcome, protocol: str) -> float:
    value = rt.metrics.registry.get_sample_value(
        "sidecar_requests_total",
        {
            "model": "m",
            "priority": "2",
            "client": "default",
            "outcome": outcome.value,
            "protocol": protocol,
        },
    )
    return value or 0.0


@pytest.mark.parametrize("make", [lambda **kw: HttpBody(http_body(**kw), {}), grpc_body])
def test_each_outcome_is_the_same_over_http_and_grpc(
    device: SimulatedDevice, make: Callable[..., RequestBody]
) -> None:
    async def main() -> list[Admission]:
        rt = runtime(device, max_request_elements=100)
        rt.dispatcher.start()  # type: ignore[union-attr]
        try:
            return [
                await admit(rt, inbound(make(), answered)),
                await admit(rt, inbound(make(params={"priority": 7}), answered)),
                await admit(rt, inbound(make(shape=[1, 1000]), answered)),
            ]
        finally:
            await rt.dispatcher.stop()  # type: ignore[union-attr]

    ok, bad_hint, too_big = asyncio.run(main())
    assert ok.outcome is Outcome.OK and ok.answer is OK
    assert (
        bad_hint.outcome is Outcome.BAD_REQUEST and "priority must be in 0..2" in bad_hint.message
    )
    assert too_big.outcome is Outcome.BAD_REQUEST
    assert "more than 100 elements" in too_big.message


def test_absurd_grpc_shape_is_refused_before_the_queue(device: SimulatedDevice) -> None:
    sent: list[int] = []

    async def send(_: Upstream) -> UpstreamResponse:
        sent.append(1)
        return OK

    async def main() -> Admission:
        rt = runtime(device)
        return await admit(rt, inbound(grpc_body(shape=[1, 10**12]), send))

    result = asyncio.run(main())
    assert result.outcome is Outcome.BAD_REQUEST and "elements" in result.message
    assert not sent


def test_draining_and_triton_down_ask_to_retry(device: SimulatedDevice) -> None:
    async def main() -> tuple[Admission, Admission]:
        rt = runtime(device)
        rt.draining = True
        first = await admit(rt, inbound(grpc_body(), answered))
        rt.draining = False
        rt.watch = type("Down", (), {"up": False})()
        return first, await admit(rt, inbound(grpc_body(), answered))

    draining, down = asyncio.run(main())
    assert draining.outcome is down.outcome is Outcome.UNAVAILABLE
    assert draining.retry and down.retry


def test_a_full_queue_rejects_with_retry(device: SimulatedDevice) -> None:
    """With the upstream holding every request, the queue (2) fills and the next is refused."""

    async def main() -> list[Admission]:
        rt = runtime(device, max_inflight=1)
        rt.dispatcher.start()  # type: ignore[union-attr]
        hold: asyncio.Future[UpstreamResponse] = asyncio.get_running_loop().create_future()

        async def held(_: Upstream) -> UpstreamResponse:
            return await hold

        tasks = [asyncio.create_task(admit(rt, inbound(grpc_body(), held))) for _ in range(4)]
        for _ in range(10):
            await asyncio.sleep(0)
        hold.set_result(OK)
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            await rt.dispatcher.stop()  # type: ignore[union-attr]

    outcomes = [a.outcome for a in asyncio.run(main())]
    assert outcomes.count(Outcome.REJECTED) == 1 and outcomes.count(Outcome.OK) == 3


def test_a_client_that_leaves_is_abandoned_and_leaves_the_queue(device: SimulatedDevice) -> None:
    async def main() -> tuple[float, float, int]:
        rt = runtime(device, max_inflight=1)
        dispatcher = rt.dispatcher
        assert dispatcher is not None
        dispatcher.start()
        hold: asyncio.Future[UpstreamResponse] = asyncio.get_running_loop().create_future()

        async def held(_: Upstream) -> UpstreamResponse:
            return await hold

        first = asyncio.create_task(admit(rt, inbound(HttpBody(http_body(), {}), held)))
        second = asyncio.create_task(admit(rt, inbound(HttpBody(http_body(), {}), held)))
        for _ in range(10):
            await asyncio.sleep(0)
        queued = dispatcher.scheduler.queue_len
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        hold.set_result(OK)
        await first
        await dispatcher.stop()
        return counted(rt, Outcome.ABANDONED, "http"), counted(rt, Outcome.OK, "http"), queued

    abandoned, ok, queued = asyncio.run(main())
    assert queued == 1
    assert abandoned == 1.0 and ok == 1.0


def test_unknown_tenant_token_is_unauthorized(device: SimulatedDevice, tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text('[[tenant]]\ntoken = "secret-a"\nclient_id = "a"\n')

    async def main() -> Admission:
        rt = runtime(device, tenants=tenants)
        return await admit(rt, inbound(grpc_body(), answered, {"authorization": "Bearer nope"}))

    assert asyncio.run(main()).outcome is Outcome.UNAUTHORIZED


def test_an_slo_the_time_outside_leaves_nothing_of_is_a_bad_request(
    device: SimulatedDevice,
) -> None:
    """With ``--slo-outside-ms``, an SLO hint no longer than it is refused over both protocols,
    and nothing is sent upstream; a longer one is served."""
    sent: list[int] = []

    async def send(_: Upstream) -> UpstreamResponse:
        sent.append(1)
        return OK

    async def main() -> list[Admission]:
        rt = runtime(device, slo_ms=40.0, slo_outside_ms=2.0)
        rt.dispatcher.start()  # type: ignore[union-attr]
        try:
            return [
                await admit(rt, inbound(HttpBody(http_body({"slo_ms": 2}), {}), send)),
                await admit(rt, inbound(HttpBody(http_body(), {}), send, {"x-slo-ms": "1.5"})),
                await admit(rt, inbound(grpc_body({"slo_ms": 2}), send)),
                await admit(rt, inbound(grpc_body({"slo_ms": 3}), send)),
            ]
        finally:
            await rt.dispatcher.stop()  # type: ignore[union-attr]

    *refused, served = asyncio.run(main())
    assert all(a.outcome is Outcome.BAD_REQUEST for a in refused)
    assert all("leaves nothing for the sidecar" in a.message for a in refused)
    assert served.outcome is Outcome.OK and sent == [1]
