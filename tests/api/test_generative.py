"""Generative models through the sidecar, live: the embedded ``simllm`` on a simulated H100.

Clients as users run them: the ``openai`` SDK (chat completions, streamed and not), plain HTTP
for Triton's ``generate``/``generate_stream`` (byte for byte what Triton itself sends), and
``tritonclient``'s gRPC stream for the decoupled model.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient

from api.embedded_llm import SIMLLM
from tests.api.live import LiveSidecar, embedded_config

ADMIN = {"Authorization": "Bearer test-token"}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveSidecar]:
    config = embedded_config(
        tmp_path_factory.mktemp("generative"), device="sim:h100", profile_models=(), max_queue=64
    )
    with LiveSidecar(config) as sc:
        yield sc


def events(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(e[len(b"data: ") :]) for e in body.split(b"\n\n") if e.startswith(b"data:")]


def test_openai_sdk_streams_a_chat_through_the_sidecar(sidecar: LiveSidecar) -> None:
    client = openai.OpenAI(base_url=f"http://{sidecar.url}/v1", api_key="none", max_retries=0)
    stream = client.chat.completions.create(
        model=SIMLLM,
        messages=[{"role": "user", "content": "one two three four"}],
        max_tokens=6,
        stream=True,
        extra_body={"priority": 1, "ttft_ms": 2000, "tpot_ms": 500},
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert text == "t1 t2 t3 t4 t5 t6 "
    whole = client.chat.completions.create(
        model=SIMLLM, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert whole.choices[0].message.content == "t1 t2 t3 "
    assert whole.usage is not None and whole.usage.completion_tokens == 3
    models = client.models.list()
    assert SIMLLM in {m.id for m in models.data}
    with pytest.raises(openai.BadRequestError, match="priority must be in"):
        client.chat.completions.create(
            model=SIMLLM,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"priority": 9},
        )
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi")
    metrics = sidecar.get("/metrics").text
    assert f'sidecar_output_tokens_total{{model="{SIMLLM}"}}' in metrics
    assert "sidecar_time_to_first_token_seconds_count" in metrics
    assert f'met="true",model="{SIMLLM}",slo="ttft"' in metrics


def test_generate_stream_is_byte_for_byte_tritons(sidecar: LiveSidecar) -> None:
    assert sidecar.runtime.embedded is not None
    body = {"text_input": "a b c", "max_tokens": 4, "parameters": {"nice": 5}}
    through = httpx.post(
        f"http://{sidecar.url}/v2/models/{SIMLLM}/generate_stream", json=body, timeout=30
    )
    direct = httpx.post(
        f"http://{sidecar.runtime.embedded.url}/v2/models/{SIMLLM}/generate_stream",
        json=body,
        timeout=30,
    )
    assert through.status_code == direct.status_code == 200
    assert through.content == direct.content
    assert [e["text_output"] for e in events(through.content)] == ["t1 ", "t2 ", "t3 ", "t4 "]
    one = httpx.post(f"http://{sidecar.url}/v2/models/{SIMLLM}/generate", json=body, timeout=30)
    assert one.status_code == 200
    bad = httpx.post(
        f"http://{sidecar.url}/v2/models/{SIMLLM}/generate_stream",
        json={**body, "parameters": {"nice": 99}},
        timeout=30,
    )
    assert bad.status_code == 400 and "nice must be in" in bad.json()["error"]


def test_a_decoupled_model_streams_over_grpc(sidecar: LiveSidecar) -> None:
    replies: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(sidecar.grpc_url)
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"x y"], dtype=object))
        tokens = grpcclient.InferInput("max_tokens", [1], "INT32")
        tokens.set_data_from_numpy(np.array([3], dtype=np.int32))
        client.async_stream_infer(SIMLLM, [text, tokens])
        got = []
        for _ in range(3):
            result, error = replies.get(timeout=30)
            assert error is None
            got.append(result.as_numpy("text_output")[0])
        assert got == [b"t1 ", b"t2 ", b"t3 "]
    finally:
        client.stop_stream()
        client.close()


def test_a_client_that_leaves_mid_stream_frees_its_sequence(sidecar: LiveSidecar) -> None:
    url = f"http://{sidecar.url}/v2/models/{SIMLLM}/generate_stream"
    body = {"text_input": "long", "max_tokens": 4000, "parameters": {"client_id": "leaver"}}
    with httpx.Client(timeout=30) as client, client.stream("POST", url, json=body) as reply:
        assert reply.status_code == 200
        chunks = reply.iter_bytes()
        next(chunks)
        state = sidecar.get("/admin/state", headers=ADMIN).json()
        assert state["models"][SIMLLM]["inflight"] == 1
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        state = sidecar.get("/admin/state", headers=ADMIN).json()
        if state["models"][SIMLLM]["inflight"] == 0:
            break
        time.sleep(0.05)
    assert state["models"][SIMLLM]["inflight"] == 0
    metrics = sidecar.get("/metrics").text
    assert any(
        line.startswith("sidecar_requests_total{")
        and 'client="leaver"' in line
        and 'outcome="abandoned"' in line
        for line in metrics.splitlines()
    )


def test_an_openai_engine_upstream_passes_through(sidecar: LiveSidecar, tmp_path: Path) -> None:
    """A second sidecar whose /v1 upstream is the first one (an OpenAI-compatible engine)."""
    config = embedded_config(
        tmp_path,
        triton_url=sidecar.runtime.embedded.url,  # type: ignore[union-attr]
        device="sim:h100",
        profile_models=(),
        upstream=f"openai=http://{sidecar.url}",
    )
    with LiveSidecar(config) as front:
        client = openai.OpenAI(base_url=f"http://{front.url}/v1", api_key="none", max_retries=0)
        stream = client.completions.create(model=SIMLLM, prompt="a", max_tokens=3, stream=True)
        assert "".join(c.choices[0].text for c in stream) == "t1 t2 t3 "
        assert SIMLLM in {m.id for m in client.models.list().data}


def test_the_token_policy_runs_the_engine_live(sidecar: LiveSidecar) -> None:
    """Switched to ``tokens``: streams are released under its admission limit, every token
    reaches it, the GPU's energy counter too, and its state is in the admin view."""
    base = f"http://{sidecar.url}/admin/policy"
    changed = httpx.put(base, headers=ADMIN, json={"policy": "tokens"}, timeout=30)
    assert changed.status_code == 200 and changed.json()["policy"] == "tokens"
    try:
        client = openai.OpenAI(base_url=f"http://{sidecar.url}/v1", api_key="none", max_retries=0)
        measured: dict[str, float] = {}
        deadline = time.monotonic() + 30.0
        while not measured and time.monotonic() < deadline:
            stream = client.completions.create(
                model=SIMLLM, prompt="a b", max_tokens=40, stream=True
            )
            assert "".join(c.choices[0].text for c in stream).startswith("t1 t2 t3 t4 t5 ")
            state = sidecar.get("/admin/state", headers=ADMIN).json()
            (tokens,) = state["feedback"]  # the policy's own state
            measured = tokens["measured_j_per_token"]
        assert state["policy"] == "tokens" and tokens["running"] == 0
        assert tokens["admission_limit"] >= 1
        # Joules per output token at the clocks that ran, from the simulated GPU's counter.
        assert measured and all(0 < j < 100 for j in measured.values())
    finally:
        httpx.put(base, headers=ADMIN, json={"policy": "max"}, timeout=30)


