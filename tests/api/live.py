"""The real sidecar for tests: :class:`api.server.SidecarServer` plus small HTTP helpers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx
from tritonclient.utils import InferenceServerException

from api.config import GatewayConfig, from_options
from api.embedded import SIMNET
from api.server import SidecarServer
from simulator.simulate import profiled_tables
from time2clock.table import TableSet


class LiveSidecar(SidecarServer):
    """A :class:`SidecarServer` on a free port, with ``get``/``post`` shortcuts."""

    def __init__(self, config: GatewayConfig) -> None:
        super().__init__(replace(config, port=0, grpc_port=0))

    def get(self, path: str, **kw: object) -> httpx.Response:
        return httpx.get(f"http://{self.url}{path}", timeout=30.0, **kw)  # type: ignore[arg-type]

    def post(self, path: str, **kw: object) -> httpx.Response:
        return httpx.post(f"http://{self.url}{path}", timeout=60.0, **kw)  # type: ignore[arg-type]


def failed_start(config: GatewayConfig) -> None:
    """Start a sidecar that must fail to start: its start raises, and its server thread is gone
    after (what it printed is the caller's to read)."""
    server = SidecarServer(config)
    try:
        server.__enter__()
    except RuntimeError as err:
        assert "failed to start" in str(err), err
    else:
        server.close()
        raise AssertionError("the sidecar started")
    server.close()
    assert not server.thread.is_alive()


def simnet_tables(gpu: str = "v100") -> TableSet:
    """The simulator's profiled CNN table, named ``simnet`` as the embedded model it emulates."""
    cnn = next(iter(profiled_tables(gpu)))
    curves = {b: replace(c, model=SIMNET) for b, c in cnn.curves.items()}
    return TableSet([replace(cnn, model=SIMNET, curves=curves)])


def embedded_config(tmp: Path, **overrides: object) -> GatewayConfig:
    """The embedded default, ``simnet`` profiled quickly (6 clocks × 10 requests per batch size),
    tables cached in ``tmp``; ``simbert`` runs unprofiled (at the top clock)."""
    base: dict[str, object] = dict(
        state_dir=tmp,
        profile_models=("simnet",),
        profile_clocks=6,
        profile_requests=10,
        slo_ms=60.0,
        admin_token="test-token",
        max_queue=8,
    )
    base.update(overrides)
    return from_options(**base)


def timeout_in_queue(
    sc: LiveSidecar, infer: Callable[[int, int | None], object]
) -> tuple[list[str], str]:
    """Requests fill the (slow) GPU and its queue, then one more with a 1 ms ``timeout`` waits
    behind them. ``infer(i, timeout_us)`` sends request ``i`` (0..7) with a tritonclient (HTTP
    or gRPC). Returns how the others ended and how the last one did: ``"ok"`` or
    ``"status:message"``."""

    def state() -> dict[str, int]:
        reply = sc.get("/admin/state", headers={"Authorization": "Bearer test-token"})
        return dict(reply.json())

    fillers = state()["max_inflight"] + 3  # three waiting: the queue stays long enough to see
    go = threading.Barrier(fillers)
    outcomes: dict[int, str] = {}

    def run(i: int) -> None:
        if i < fillers:
            go.wait()
        try:
            infer(i, 1000 if i == fillers else None)
            outcomes[i] = "ok"
        except InferenceServerException as err:
            outcomes[i] = f"{err.status()}:{err.message()}"

    threads = [threading.Thread(target=run, args=(i,)) for i in range(fillers + 1)]
    for t in threads[:fillers]:
        t.start()
    deadline = time.monotonic() + 10
    while state()["queue_length"] < 1:
        assert time.monotonic() < deadline, "the first requests never filled the GPU"
        time.sleep(0.002)
    threads[fillers].start()  # behind them, with a 1 ms timeout
    for t in threads:
        t.join(30)
    return [outcomes[i] for i in range(fillers)], outcomes[fillers]
