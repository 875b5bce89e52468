"""loadgen against the real stack: the sidecar in front of the embedded Triton."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.server import SidecarServer
from benchmarks.bench import floor_process, interleaved, measure
from loadgen.__main__ import main
from tests.api.live import embedded_config
from tests.loadgen.test_units import EXPECTED_HEADER


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarServer]:
    cfg = embedded_config(tmp_path_factory.mktemp("state"), max_queue=1000, port=0, grpc_port=0)
    with SidecarServer(cfg) as sc:
        yield sc


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_concurrency_steps_write_perf_analyzer_csv(
    stack: SidecarServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lat.csv"
    assert (
        main(
            [
                "-m",
                "simnet",
                "-u",
                stack.url,
                "--concurrency-range",
                "1:2",
                "-p",
                "400",
                "-r",
                "3",
                "--collect-metrics",
                "--slo-ms",
                "60",
                "-f",
                str(out),
            ]
        )
        == 0
    )
    assert out.read_text().splitlines()[0].startswith(EXPECTED_HEADER)
    data = rows(out)
    assert [r["Concurrency"] for r in data] == ["1", "2"]
    for r in data:
        assert float(r["Inferences/Second"]) > 10
        assert 0 < float(r["p50 latency"]) <= float(r["p99 latency"])
        # the client's own send and receive: measured, and a small part of each request
        client_us = float(r["Client Send"]) + float(r["Client Recv"])
        assert 0 < client_us < float(r["p50 latency"]) / 2
        assert float(r["Server Compute Infer"]) > 1000  # simnet takes milliseconds
        assert float(r["Energy per Inference (J)"]) > 0
        assert float(r["Avg GPU Clock (MHz)"]) >= 135
        assert 0 <= float(r["SLO Attainment"]) <= 1
    text = capsys.readouterr().out
    assert "Request concurrency: 2" in text and "Energy per inference" in text


def test_open_loop_rate_reports_what_was_sent(
    stack: SidecarServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rate.csv"
    assert (
        main(
            [
                "-m",
                "noop",
                "-u",
                stack.runtime.triton_url,
                "--request-rate-range",
                "100",
                "--request-distribution",
                "poisson",
                "-p",
                "500",
                "-r",
                "3",
                "-f",
                str(out),
                "--verbose-csv",
            ]
        )
        == 0
    )
    (r,) = rows(out)
    assert r["Request Rate"] == "100" and "response wait" in r
    assert 70 < float(r["Inferences/Second"]) < 130
    assert "Sent: " in capsys.readouterr().out


def test_count_windows_intervals_file_and_mix(
    stack: SidecarServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    intervals = tmp_path / "iv.txt"
    intervals.write_text("20000\n10000\n")  # 20 ms then 10 ms, looped: ~67 req/s
    assert (
        main(
            [
                "-m",
                "simnet",
                "-u",
                stack.url,
                "--request-intervals",
                str(intervals),
                "--measurement-mode",
                "count_windows",
                "--measurement-request-count",
                "20",
                "-r",
                "3",
                "--mix",
                "gold:share=0.5,priority=1,slo_ms=30;bulk:share=0.5,nice=5",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "Request Rate: 66.6667" in text
    assert "gold:" in text and "bulk:" in text


def test_bad_arguments(stack: SidecarServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-m", "ghost", "-u", stack.url, "-p", "100"]) == 2
    assert "404" in capsys.readouterr().err
    assert main(["-m", "simnet", "-u", stack.url, "-b", "100", "-p", "100"]) == 2
    assert "exceeds the model's max_batch_size 32" in capsys.readouterr().err
    assert main(["-m", "simnet", "-u", "127.0.0.1:1", "-p", "100"]) == 3
    assert main(["-m", "simnet", "-u", stack.url, "--percentile", "0"]) == 2
    assert main(["-m", "simnet", "-u", stack.url, "--mix", "a:nice=99"]) == 2


def test_grpc_writes_the_same_csv(
    stack: SidecarServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "grpc.csv"
    args = ["-m", "simnet", "-u", stack.grpc_url, "-i", "grpc", "-p", "400", "-r", "3"]
    metrics = ["--collect-metrics", "--metrics-url", f"http://{stack.url}/metrics"]
    assert main([*args, "--concurrency-range", "2", *metrics, "-f", str(out)]) == 0
    assert out.read_text().splitlines()[0].startswith(EXPECTED_HEADER)
    (row,) = rows(out)
    assert float(row["Inferences/Second"]) > 10
    assert 0 < float(row["p50 latency"]) <= float(row["p99 latency"])
    assert float(row["Server Compute Infer"]) > 1000  # Triton's statistics, read over gRPC
    assert float(row["Energy per Inference (J)"]) > 0
    # The hints ride in the gRPC request's parameters: the sidecar saw both classes, by level.
    mix = "gold:share=0.5,priority=1,slo_ms=30;bulk:share=0.5,nice=5"
    assert main([*args, "--measurement-mode", "count_windows", "--mix", mix]) == 0
    assert "gold:" in capsys.readouterr().out
    state = httpx.get(f"http://{stack.url}/metrics", timeout=10).text.splitlines()
    seen = {
        (line.split('client="')[1].split('"')[0], line.split('priority="')[1].split('"')[0])
        for line in state
        if line.startswith("sidecar_requests_total{") and 'protocol="grpc"' in line
    }
    assert {("gold", "1"), ("bulk", "2")} <= seen
    # grpc.aio's client (--grpc-client grpcio) writes the same CSV, and says the same.
    aio = tmp_path / "grpcio.csv"
    assert main([*args, "--grpc-client", "grpcio", "-f", str(aio)]) == 0
    assert aio.read_text().splitlines()[0].startswith(EXPECTED_HEADER)
    assert float(rows(aio)[0]["Inferences/Second"]) > 10
    for client in ("h2", "grpcio"):
        ghost = ["-m", "ghost", "-u", stack.grpc_url, "-i", "grpc", "--grpc-client", client]
        assert main([*ghost, "-p", "100"]) == 2
        assert "NOT_FOUND" in capsys.readouterr().err
        nothing = ["-m", "simnet", "-u", "127.0.0.1:1", "-i", "grpc", "--grpc-client", client]
        assert main([*nothing, "-p", "100"]) == 3
        assert (
            "cannot reach 127.0.0.1:1 (gRPC ModelMetadata): UNAVAILABLE" in capsys.readouterr().err
        )
    assert main(["-m", "simnet", "-u", stack.grpc_url, "-i", "grpc", "--collect-metrics"]) == 2


def test_the_floor_proxy_passes_http_and_grpc_through_to_triton(stack: SidecarServer) -> None:
    """``benchmarks.floor`` answers as Triton does over both protocols (bench measures it as
    the least a proxy costs), and stops when its stdin closes."""
    gpu = stack.runtime.gpus[0]
    with floor_process({"http": gpu.url, "grpc": gpu.grpc_url}) as ends:
        for protocol in ("http", "grpc"):
            direct = measure(gpu.url if protocol == "http" else gpu.grpc_url, 2, 0.3, "d", protocol)
            # A second's run: the proxy's CPU is read in clock ticks (10 ms), and over HTTP it
            # spends about that in 0.3 s.
            floor = measure(ends.sidecar[protocol], 2, 1.0, "floor", protocol, cpu_of=ends.pid)
            assert floor.throughput > 10 and direct.throughput > 10
            assert floor.cpu_us is not None and floor.cpu_us > 0
            direct_url = gpu.url if protocol == "http" else gpu.grpc_url
            paths = interleaved(
                {"direct": direct_url, "floor": ends.sidecar[protocol]}, 0.3, protocol
            )
            assert set(paths) == {"direct", "floor"}
            assert abs(paths["direct"]["requests"] - paths["floor"]["requests"]) <= 1
            assert 0 < paths["floor"]["p50_us"] <= paths["floor"]["p99_us"]
        pid = ends.pid
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped and reaped
