"""Profiling an LLM engine per clock (``python -m time2clock profile-engine``) and the sidecar
planning with that profile under ``--policy tokens`` in front of an engine it did not start."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from api.config import from_options
from api.embedded import EmbeddedTriton
from api.embedded_llm import SIMLLM
from api.metrics import GatewayMetrics
from api.runtime import Gpu, Runtime
from dvfs.factory import open_device
from dvfs.llm_profiles import IterationWork, get_llm_profile
from dvfs.simulated import SimulatedDevice
from scheduler.config import PolicyConfig
from scheduler.tokens import TokenClockPolicy
from tests.api.live import LiveSidecar, failed_start
from time2clock.__main__ import main
from time2clock.engine import (
    EnergySampler,
    EngineProfileError,
    EngineSweep,
    EngineSweepSettings,
    check_clocks,
    decode_stretch,
    load_engine_profile,
    save_engine_profile,
)

H100_CLOCKS = open_device("sim:h100").supported_clocks_mhz()


def test_the_decode_stretch_is_where_every_stream_decodes() -> None:
    # Two streams: the second's prompt is in 40 ms after the first's; the first ends at 0.30 s.
    # From 0.05 s (the second's first token) to 0.30 s both decode, a step every 10 ms; the
    # first stream's tokens reach the client in pairs (bunched by the network).
    first = [0.01, 0.02, 0.03, 0.04, *(round(0.06 + 0.02 * (i // 2), 2) for i in range(26))]
    second = [round(0.05 + 0.01 * i, 2) for i in range(40)]
    stretch = decode_stretch([first, second])
    assert stretch is not None
    assert (stretch.t0_s, stretch.t1_s) == (0.05, 0.30)
    # each stream's first to last token in the stretch: 0.06..0.30 over 26 tokens, and
    # 0.05..0.30 over 26: close to the 10 ms step, bunching or not
    expected_s = (0.24 / 25 + 0.25 / 25) / 2
    assert stretch.step_ms == pytest.approx(expected_s * 1000)
    assert stretch.steps == pytest.approx(0.25 / expected_s)
    # The engine ran them one after the other: no stretch where both decode.
    assert decode_stretch([[0.0, 0.1, 0.2], [0.3, 0.4, 0.5]]) is None
    assert decode_stretch([[0.0, 0.1], []]) is None


def test_the_energy_counter_is_interpolated_at_the_stretch() -> None:
    class Counter:
        joules = 0.0

        def energy_j(self) -> float:
            return self.joules

    now = [0.0]
    counter = Counter()
    sampler = EnergySampler(counter, 0.01, clock=lambda: now[0])
    for t, j in ((0.0, 0.0), (1.0, 100.0), (2.0, 300.0)):
        now[0], counter.joules = t, j
        sampler.read()
    now[0] = 2.0
    assert sampler.between(0.5, 1.5) == pytest.approx(50.0 + 100.0)


def test_the_settings_refuse_what_cannot_be_measured() -> None:
    for bad in (
        {"buckets": ()},
        {"buckets": (4, 2)},
        {"buckets": (0, 1)},
        {"output_tokens": 4},
        {"prefill_repeats": 0},
        {"poll_s": 0.0},
    ):
        with pytest.raises(ValueError):
            EngineSweepSettings(**bad)


def sweep_of(clocks: list[int]) -> EngineSweep:
    """A made-up sweep: a decode step that barely follows the clock, a prompt that does."""
    sweep = EngineSweep(EngineSweepSettings(buckets=(1, 8)))
    for clock in clocks:
        for n in (1, 8):
            sweep.step_ms.setdefault(n, {})[clock] = 5.0 + n * 0.2 + 300.0 / clock
            sweep.step_j.setdefault(n, {})[clock] = 0.5 + clock / 2000
            sweep.steps.setdefault(n, {})[clock] = 40.0
        sweep.prefill_ms[clock] = [30_000 / clock, 31_000 / clock, 90_000 / clock]
        sweep.prefill_j[clock] = [10.0, 12.0, 14.0]
    return sweep


def test_a_profile_is_saved_and_read_back(tmp_path: Path) -> None:
    clocks = [H100_CLOCKS[0], H100_CLOCKS[-1]]
    path = tmp_path / "engine.json"
    written = save_engine_profile(path, sweep_of(clocks), H100_CLOCKS, {"gpu": "H100"})
    read = load_engine_profile(path)
    assert read == written
    assert read.clocks_mhz == tuple(H100_CLOCKS)
    assert read.prefill_j[clocks[0]] == pytest.approx(12.0)
    # the median of the prompts' times: the outlier of 90,000/clock does not move it
    assert read.prefill_ms[clocks[-1]] == pytest.approx(31_000 / clocks[-1])
    check_clocks(read, H100_CLOCKS, "here")
    with pytest.raises(EngineProfileError, match="other clocks"):
        check_clocks(read, open_device("sim:a100").supported_clocks_mhz(), "here")
    # The token policy plans with it.
    policy = PolicyConfig(name="tokens").build(H100_CLOCKS, engine=read)
    assert isinstance(policy, TokenClockPolicy)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(kind="table"), "not an engine profile"),
        (lambda d: d.update(version=99), "version 99"),
        (lambda d: d.pop("step_j"), "missing 'step_j'"),
        (lambda d: d["prefill_ms"].update({"1980": -1.0}), "must be > 0"),
        (lambda d: d["prefill_j"].update({"1980": True}), "not a clock and a number"),
        (lambda d: d["step_ms"]["8"].pop("1980"), r"step_ms\[8\] is not measured"),
        (lambda d: d["step_ms"].update({"x": {}}), "bucket 'x'"),
        (lambda d: d.update(clocks_mhz=[345]), "not in its clocks_mhz"),
    ],
)
def test_a_bad_profile_is_named_with_what_is_wrong(
    tmp_path: Path, change: object, message: str
) -> None:
    path = tmp_path / "engine.json"
    save_engine_profile(path, sweep_of([345, 1980]), H100_CLOCKS, {})
    data = json.loads(path.read_text())
    change(data)  # type: ignore[operator]
    path.write_text(json.dumps(data))
    with pytest.raises(EngineProfileError, match=message):
        load_engine_profile(path)
    path.write_text("{")
    with pytest.raises(EngineProfileError, match=re.escape(f"engine profile {path}")):
        load_engine_profile(path)


def test_the_sidecar_takes_the_profile_for_the_token_policy(tmp_path: Path) -> None:
    path = tmp_path / "engine.json"
    save_engine_profile(path, sweep_of([345, 1980]), H100_CLOCKS, {})

    def runtime(device: str, **options: object) -> tuple[Runtime, Gpu]:
        rt = Runtime(
            from_options(device=device, policy="tokens", triton_url="127.0.0.1:1", **options),
            GatewayMetrics(CollectorRegistry()),
        )
        gpu = rt._first()
        gpu.device = open_device(device)
        return rt, gpu

    rt, gpu = runtime("sim:h100", engine_profile=path)
    assert isinstance(rt.build_policy(gpu=gpu), TokenClockPolicy)
    rt, gpu = runtime("sim:a100", engine_profile=path)
    with pytest.raises(EngineProfileError, match="other clocks"):
        rt.build_policy(gpu=gpu)
    rt, gpu = runtime("sim:h100")  # in front of an engine it did not start, no profile
    with pytest.raises(ValueError, match="time2clock profile-engine"):
        rt.build_policy(gpu=gpu)
    rt, gpu = runtime("sim:h100", engine_profile=tmp_path / "absent.json")
    with pytest.raises(EngineProfileError, match=re.escape("absent.json")):
        rt.build_policy(gpu=gpu)


def test_the_embedded_engine_needs_a_gpu_with_an_llm_profile(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["profile-engine", "--device", "sim:v100"]) == 2
    assert "sim:h100" in capsys.readouterr().err
    assert main(["profile-engine", "--device", "nvml:0"]) == 2
    assert "needs --url" in capsys.readouterr().err
    assert main(["profile-engine", "--url", "http://127.0.0.1:1", "--model", "m"]) == 2
    assert "--state-path" in capsys.readouterr().err
    for extra in ("{", "[1]"):
        assert main(["profile-engine", "--extra", extra]) == 2
        assert "--extra must be a JSON object" in capsys.readouterr().err


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedTriton, Path]]:
    """A real Triton serving ``simllm`` on the simulated H100 at the state file: an engine the
    sidecar does not start, as a user's would be."""
    state = tmp_path_factory.mktemp("engine") / "gpu0.state"
    device = SimulatedDevice("h100", state_path=state)
    try:
        with EmbeddedTriton(state) as triton:
            yield triton, state
    finally:
        device.close()


