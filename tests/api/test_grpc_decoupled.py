"""A decoupled model (several responses per request) streamed through the sidecar's gRPC.

The embedded default has no decoupled model, so this test runs its own Triton (PyTriton, in a
child process like the embedded one) with ``countdown``: a request for ``n`` gets ``n``
responses, ``n-1`` down to ``0``, and the sidecar in front of it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from api.config import from_options
from api.embedded import free_port, remove_space
from tests.api.live import LiveSidecar


def _serve(http_port: int, grpc_port: int, metrics_port: int, log_path: str, space: str) -> None:
    """Child process: Triton with the decoupled ``countdown`` until SIGTERM; PyTriton's
    workspace in ``space`` (a short path: its sockets live there)."""
    os.setsid()
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    os.environ["LD_LIBRARY_PATH"] = f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    stopping = [False]
    signal.signal(signal.SIGTERM, lambda *_: stopping.__setitem__(0, True))
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig
    from pytriton.utils.workspace import Workspace

    def countdown(requests: list[Any]) -> Iterator[list[dict[str, Any]]]:
        (request,) = requests
        n = int(request["N"][0])
        for i in reversed(range(n)):
            time.sleep(0.01)
            yield [{"LEFT": np.array([i], dtype=np.int32)}]

    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=http_port,
        grpc_address="127.0.0.1",
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log_file=Path(log_path),
        exit_timeout_secs=2,
    )
    with Triton(config=config, workspace=Workspace(Path(space) / "ws")) as triton:
        triton.bind(
            "countdown",
            countdown,
            inputs=[Tensor(name="N", dtype=np.int32, shape=(1,))],
            outputs=[Tensor(name="LEFT", dtype=np.int32, shape=(1,))],
            config=ModelConfig(batching=False, decoupled=True),
        )
        triton.run()
        while not stopping[0]:
            time.sleep(0.1)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)


@pytest.fixture(scope="module")
def decoupled_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(HTTP url, gRPC url) of a Triton serving ``countdown``."""
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log_path = tmp_path_factory.mktemp("decoupled") / "triton.log"
    space = Path(tempfile.mkdtemp(prefix="triton-"))
    proc = mp.get_context("spawn").Process(
        target=_serve, args=(http_port, grpc_port, metrics_port, str(log_path), str(space))
    )
    proc.start()
    try:
        deadline = time.monotonic() + 120
        url = f"http://127.0.0.1:{http_port}/v2/models/countdown/ready"
        while True:
            assert proc.is_alive(), f"Triton exited; its log: {log_path}"
            assert time.monotonic() < deadline, f"Triton not ready; its log: {log_path}"
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
    finally:
        proc.terminate()
        proc.join(30)
        if proc.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        remove_space(space)


def _stream(url: str, counts: list[int]) -> list[tuple[str, int]]:
    """Send one request per count on one stream; every (request id, value) in arrival order."""
    client = grpcclient.InferenceServerClient(url)
    replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    for i, n in enumerate(counts):
        x = grpcclient.InferInput("N", [1], "INT32")
        x.set_data_from_numpy(np.array([n], dtype=np.int32))
        client.async_stream_infer("countdown", [x], request_id=f"r{i}")
    out = []
    for _ in range(sum(counts)):
        result, error = replies.get(timeout=30)
        assert error is None, error
        out.append((result.get_response().id, int(result.as_numpy("LEFT")[0])))
    client.stop_stream()
    client.close()
    return out


def test_decoupled_responses_stream_back_as_triton_sends_them(
    decoupled_triton: tuple[str, str], tmp_path: Path
) -> None:
    http_url, grpc_url = decoupled_triton
    cfg = from_options(
        triton_url=http_url,
        triton_grpc_url=grpc_url,
        device="sim:v100",
        policy="max",
        state_dir=tmp_path,
    )
    with LiveSidecar(cfg) as sc:
        via = _stream(sc.grpc_url, [3, 5])
        direct = _stream(grpc_url, [3, 5])
    for replies in (via, direct):
        for rid, n in (("r0", 3), ("r1", 5)):
            # Each request's responses, in Triton's order: n-1 down to 0.
            assert [v for r, v in replies if r == rid] == list(reversed(range(n)))
    assert sorted(via) == sorted(direct)
