"""loadgen's generative mode without the live stack: SSE parsing and timing, request bodies,
synthetic lengths, load modes, exports and the CLI, against a scripted streaming server whose
timing is known; and its agreement with the openai SDK client on that server."""

from __future__ import annotations

import asyncio
import csv
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from benchmarks.genai_agreement import Settings, deal, measure, rows
from loadgen.__main__ import main as loadgen_main
from loadgen.engine import arrival_times, new_session, schedule
from loadgen.genai import CSV_EXPORT, JSON_EXPORT, RECORDS_EXPORT, extra_input
from loadgen.generative import STAT_COLUMNS
from loadgen.genrun import GenLoad, closed_loop, open_loop, send_times
from loadgen.stream import (
    GENERATE_STREAM,
    OPENAI_CHAT,
    OPENAI_COMPLETIONS,
    GenTarget,
    SseReader,
    StreamError,
    endpoint_name,
    event_text,
    request_body,
    stream_once,
)
from loadgen.synthetic import GenRequest, LengthSpec, RequestSource
from tests.loadgen.sse_server import Script, serving

REQUEST = GenRequest("a b c", 3, 5)


def test_sse_reader_joins_split_chunks_crlf_and_multiline_data() -> None:
    reader = SseReader()
    assert reader.feed(b'data: {"a"') == []
    assert reader.feed(b": 1}\n") == []
    assert reader.feed(b"\n") == [b'{"a": 1}']
    assert reader.feed(b": a comment\r\nevent: x\r\ndata: one\r\ndata:two\r\n\r\n") == [b"one\ntwo"]
    assert reader.feed(b"data: [DONE]\n\ndata: b\n\n") == [b"[DONE]", b"b"]
    assert reader.feed(b"\n\n") == []  # blank lines alone dispatch nothing


def test_event_text_per_endpoint_and_errors() -> None:
    chat = b'{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}'
    role = b'{"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}'
    assert event_text(OPENAI_CHAT, chat) == "hi"
    assert event_text(OPENAI_CHAT, role) == ""
    assert event_text(OPENAI_COMPLETIONS, b'{"choices":[{"text":"x"}]}') == "x"
    assert event_text(GENERATE_STREAM, b'{"text_output":"t1 "}') == "t1 "
    assert event_text(OPENAI_CHAT, b"[DONE]") is None
    with pytest.raises(StreamError, match="engine died"):
        event_text(GENERATE_STREAM, b'{"error": "engine died"}')
    with pytest.raises(StreamError, match="quota"):
        event_text(OPENAI_CHAT, b'{"error": {"message": "quota"}}')
    with pytest.raises(StreamError, match="not JSON"):
        event_text(OPENAI_CHAT, b"garbage")


def test_request_bodies_carry_hints_where_each_protocol_has_room() -> None:
    hints = {"priority": 1, "ttft_ms": 500.0}
    chat = json.loads(request_body(OPENAI_CHAT, "m", REQUEST, hints, {"ignore_eos": True}))
    assert chat == {
        "model": "m",
        "stream": True,
        "messages": [{"role": "user", "content": "a b c"}],
        "max_tokens": 5,
        "priority": 1,
        "ttft_ms": 500.0,
        "ignore_eos": True,
    }
    done = json.loads(request_body(OPENAI_COMPLETIONS, "m", GenRequest("p", 1, None)))
    assert done == {"model": "m", "stream": True, "prompt": "p"}
    gen = json.loads(request_body(GENERATE_STREAM, "m", REQUEST, hints))
    assert gen == {"text_input": "a b c", "max_tokens": 5, "parameters": hints}
    assert endpoint_name("chat") == OPENAI_CHAT and endpoint_name("completions") == (
        OPENAI_COMPLETIONS
    )
    with pytest.raises(ValueError, match="endpoint must be one of"):
        endpoint_name("embeddings")
    assert extra_input("ignore_eos:true") == ("ignore_eos", True)
    assert extra_input("stop:end") == ("stop", "end")


