"""Profiling real Triton models (the embedded default's) in batches, as on a GPU node."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from api.embedded import EMULATED, NOOP, SIMNET, EmbeddedTriton
from dvfs.simulated import SimulatedDevice
from time2clock.__main__ import main
from time2clock.fit import fit_model_table, read_measurements
from time2clock.profile import TritonMeasurer, select_clocks, sweep
from time2clock.table import TableSet


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedTriton, Path]]:
    """A real Triton whose emulated model runs on the simulated V100 at ``state_path``."""
    state_path = tmp_path_factory.mktemp("gpu") / "gpu0.state"
    device = SimulatedDevice("v100", state_path=state_path, rng=np.random.default_rng(0))
    try:
        with EmbeddedTriton(state_path) as server:
            yield server, state_path
    finally:
        device.reset()
        device.close()


def test_sweep_drives_a_triton_model_in_batches(triton: tuple[EmbeddedTriton, Path]) -> None:
    server, state_path = triton
    device = SimulatedDevice.attach(state_path)
    clocks = select_clocks(device.supported_clocks_mhz(), 3)
    measurer = TritonMeasurer(server.url, SIMNET, shape=(1, 16))
    result = sweep(device, measurer, clocks, batches=(1, 4), requests_per_clock=6)
    assert not device.is_locked()
    assert {b: sorted(s) for b, s in result.samples.items()} == {1: clocks, 4: clocks}
    assert all(len(v) == 6 for s in result.samples.values() for v in s.values())
    table = fit_model_table(result.samples, gpu="v100", model=SIMNET)
    # The model follows the clock the sweep locked, at its batch's time: batch 1 about 45 ms at
    # the bottom and 7 at the top, a batch of 4 the published 1.48× that, plus an HTTP round trip
    # that the difference cancels.
    law = device.profile.model(EMULATED[SIMNET])
    low, top = clocks[0], clocks[-1]
    for batch in (1, 4):
        expected_ms = law.mean_latency_ms(low, batch) - law.mean_latency_ms(top, batch)
        # Sleeping in steps overshoots more at the bottom clock on a busy machine: a loose band.
        slower_ms = table.predict_ms(low, batch) - table.predict_ms(top, batch)
        assert 0.7 * expected_ms < slower_ms < 1.6 * expected_ms
    # A batch past the model's max_batch_size (32) is Triton's error, named with the model.
    with pytest.raises(RuntimeError, match=f"measuring {SIMNET} at .* failed"):
        measurer.measure(1, 1, batch=33)


def test_profile_cli_writes_one_table_per_triton_model(
    triton: tuple[EmbeddedTriton, Path], tmp_path: Path
) -> None:
    server, _ = triton
    out = tmp_path / "prof"
    argv = ["profile", "--device", "sim:v100", "--triton-url", server.url, "--clocks", "2"]
    argv += ["--model", SIMNET, "--model", NOOP, "--batches", "1,2", "--requests-per-clock", "3"]
    assert main([*argv, "-o", str(out)]) == 0
    tables = TableSet.load(out / "table.json")
    assert tables.models == sorted([SIMNET, NOOP])
    assert all(t.batches == [1, 2] and t.gpu.startswith("Tesla V100") for t in tables)
    measured = read_measurements(out / "measurements.csv")
    assert {m: sorted(s) for m, s in measured.items()} == {SIMNET: [1, 2], NOOP: [1, 2]}
    noop, simnet = tables.get(NOOP), tables.get(SIMNET)
    assert noop is not None and simnet is not None
    top = simnet.clocks_mhz[-1]
    assert simnet.predict_ms(top, 2) > noop.predict_ms(top, 2)
    assert main(["profile", "--triton-url", server.url, "-o", str(out)]) == 2


def test_profile_cli_checks_max_batch_size_and_what_triton_serves(
    triton: tuple[EmbeddedTriton, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, _ = triton
    argv = ["profile", "--triton-url", server.url, "--clocks", "2", "--requests-per-clock", "2"]
    assert main([*argv, "--model", SIMNET, "--batches", "4,64", "-o", str(tmp_path / "x")]) == 2
    assert f"--batches 64 exceeds {SIMNET}'s largest batch, 32" in capsys.readouterr().err
    assert main([*argv, "--model", "nosuch", "-o", str(tmp_path / "x")]) == 2
    assert f"asking Triton at {server.url} failed" in capsys.readouterr().err
    # PyTriton's Triton answers its repository index with no models: said, not guessed.
    assert main([*argv, "--model", "all", "-o", str(tmp_path / "x")]) == 2
    assert "lists no ready models in its repository index" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