def law_ms(clock: int, work: IterationWork) -> float:
    return get_llm_profile("h100").cost(work, clock).time_ms


def test_a_profile_measured_through_the_engine_follows_its_laws(
    engine: tuple[EmbeddedTriton, Path], tmp_path: Path
) -> None:
    triton, state = engine
    out = tmp_path / "engine.json"
    argv = ["profile-engine", "--url", f"http://{triton.url}", "--state-path", str(state)]
    argv += ["--model", SIMLLM, "--clocks", "2", "--buckets", "1,8", "--prompt-tokens", "16"]
    argv += ["--output-tokens", "24", "--prefill-tokens", "2000", "--prefill-repeats", "3"]
    assert main([*argv, "--settle-s", "0.1", "-o", str(out)]) == 0
    assert not SimulatedDevice.attach(state).is_locked()  # the clock is given back
    assert out.with_suffix(".png").stat().st_size > 0  # and the plot beside the profile
    prior = load_engine_profile(out)
    low, top = H100_CLOCKS[0], H100_CLOCKS[-1]
    assert sorted(prior.prefill_ms) == [low, top] and sorted(prior.step_ms) == [1, 8]
    # A decode step: the law's time, plus what the emulation and the stream add (a sleep's
    # overshoot, a response through Triton: host time, over 5 ms a step on a busy 2-core
    # machine, so only bounded far below a prompt's hundreds of ms); memory-bound, so it
    # barely follows the clock.
    for n in (1, 8):
        for clock in (low, top):
            work = IterationWork(decode_seqs=n, decode_context_tokens=n * 28)
            assert law_ms(clock, work) * 0.9 < prior.step_ms[n][clock] < law_ms(clock, work) + 20
    # A prompt is compute-bound: at the bottom clock several times as long as at the top.
    prompt = IterationWork(prefill_tokens=2000, prefill_sq_tokens=2000**2)
    assert law_ms(low, prompt) / law_ms(top, prompt) > 4
    assert prior.prefill_ms[low] / prior.prefill_ms[top] > 3
    # Energy from the GPU's counter: a step at the top clock draws more than at the bottom.
    assert prior.step_j[1][top] > prior.step_j[1][low] > 0
    assert all(j > 0 for j in prior.prefill_j.values())