def test_synthetic_lengths_are_seeded_normal_and_at_least_one() -> None:
    a = RequestSource(LengthSpec(200, 40.0), LengthSpec(50, 10.0), seed=3).take(400)
    b = RequestSource(LengthSpec(200, 40.0), LengthSpec(50, 10.0), seed=3).take(400)
    assert a == b
    isl = [r.input_tokens for r in a]
    osl = [r.output_tokens or 0 for r in a]
    assert abs(statistics.fmean(isl) - 200) < 8 and abs(statistics.stdev(isl) - 40) < 6
    assert abs(statistics.fmean(osl) - 50) < 2 and abs(statistics.stdev(osl) - 10) < 2
    assert all(len(r.prompt.split()) == r.input_tokens for r in a)
    tiny = RequestSource(LengthSpec(1, 50.0), None, seed=0).take(200)
    assert min(r.input_tokens for r in tiny) == 1 and all(r.output_tokens is None for r in tiny)
    fixed = RequestSource(LengthSpec(7), LengthSpec(9), seed=0).take(3)
    assert {(r.input_tokens, r.output_tokens) for r in fixed} == {(7, 9)}
    with pytest.raises(ValueError, match=">= 1 token"):
        LengthSpec(0)


def test_loads_are_validated_and_open_loop_times_seeded() -> None:
    for bad, match in (
        (dict(concurrency=2, request_rate=1.0), "not both"),
        (dict(concurrency=0), "concurrency must be"),
        (dict(request_rate=0.0), "request rate must be"),
        (dict(arrival="bursty"), "arrival pattern"),
        (dict(request_count=None, duration_s=None), "count or a duration"),
        (dict(duration_s=-1.0), "duration must be"),
    ):
        with pytest.raises(ValueError, match=match):
            GenLoad(**bad)
    assert GenLoad().label == "concurrency1"
    assert GenLoad(request_rate=2.5).label == "request_rate2.5"
    even = send_times(GenLoad(request_rate=4.0, arrival="constant", request_count=4))
    assert even == pytest.approx([0.0, 0.25, 0.5, 0.75])
    poisson = send_times(GenLoad(request_rate=4.0, request_count=400, seed=1))
    assert poisson == send_times(GenLoad(request_rate=4.0, request_count=400, seed=1))
    assert 400 / poisson[-1] == pytest.approx(4.0, rel=0.15)
    bounded = send_times(GenLoad(request_rate=4.0, request_count=None, duration_s=2.0))
    assert bounded and max(bounded) < 2.0
    # schedule() is arrival_times() cut at the duration: the CNN mode's arrivals are unchanged
    cut = schedule(10.0, 3.0, "poisson", np.random.default_rng(5))
    whole = arrival_times(10.0, 55, "poisson", np.random.default_rng(5))
    assert list(cut) == list(whole[whole < 3.0])


def test_a_stream_is_timed_event_by_event() -> None:
    """Each token stamped when it arrives: never before the server wrote it (one process, one
    clock), and in the median within milliseconds of it; the chat's role-only chunk, the
    closing chunk and ``[DONE]`` are not tokens."""
    script = Script(ttft_s=0.2, gap_s=0.03)
    with serving(script) as url:

        async def go() -> list[list[float]]:
            seen = []
            async with new_session() as session:
                for endpoint in (OPENAI_CHAT, OPENAI_COMPLETIONS, GENERATE_STREAM):
                    target = GenTarget(f"http://{url}", endpoint, "m")
                    timed = await stream_once(session, target, REQUEST)
                    assert timed.ok and timed.text == ["t1 ", "t2 ", "t3 ", "t4 ", "t5 "]
                    record = timed.record()
                    assert record.output_tokens == 5 and record.input_tokens == 3
                    assert record.ttft_ms >= 200  # the role-only chunk came at once
                    seen.append(timed.token_times_s)
                bad = await stream_once(session, GenTarget(f"http://{url}", OPENAI_CHAT,
                                                           "broken"), REQUEST)  # fmt: skip
                assert bad.status == 400 and "HTTP 400" in (bad.error or "")
                faulty = await stream_once(session, GenTarget(f"http://{url}", GENERATE_STREAM,
                                                              "faulty"), REQUEST)  # fmt: skip
                assert not faulty.ok and "the engine failed" in (faulty.error or "")
                with pytest.raises(ValueError, match="no record"):
                    faulty.record()
                gone = await stream_once(
                    session, GenTarget("http://127.0.0.1:1", OPENAI_CHAT, "m"), REQUEST
                )
                assert gone.status == 0 and "ClientConnectorError" in (gone.error or "")
            return seen

        seen = asyncio.run(go())
    lags = [c - w for client, written in zip(seen, script.token_times_s, strict=False)
            for c, w in zip(client, written, strict=True)]  # fmt: skip
    assert len(lags) == 15 and min(lags) >= 0
    assert statistics.median(lags) < 0.02


