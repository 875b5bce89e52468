"""Streams of tokens, without a server: event framing, token timing, OpenAI re-framing."""

from __future__ import annotations

import json

import pytest

from api.hints import BadRequestError
from api.metrics import GatewayMetrics
from api.routes.openai import CHAT, COMPLETIONS, OpenAiChunks, max_tokens_of, prompt_of
from api.streaming import TokenMeter, split_events, token_slos


def test_events_split_on_blank_lines_and_keep_the_rest() -> None:
    events, rest = split_events(b"data: a\n\ndata: b\r\n\r\ndata: c")
    assert events == [b"data: a", b"data: b"] and rest == b"data: c"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def sample(metrics: GatewayMetrics, name: str, labels: dict[str, str]) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_meter_times_tokens_whatever_the_chunking() -> None:
    clock, metrics = Clock(), GatewayMetrics()
    meter = TokenMeter(
        arrival_s=0.0, metrics=metrics, model_label="m", slos=(50.0, 10.0), time_source=clock
    )
    clock.now = 0.04
    meter.feed(b'data: {"text_output": "a"}\n')  # half an event: no token yet
    assert meter.tokens == 0
    meter.feed(b"\n")
    for i in range(1, 5):
        clock.now = 0.04 + 0.012 * i
        meter.feed(b'data: {"text_output": "b"}\n\n')
    meter.feed(b"data: [DONE]\n\n")
    meter.finish()
    assert meter.tokens == 5
    assert meter.ttft_s == pytest.approx(0.04) and meter.tpot_s == pytest.approx(0.012)
    assert sample(metrics, "sidecar_output_tokens_total", {"model": "m"}) == 5
    assert sample(metrics, "sidecar_inter_token_seconds_count", {"model": "m"}) == 4
    met = {"model": "m", "slo": "ttft", "met": "true"}
    missed = {"model": "m", "slo": "tpot", "met": "false"}
    assert sample(metrics, "sidecar_token_slo_requests_total", met) == 1
    assert sample(metrics, "sidecar_token_slo_requests_total", missed) == 1


def test_token_slos_come_from_parameters_then_headers() -> None:
    assert token_slos({"ttft_ms": 200}, {"x-tpot-ms": "30"}) == (200.0, 30.0)
    assert token_slos(None, {}) == (None, None)
    assert token_slos({"ttft_ms": "soon", "tpot_ms": -1}) == (None, None)


def test_triton_events_become_openai_chunks_then_done() -> None:
    chat = OpenAiChunks(CHAT, "llm", "cmpl-1", 7)
    out = chat.feed(b'data: {"text_output": "Hel"}\n\ndata: {"text_out')
    out += chat.feed(b'put": "lo"}\n\n') + chat.close()
    events, rest = split_events(out)
    assert rest == b"" and events[-1] == b"data: [DONE]"
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["Hel", "lo", None]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "cmpl-1" for c in chunks)
    text = OpenAiChunks(COMPLETIONS, "llm", "cmpl-2", 7)
    first = json.loads(split_events(text.feed(b'data: {"text_output": "x"}\n\n'))[0][0][6:])
    assert first["object"] == "text_completion" and first["choices"][0]["text"] == "x"


def test_prompts_and_lengths_are_checked() -> None:
    messages = {
        "messages": [{"role": "system", "content": "be"}, {"role": "user", "content": "hi"}]
    }
    assert prompt_of(CHAT, messages) == "system: be\nuser: hi"
    assert prompt_of(COMPLETIONS, {"prompt": ["one"]}) == "one"
    assert max_tokens_of({"max_tokens": 8}) == 8 and max_tokens_of({}) == 16
    bad_chats: list[dict[str, object]] = [{"messages": []}, {"messages": ["hi"]}]
    for bad in bad_chats:
        with pytest.raises(BadRequestError):
            prompt_of(CHAT, bad)
    with pytest.raises(BadRequestError, match="max_tokens"):
        max_tokens_of({"max_tokens": 0})
