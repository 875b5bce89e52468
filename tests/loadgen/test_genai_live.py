"""loadgen's generative mode on the live stack: the sidecar (its own process) in front of the
embedded Triton serving ``simllm`` on a simulated H100. One stack for the module: the CLI on each
endpoint and mode, the agreement with the openai SDK, and the demo's policy comparison."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from benchmarks.demo import generative_table, print_best_fixed
from benchmarks.genai_agreement import Settings, measure
from benchmarks.genlive import GenWorkload, run_policies
from benchmarks.live import BEST_FIXED
from benchmarks.sidecar import SidecarProcess, running
from loadgen.__main__ import main as loadgen_main
from loadgen.genai import JSON_EXPORT
from loadgen.synthetic import LengthSpec

TOKEN = "test-token"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    flags = ["--device", "sim:h100", "--profile-models", "", "--policy", "max",
             "--max-queue", "1024"]  # fmt: skip
    state = tmp_path_factory.mktemp("genlive")
    with running(flags, state_dir=state, admin_token=TOKEN, starts=3) as sc:
        yield sc


@pytest.mark.parametrize("endpoint", ["openai-chat", "openai-completions", "generate_stream"])
def test_each_endpoint_measured_live(stack: SidecarProcess, endpoint: str, tmp_path: Path) -> None:
    args = ["generative", "-m", "simllm", "-u", stack.url, "--endpoint-type", endpoint,
            "--concurrency", "2", "--request-count", "4", "--synthetic-input-tokens-mean", "200",
            "--output-tokens-mean", "12", "--collect-metrics", "--ttft-ms", "5000",
            "--tpot-ms", "1000", "--client-id", f"live-{endpoint}",
            "--artifact-dir", str(tmp_path)]  # fmt: skip
    assert loadgen_main(args) == 0
    report = json.loads((tmp_path / JSON_EXPORT).read_text())
    assert report["request_count"]["avg"] == 4 and report["error_request_count"]["avg"] == 0
    assert report["total_osl"]["avg"] == 48  # simllm emits exactly max_tokens
    assert report["input_sequence_length"]["avg"] == 200
    assert 0 < report["time_to_first_token"]["avg"] < report["request_latency"]["avg"]
    assert report["energy_per_output_token"]["avg"] > 0  # the simulated GPU's counter
    assert report["slo_attainment"]["both"] == 1.0
    metrics = httpx.get(f"http://{stack.url}/metrics", timeout=10).text
    # the hints reached the sidecar: its outcomes count the client by the id loadgen sent
    assert f'client="live-{endpoint}"' in metrics


def test_request_rate_mode_live(stack: SidecarProcess, tmp_path: Path) -> None:
    args = ["generative", "-m", "simllm", "-u", stack.url, "--endpoint-type", "generate_stream",
            "--request-rate", "10", "--arrival-pattern", "constant", "--benchmark-duration", "1",
            "--synthetic-input-tokens-mean", "100", "--synthetic-input-tokens-stddev", "20",
            "--output-tokens-mean", "8", "--output-tokens-stddev", "2",
            "--artifact-dir", str(tmp_path)]  # fmt: skip
    assert loadgen_main(args) == 0
    report = json.loads((tmp_path / JSON_EXPORT).read_text())
    assert report["request_count"]["avg"] == 10
    assert report["output_sequence_length"]["std"] > 0  # lengths drawn, not fixed


def test_agreement_with_the_openai_sdk_live(stack: SidecarProcess, tmp_path: Path) -> None:
    """A short run of the agreement benchmark: both clients send the same requests on the same
    run and both measure every one. How close their figures are is what
    ``python -m benchmarks.genai_agreement`` reports (a timing, not a unit test's business);
    here each client's view must be whole and of the same stream."""
    settings = Settings(
        request_rate=2.0, duration_s=10.0, input_tokens_mean=1000, input_tokens_stddev=200.0,
        output_tokens_mean=64, output_tokens_stddev=16.0, warmup_requests=2, alone=False,
    )  # fmt: skip
    result = asyncio.run(measure(stack.url, settings, tmp_path))
    # 20 send times: 9 pairs (an odd number, for equal spans), each request sent by both
    assert result.loadgen["request_count"] == result.sdk["request_count"] == 9
    for key in ("output_token_throughput", "request_throughput", "itl_mean_ms", "ttft_mean_ms"):
        assert result.loadgen[key] > 0 and result.sdk[key] > 0, (key, result)
    assert result.sidecar_itl_mean_ms is not None and result.sidecar_ttft_mean_ms is not None
    # a client's TTFT of a request includes its own sending and receiving: never less than the
    # sidecar's of the same request. The sidecar's mean is over both clients' requests (9 each),
    # and one client's request may wait behind the other's, so the bound holds for both together.
    clients_ttft_mean_ms = (result.loadgen["ttft_mean_ms"] + result.sdk["ttft_mean_ms"]) / 2
    assert clients_ttft_mean_ms > result.sidecar_ttft_mean_ms


def test_the_demos_generative_comparison_live(stack: SidecarProcess) -> None:
    """The demo's generative part, short: the same arrivals through ``max`` and ``tokens``,
    the energy counter read around the measured window."""
    work = GenWorkload(
        rate_rps=4.0, duration_s=3.0, warmup_s=1.0, input_tokens=LengthSpec(300, 50.0),
        output_tokens=LengthSpec(16, 4.0),
    )  # fmt: skip
    runs = asyncio.run(run_policies(stack.url, TOKEN, ["max", "tokens"], work))
    assert [r.policy for r in runs] == ["max", "tokens"]
    for r in runs:
        assert r.sent == runs[0].sent > 0 and r.completed == r.sent
        assert r.output_tokens > 0 and r.energy_per_token_j > 0
        assert 0 < r.p50_ttft_ms <= r.p99_ttft_ms and 0 < r.p50_tpot_ms <= r.p99_tpot_ms
    assert runs[0].mean_clock_mhz == 1980  # max: the H100 profile's top clock
    console = Console(record=True, width=200)
    console.print(generative_table(runs))
    shown = console.export_text()
    assert "J/token" in shown and "tokens" in shown and "—" in shown  # max is the baseline
    state = httpx.get(
        f"http://{stack.url}/admin/state", headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()
    assert state["policy"] == "tokens" and state["feedback"][0]["gap_samples"] > 0


def test_the_demos_generative_best_fixed_search_live(stack: SidecarProcess) -> None:
    """The search for the best single clock on the same streams: over three clocks whose lowest
    meets SLOs this loose, the bisection runs the middle and the lowest (``max``'s run stands
    for the top), chooses the lowest, and that clock is the one the GPU ran."""
    work = GenWorkload(
        rate_rps=4.0, duration_s=3.0, warmup_s=2.0, input_tokens=LengthSpec(300, 50.0),
        output_tokens=LengthSpec(16, 4.0), ttft_ms=5000.0, tpot_ms=1000.0,
    )  # fmt: skip
    ladder = [345, 1005, 1980]  # the H100 profile's lowest clock, one between, its top
    runs = asyncio.run(
        run_policies(stack.url, TOKEN, ["max"], work, best_fixed_clocks=ladder, fixed_warmup_s=0.5)
    )
    assert [r.policy for r in runs] == ["max", BEST_FIXED]
    best = runs[1]
    assert best.fixed_mhz == 345 and best.fixed_runs == 2 and best.fixed_complete
    assert best.mean_clock_mhz == 345 and best.meets_slo
    # the fixed runs measure the same streams as the policies, after the warm-up's last 0.5 s
    assert best.sent == runs[0].sent > 0 and best.completed == best.sent
    assert best.output_tokens > 0 and best.energy_per_token_j > 0
    console = Console(record=True, width=200)
    print_best_fixed(console, runs, len(ladder), max_ran=True)
    assert "345 MHz (fixed:345)" in console.export_text()