def test_closed_loop_keeps_the_concurrency_and_open_loop_the_times() -> None:
    script = Script(ttft_s=0.05, gap_s=0.01)
    with serving(script) as url:
        target = GenTarget(f"http://{url}", GENERATE_STREAM, "m")
        source = RequestSource(LengthSpec(4), LengthSpec(3), seed=0)

        async def closed() -> int:
            async with new_session() as session:
                streams = await closed_loop(
                    session, target, source.next, concurrency=3, request_count=7,
                    duration_s=None,
                )  # fmt: skip
            return len(streams)

        assert asyncio.run(closed()) == 7
        assert script.max_in_flight == 3
        script.arrivals_s.clear()
        times = [0.0, 0.1, 0.15, 0.4]

        async def opened() -> int:
            async with new_session() as session:
                return len(await open_loop(session, target, source.take(4), times))

        assert asyncio.run(opened()) == 4
    offsets = np.asarray(script.arrivals_s) - script.arrivals_s[0]
    late = offsets - np.asarray(times)
    # each request leaves at its time, never early (the first one sets the origin)
    assert min(late) > -0.005 and float(np.median(late)) < 0.03, late


def test_cli_reports_and_exports_in_aiperfs_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = Script(ttft_s=0.1, gap_s=0.05, joules_per_token=0.5)
    with serving(script) as url:
        args = ["generative", "-m", "m", "-u", url, "--synthetic-input-tokens-mean", "30",
                "--output-tokens-mean", "6", "--collect-metrics", "--ttft-ms", "5000",
                "--tpot-ms", "10", "--priority", "1", "--random-seed", "4"]  # fmt: skip
        out = tmp_path / "chat"
        measured = ["--concurrency", "2", "--request-count", "6", "--warmup-request-count", "2"]
        code = loadgen_main([*args, *measured, "--artifact-dir", str(out)])
        assert code == 0
        assert len(script.bodies) == 8  # 2 warm-up, 6 measured
        assert script.bodies[-1]["priority"] == 1 and script.bodies[-1]["ttft_ms"] == 5000
        assert script.bodies[-1]["max_tokens"] == 6 and script.bodies[-1]["client_id"] == "loadgen"
        report = json.loads((out / JSON_EXPORT).read_text())
        assert report["request_count"]["avg"] == 6 and report["total_osl"]["avg"] == 36
        assert report["error_request_count"]["avg"] == 0
        # the scripted counter: 0.5 J per token sent between the two scrapes
        assert report["energy_per_output_token"]["avg"] == pytest.approx(0.5)
        assert report["time_to_first_token"]["min"] >= 100  # the scripted TTFT
        assert report["slo_attainment"]["ttft"] == 1.0  # every TTFT under 5 s
        assert report["slo_attainment"]["tpot"] == 0.0  # 50 ms gaps miss 10 ms
        rows = list(csv.reader((out / CSV_EXPORT).open()))
        assert rows[0] == ["Metric", *STAT_COLUMNS]
        assert rows[2][0] == "Time to First Token (ms)"
        lines = [json.loads(x) for x in (out / RECORDS_EXPORT).read_text().splitlines()]
        assert len(lines) == 6 and all(len(x["token_times_ms"]) == 6 for x in lines)
        text = capsys.readouterr().out
        assert "Time to First Token (ms)" in text and "Energy Per Output Token" in text
        assert "SLO Attainment TTFT ≤ 5000 ms" in text

        script.bodies.clear()
        rate = tmp_path / "rate"
        code = loadgen_main([*args, "--endpoint-type", "generate_stream", "--request-rate", "20",
                             "--arrival-pattern", "constant", "--benchmark-duration", "0.5",
                             "--artifact-dir", str(rate)])  # fmt: skip
        assert code == 0
        assert len(script.bodies) == 10 and script.bodies[0]["parameters"]["priority"] == 1
        assert json.loads((rate / JSON_EXPORT).read_text())["request_count"]["avg"] == 10

        broken = [*args[:2], "broken", *args[3:], "--artifact-dir", str(tmp_path / "no")]
        assert loadgen_main(broken) == 3
        assert "no request succeeded" in capsys.readouterr().err
    assert loadgen_main(["generative", "-m", "m", "--concurrency", "0"]) == 2
    assert "concurrency must be" in capsys.readouterr().err
    assert loadgen_main(["generative", "-m", "m", "--synthetic-input-tokens-mean", "0"]) == 2


