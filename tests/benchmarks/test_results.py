"""Results files: provenance (commit, machine, date), the Markdown and JSON written, and the
benchmarks' reports built from their runs."""

from __future__ import annotations

import argparse
import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from benchmarks import batchbench, bench
from simulator.results import (
    describe_machine,
    git_commit,
    header,
    markdown_table,
    provenance,
    write_results,
)

NOW = datetime(2026, 11, 24, 9, 30, tzinfo=UTC)


def fake_proc(tmp_path: Path, cpuinfo: str, meminfo: str) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(cpuinfo)
    (proc / "meminfo").write_text(meminfo)
    return proc


def test_machine_reads_cpu_model_and_memory(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6338\n",
        "MemTotal:       25165824 kB\nMemFree:        1000 kB\n",
    )
    m = describe_machine(proc)
    assert m.cpu_model == "Intel(R) Xeon(R) Gold 6338"
    assert m.memory_gib == 24.0
    assert m.cpus >= m.cpus_usable >= 1
    assert m.python.split()[1].startswith("3.")


def test_machine_without_proc_still_describes_itself(tmp_path: Path) -> None:
    m = describe_machine(tmp_path / "missing")
    assert m.cpu_model  # platform's answer, or "unknown"
    assert m.memory_gib is None


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_commit_and_local_changes(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "a.txt").write_text("one\n")
    git(repo, "add", "a.txt")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    head = git(repo, "rev-parse", "HEAD")
    assert git_commit(repo) == (head, False)
    (repo / "untracked.txt").write_text("not counted\n")
    assert git_commit(repo) == (head, False)
    (repo / "results").mkdir()
    (repo / "results" / "page.md").write_text("one\n")
    git(repo, "add", "results/page.md")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a page")
    head = git(repo, "rev-parse", "HEAD")
    (repo / "results" / "page.md").write_text("rewritten by a benchmark\n")
    assert git_commit(repo) == (head, False)  # results are outputs, not the code
    (repo / "a.txt").write_text("two\n")
    assert git_commit(repo) == (head, True)


def test_no_checkout_gives_no_commit(tmp_path: Path) -> None:
    assert git_commit(tmp_path) == (None, None)


def test_provenance_names_the_module_and_quotes_arguments(tmp_path: Path) -> None:
    argv = [str(Path(bench.__file__)), "--protocols", "http", "--note", "a b"]
    prov = provenance(argv, now=NOW, root=tmp_path)
    assert prov.command == "python -m benchmarks.bench --protocols http --note 'a b'"
    assert prov.date == "2026-11-24T09:30:00+00:00"
    assert (prov.commit, prov.dirty) == (None, None)


def test_write_results_md_and_json(tmp_path: Path) -> None:
    prov = provenance(["python -m x", "--fast"], now=NOW, root=tmp_path)
    table = markdown_table(["a", "b"], [(1, "x"), (2.5, "y")])
    assert table.splitlines() == ["| a | b |", "| --- | --- |", "| 1 | x |", "| 2.5 | y |"]
    md, js = write_results(
        "thing",
        title="A thing",
        markdown=table,
        data={"ratio": 0.73, "state_dir": Path("/var/lib/x")},
        directory=tmp_path / "results",
        prov=prov,
    )
    text = md.read_text()
    assert text.startswith(header("A thing", prov))
    assert "- command: `python -m x --fast`" in text
    assert "- commit: not a git checkout" in text
    assert f"{prov.machine.cpus} CPUs" in text
    assert text.rstrip().endswith("| 2.5 | y |")
    payload = json.loads(js.read_text())
    assert payload["results"] == {"ratio": 0.73, "state_dir": "/var/lib/x"}
    assert payload["provenance"]["date"] == "2026-11-24T09:30:00+00:00"
    assert payload["provenance"]["machine"]["cpu_model"] == prov.machine.cpu_model
    # A second run replaces the first.
    write_results("thing", title="Again", markdown="", data={}, directory=md.parent, prov=prov)
    assert md.read_text().startswith("# Again")
    assert json.loads(js.read_text())["results"] == {}


def test_header_marks_a_dirty_tree() -> None:
    prov = provenance(["python -m x"], now=NOW)
    dirty = type(prov)(prov.command, "0123456789abcdef", True, prov.date, prov.machine)
    assert "- commit: `0123456789ab` with local changes" in header("t", dirty)


def run(label: str, throughput: float, p50_us: float, p99_us: float) -> bench.Run:
    return bench.Run(label, 16, throughput, p50_us, p99_us, p50_us)


