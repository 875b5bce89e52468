"""The load generator on a sidecar that drives several GPUs: per-GPU lines, the node's clock."""

from __future__ import annotations

from loadgen.classes import RequestClass
from loadgen.engine import Sample
from loadgen.measure import StepResult, Window
from loadgen.metrics import scrape_values
from loadgen.report import console_lines

METRICS = """\
# HELP sidecar_gpu_clock_hertz Graphics clock read from the GPU.
# TYPE sidecar_gpu_clock_hertz gauge
sidecar_gpu_clock_hertz{gpu="0",name="a"} 9.0e+08
sidecar_gpu_clock_hertz{gpu="1",name="a"} 1.5e+09
# HELP sidecar_gpu_energy_joules_total Energy the GPU used.
# TYPE sidecar_gpu_energy_joules_total counter
sidecar_gpu_energy_joules_total{gpu="0",name="a"} 100.0
sidecar_gpu_energy_joules_total{gpu="1",name="a"} 50.0
"""


def test_energy_adds_up_over_the_gpus_and_the_clock_is_their_mean() -> None:
    values = scrape_values(METRICS)
    assert values["sidecar_gpu_energy_joules"] == 150.0
    assert values["sidecar_gpu_clock_hertz"] == 1.2e9


def step(samples: list[Sample]) -> StepResult:
    return StepResult(1.0, [Window(0.0, 2.0, samples, {}, None, [], len(samples))], True, 3)


def test_a_step_reports_each_gpu_the_sidecar_named() -> None:
    samples = [Sample(0.0, 0.010, 0, 200, gpu="0") for _ in range(30)]
    samples += [Sample(0.0, 0.020, 0, 200, gpu="1") for _ in range(10)]
    lines = console_lines(step(samples), "concurrency", 1, [RequestClass("all")])
    assert "  Per GPU (as the sidecar says): " in lines
    assert "    GPU 0: 30 requests (75.0%), 15.0/sec, p99 10000 usec" in lines
    assert "    GPU 1: 10 requests (25.0%), 5.0/sec, p99 20000 usec" in lines
    one_gpu = console_lines(
        step([Sample(0.0, 0.01, 0, 200, gpu="0")] * 3), "concurrency", 1, [RequestClass("all")]
    )
    assert not any("Per GPU" in line for line in one_gpu)