def test_the_agreement_deals_the_same_requests_in_pairs() -> None:
    times = [0.5 * i for i in range(9)]  # 4 pairs and one: 3 pairs are used
    ours, theirs, our_times, their_times = deal(times, Settings(input_tokens_mean=5))
    assert sorted(our_times + their_times) == times[:6]
    assert our_times == [0.0, 1.5, 2.0] and their_times == [0.5, 1.0, 2.5]
    assert ours == theirs  # the same work: every request once each
    assert our_times[-1] - our_times[0] == their_times[-1] - their_times[0]  # equal spans


@pytest.mark.parametrize("load", ["rate", "concurrency"])
def test_loadgen_and_the_openai_sdk_agree_on_a_scripted_server(load: str, tmp_path: Path) -> None:
    """The agreement benchmark's own code against a server whose timing is known: loadgen (here)
    and the SDK client (its own process) at once; both TTFTs at the scripted 500 ms, and their
    TTFT and throughputs within 10% of each other. In a closed loop each client's throughput
    also carries its own time between a stream's end and its next request (the SDK's is the
    larger), which with streams this short is more than 10%: there only the TTFTs are compared."""
    script = Script(ttft_s=0.5, gap_s=0.05)
    settings = Settings(
        model="m", load=load, request_rate=8.0, concurrency_each=2, duration_s=2.0,
        input_tokens_mean=20, input_tokens_stddev=5.0, output_tokens_mean=10,
        output_tokens_stddev=0.0, warmup_requests=2, alone=load == "rate",
    )  # fmt: skip
    with serving(script) as url:
        result = asyncio.run(measure(url, settings, tmp_path))
    assert result.loadgen["ttft_mean_ms"] == pytest.approx(500, rel=0.1)
    assert result.sdk["ttft_mean_ms"] == pytest.approx(500, rel=0.1)
    assert result.loadgen["itl_mean_ms"] == pytest.approx(50, rel=0.25)
    if load == "rate":
        assert result.agrees, rows(result)
    else:
        assert abs(result.difference("ttft_mean_ms")) <= 0.1, rows(result)
        assert abs(result.difference("ttft_p50_ms")) <= 0.1, rows(result)
    assert result.sidecar_ttft_mean_ms is None  # the scripted server has no histograms
    clients = {b.get("client_id", "openai-sdk") for b in script.bodies}
    assert clients == {"loadgen", "openai-sdk"}
    if load == "rate":  # 16 arrivals in 2 s: 7 pairs (an odd number), after 2 warm-ups each
        assert result.loadgen["request_count"] == 7 and result.sdk["request_count"] == 7
        # then each alone: no sidecar histogram here, so no overhead, but the client's TTFT
        assert set(result.alone) == {"loadgen", "openai SDK"}
        for alone in result.alone.values():
            assert alone.client_ttft_ms == pytest.approx(500, rel=0.1)
            assert alone.overhead_ms is None