def cost(protocol: str, concurrency: int, cpu_us: float, p50_us: float) -> bench.Cost:
    return bench.Cost(
        protocol,
        concurrency,
        {"infer_per_s": 2000.0, "p50_us": 4000.0, "p99_us": 9000.0},
        {"infer_per_s": 1500.0, "p50_us": p50_us, "p99_us": 12000.0, "cpu_us": cpu_us},
    )


def test_bench_report_gives_cpu_ratios_and_added_latency_before_and_now() -> None:
    now = [cost("http", 16, 140.0, 5000.0)]
    before = {("http", 16): cost("http", 16, 340.0, 6000.0)}
    checks = [
        {
            "concurrency": 1,
            "loadgen_infer_per_s": 500.0,
            "loadgen_mean_us": 1900.0,
            "tritonclient_infer_per_s": 520.0,
            "tritonclient_mean_us": 1850.0,
        }
    ]
    floor = {("http", 16): cost("http", 16, 90.0, 4400.0)}
    args = argparse.Namespace(duration_s=5.0, rounds=2, grpc_client="h2")
    text = bench._report(now, before, "an earlier tree", floor, checks, args)
    assert "gRPC client: the sidecar's own HTTP/2 channel (`--grpc-client h2`)" in text
    row = (
        "| http | 16 | 340 | 140 | 90 | ≤ 150 | 75% | 75% | +2000 | +1000 | +400 |  "
        "| +3000 | +3000 |"
    )
    assert row in text
    assert "python -m benchmarks.floor" in text
    assert "| 1 | 500 | 1900 | 520 | 1850 |" in text
    unmeasured = bench._report(now, None, "none given", None, [], args)
    assert "| http | 16 | — | 140 | — | ≤ 150 |" in unmeasured
    assert "interleaved" not in unmeasured


def test_bench_report_gives_the_interleaved_p50_added_per_path() -> None:
    def path(p50_us: float, requests: float) -> dict[str, float]:
        return {"p50_us": p50_us, "p99_us": 2 * p50_us, "requests": requests}

    paired = {
        "http": {"direct": path(3000.0, 900), "now": path(3250.0, 899), "floor": path(3100.0, 900)},
        "grpc": {"direct": path(2000.0, 500), "now": path(2900.0, 500)},
    }
    args = argparse.Namespace(duration_s=5.0, rounds=2, grpc_client="grpcio")
    text = bench._report([], None, "none given", None, [], args, paired)
    assert "gRPC client: grpc.aio (`--grpc-client grpcio`)" in text
    assert "for 10 s" in text
    assert "| http | 899 | 3000 | — | +250 | +100 | ≤ 300 |" in text
    assert "| grpc | 500 | 2000 | — | +900 | — | ≤ 300 |" in text


def test_bench_reads_the_before_figures_of_an_earlier_run(tmp_path: Path) -> None:
    earlier = {"results": {"cost": [cost("grpc", 1, 900.0, 5000.0).to_json()]}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(earlier))
    before = bench.read_costs(path)
    assert before[("grpc", 1)].sidecar["cpu_us"] == 900.0
    assert before[("grpc", 1)].added_us("p50_us") == 1000.0


def test_batchbench_report_compares_with_max() -> None:
    kept = {"simnet": (run("direct", 600.0, 50_000.0, 0.0), run("sidecar", 540.0, 55_000.0, 0.0))}
    slo_ms = 3.0 * batchbench.full_batch_ms(batchbench.GPU, "simnet")
    energy = {
        "simnet": [
            batchbench.EnergyRun("max", 1000, 60.0, 1.0, 0.400, 1530.0),
            batchbench.EnergyRun("adaptive", 1000, slo_ms + 1.0, 0.98, 0.300, 1000.0),
        ]
    }
    args = argparse.Namespace(
        concurrency=32, rounds=2, duration_s=5.0, load=0.7, energy_duration_s=20.0, slo_mult=3.0
    )
    text = batchbench._report(kept, energy, args)
    assert "| simnet | 90% | 540 vs 600 | 55.0 vs 50.0 |" in text
    assert "| simnet | max | 0.400 | — | 60.0 |" in text
    assert f"| simnet | adaptive | 0.300 | 0.75 | {slo_ms + 1.0:.1f} (over) |" in text


@pytest.mark.parametrize("module", [bench, batchbench])
def test_results_dir_is_a_flag(module: object, capsys: pytest.CaptureFixture[str]) -> None:
    """Both commands take --results-dir, default results/; --help stops before anything starts."""
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])  # type: ignore[attr-defined]
    assert done.value.code == 0
    assert "--results-dir RESULTS_DIR" in capsys.readouterr().out