TENANTS = """
[defaults]
highest_priority = 0

[[tenant]]
token = "tok-search"
client_id = "search"
highest_priority = 1
"""


def test_priority_and_tenants_order_the_streams_that_wait(tmp_path: Path) -> None:
    """One stream at a time at the engine (``--max-inflight 1``): while one runs, three
    default-level streams queue, then a stream that claims priority 1 without a token (held to
    the default level by the tenants file), then the ``search`` tenant's, whose token grants
    priority 1. The tenant's stream starts first; the claim without a token gets no place
    ahead of those that came before it."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    config = embedded_config(
        tmp_path, device="sim:h100", profile_models=(), max_inflight=1, tenants=tenants
    )
    url_of = "http://{}/v2/models/" + SIMLLM + "/generate_stream"
    first_token_s: dict[str, float] = {}

    def stream(name: str, priority: int, token: str | None) -> None:
        body = {"text_input": "a b", "max_tokens": 3, "parameters": {"priority": priority}}
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        with (
            httpx.Client(timeout=120) as client,
            client.stream("POST", url, json=body, headers=headers) as reply,
        ):  # the reply's head comes when the stream is sent to the engine
            assert reply.status_code == 200, reply.read()
            for _chunk in reply.iter_bytes():
                first_token_s.setdefault(name, time.monotonic())

    with LiveSidecar(config) as sc:
        url = url_of.format(sc.url)
        body = {"text_input": "long", "max_tokens": 4000, "parameters": {"client_id": "first"}}
        with httpx.Client(timeout=60) as client, client.stream("POST", url, json=body) as reply:
            chunks = reply.iter_bytes()
            next(chunks)  # the engine's one place is taken
            threads = []
            for name, priority, token in [
                ("early-1", 0, None),
                ("early-2", 0, None),
                ("early-3", 0, None),
                ("claims-1", 1, None),
                ("search", 1, "tok-search"),
            ]:
                t = threading.Thread(target=stream, args=(name, priority, token))
                t.start()
                threads.append(t)
                deadline = time.monotonic() + 10
                while (
                    sc.get("/admin/state", headers=ADMIN).json()["models"][SIMLLM]["queued"]
                    < len(threads)
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.02)  # queued, in this order
            state = sc.get("/admin/state", headers=ADMIN).json()["models"][SIMLLM]
            assert (state["queued"], state["inflight"]) == (5, 1), state
        # the first client leaves: its place goes to the queue
        for t in threads:
            t.join(60)
            assert not t.is_alive()
    assert len(first_token_s) == 5, first_token_s
    order = sorted(first_token_s, key=first_token_s.__getitem__)
    assert order[0] == "search", order
    assert order.index("claims-1") > order.index("early-1"), order