def test_an_engine_that_refuses_is_named_and_the_clock_given_back(
    engine: tuple[EmbeddedTriton, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    triton, state = engine
    argv = ["profile-engine", "--url", f"http://{triton.url}", "--state-path", str(state)]
    argv += ["--model", "absent", "--clocks", "2", "--buckets", "1", "--settle-s", "0"]
    assert main([*argv, "-o", str(tmp_path / "engine.json")]) == 2
    err = capsys.readouterr().err
    assert f"a stream from http://{triton.url}/v2/models/absent/generate_stream failed" in err
    assert not SimulatedDevice.attach(state).is_locked()
    assert not (tmp_path / "engine.json").exists()


def test_the_sidecar_plans_with_the_profile_in_front_of_the_engine(
    engine: tuple[EmbeddedTriton, Path], tmp_path: Path
) -> None:
    """Started with a profile in front of an engine it did not start, the sidecar serves under
    ``tokens``; and an OpenAI-compatible endpoint (the sidecar's own ``/v1/completions``) is
    profiled as Triton's ``generate_stream`` is."""
    triton, state = engine
    path = tmp_path / "engine.json"
    save_engine_profile(path, sweep_of([H100_CLOCKS[0], H100_CLOCKS[-1]]), H100_CLOCKS, {})
    config = from_options(
        triton_url=triton.url,
        device="sim:h100",
        policy="tokens",
        engine_profile=path,
        state_dir=tmp_path,
        admin_token="t",
        learn=False,
    )
    with LiveSidecar(config) as sidecar:
        url = f"http://{sidecar.url}/v2/models/{SIMLLM}/generate_stream"
        reply = httpx.post(url, json={"text_input": "a b", "max_tokens": 3}, timeout=30)
        assert reply.status_code == 200 and reply.text.count("data:") == 3
        admin = sidecar.get("/admin/state", headers={"Authorization": "Bearer t"}).json()
        (tokens,) = admin["feedback"]
        assert admin["policy"] == "tokens" and tokens["running"] == 0
        assert admin["engine_profile"] == str(path)
        out = tmp_path / "openai.json"
        argv = ["profile-engine", "--url", f"http://{sidecar.url}", "--state-path", str(state)]
        argv += ["--endpoint", "openai-completions", "--model", SIMLLM, "--clocks", "2"]
        argv += ["--buckets", "1,4", "--prompt-tokens", "16", "--output-tokens", "16"]
        argv += ["--prefill-tokens", "500", "--prefill-repeats", "2", "--settle-s", "0.1"]
        assert main([*argv, "-o", str(out)]) == 0
    prior = load_engine_profile(out)
    assert sorted(prior.step_ms) == [1, 4]
    work = IterationWork(decode_seqs=1, decode_context_tokens=24)
    for clock in prior.prefill_ms:
        assert law_ms(clock, work) * 0.9 < prior.step_ms[1][clock] < law_ms(clock, work) + 5


# the server's thread ends with uvicorn's SystemExit: how a failed start is reported
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_profile_of_another_gpu_stops_the_start(
    engine: tuple[EmbeddedTriton, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Checked at start whatever the policy: a file it cannot use is not found out later, at
    an admin switch to ``tokens``."""
    triton, _ = engine
    path = tmp_path / "engine.json"
    save_engine_profile(path, sweep_of([H100_CLOCKS[0], H100_CLOCKS[-1]]), H100_CLOCKS, {})
    config = from_options(
        triton_url=triton.url, device="sim:a100", policy="max", engine_profile=path,
        state_dir=tmp_path, learn=False, port=0,
    )  # fmt: skip
    failed_start(config)
    assert "made on a GPU with other clocks" in capfd.readouterr().err
