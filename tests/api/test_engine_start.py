"""The LLM engine's profile measured by the sidecar at its first start (``--profile-engine``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

import time2clock.engine
from api.config import from_options
from api.embedded_llm import SIMLLM
from api.engine_start import cached_path, engine_profile_at_start, engine_target
from api.metrics import GatewayMetrics
from api.runtime import Gpu, Runtime
from dvfs.simulated import SimulatedDevice
from loadgen.stream import GenTarget
from tests.api.live import LiveSidecar, embedded_config, failed_start
from tests.time2clock.test_engine_profile import sweep_of
from time2clock.engine import EngineSweep, EngineSweepSettings, load_engine_profile
from time2clock.profile import MeasureError, select_clocks

ADMIN = {"Authorization": "Bearer test-token"}


class FakeSweeps:
    """Stands in for the sweep (no engine here): counts the sweeps, records their clocks."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[list[int]] = []
        self.error = error

    async def __call__(
        self, device: Any, target: GenTarget, clocks: Sequence[int], settings: Any, **_: Any
    ) -> EngineSweep:
        self.calls.append(list(clocks))
        if self.error is not None:
            raise self.error
        return sweep_of(list(clocks))


def profile(device: SimulatedDevice, tmp_path: Path, gpu: str = "h100") -> Path:
    target = engine_target("llama 3/8b", "127.0.0.1:8000", None, {})
    return asyncio.run(engine_profile_at_start(device, gpu, target, state_dir=tmp_path, clocks=3))


def test_it_is_measured_once_then_read_from_the_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweeps = FakeSweeps()
    monkeypatch.setattr(time2clock.engine, "sweep_engine", sweeps)
    device = SimulatedDevice("h100", state_path=tmp_path / "gpu.state")
    ladder = device.supported_clocks_mhz()
    path = profile(device, tmp_path)
    assert path == tmp_path / "engines" / "h100--llama_3_8b.json"  # one file per GPU kind, model
    assert sweeps.calls == [select_clocks(ladder, 3)]  # the ladder's ends and its middle
    assert sorted(load_engine_profile(path).prefill_ms) == sweeps.calls[0]
    assert profile(device, tmp_path) == path and len(sweeps.calls) == 1  # cached
    # A file it cannot use (here: another GPU's clocks) is measured again, not trusted.
    a100 = SimulatedDevice("a100", state_path=tmp_path / "a100.state")
    stale = cached_path(tmp_path, "h100", "other")
    stale.parent.mkdir(exist_ok=True)
    stale.write_text(cached_path(tmp_path, "h100", "llama 3/8b").read_text())
    target = engine_target("other", "127.0.0.1:8000", None, {})
    asyncio.run(engine_profile_at_start(a100, "h100", target, state_dir=tmp_path, clocks=2))
    assert len(sweeps.calls) == 2
    a100_ladder = a100.supported_clocks_mhz()
    assert sorted(load_engine_profile(stale).prefill_ms) == [a100_ladder[0], a100_ladder[-1]]
    for d in (device, a100):
        d.close()


def test_an_engine_that_cannot_be_measured_stops_it_and_nothing_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        time2clock.engine, "sweep_engine", FakeSweeps(MeasureError("a stream failed"))
    )
    device = SimulatedDevice("h100", state_path=tmp_path / "gpu.state")
    with pytest.raises(MeasureError, match="a stream failed"):
        profile(device, tmp_path)
    assert not (tmp_path / "engines").exists() or not os.listdir(tmp_path / "engines")
    device.close()


def test_one_openai_engine_is_measured_on_the_first_gpu_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OpenAI upstream is one engine on one GPU: a second GPU of the same kind takes its
    profile; one of another kind is refused, not swept while the engine runs elsewhere."""
    sweeps = FakeSweeps()
    monkeypatch.setattr(time2clock.engine, "sweep_engine", sweeps)
    devices = "sim:h100,sim:h100,sim:a100"
    rt = Runtime(
        from_options(
            device=devices, triton_url="a:1,b:2,c:3", upstream="openai=http://vllm:8000",
            policy="tokens", profile_engine="m", profile_clocks=2, state_dir=tmp_path,
        ),
        GatewayMetrics(CollectorRegistry()),
    )  # fmt: skip
    for i, spec in enumerate(devices.split(",")):
        rt.gpus.append(Gpu(str(i), spec, triton_url="a:1"))
        rt.gpus[i].device = SimulatedDevice(spec[4:], state_path=tmp_path / f"gpu{i}.state")
        rt.gpus[i].name = spec[4:]
    first = asyncio.run(rt._profile_engine(rt.gpus[0], "m"))
    assert asyncio.run(rt._profile_engine(rt.gpus[1], "m")) == first
    assert len(sweeps.calls) == 1
    with pytest.raises(ValueError, match=r"GPU 2 is a a100: put a profile made on that kind"):
        asyncio.run(rt._profile_engine(rt.gpus[2], "m"))
    assert len(sweeps.calls) == 1
    for gpu in rt.gpus:
        assert gpu.device is not None
        gpu.device.close()


def test_the_engine_is_the_openai_upstream_when_there_is_one() -> None:
    extra = {"ignore_eos": True}
    openai = engine_target("m", "triton:8000", "http://vllm:8000/", extra)
    assert (openai.url, openai.extra) == ("http://vllm:8000/v1/completions", extra)
    triton = engine_target("m", "triton:8000", None, {})
    assert triton.url == "http://triton:8000/v2/models/m/generate_stream"


def test_its_options_are_checked() -> None:
    for options, message in (
        ({"profile_engine": "m", "engine_profile": Path("e.json")}, "not both"),
        ({"profile_engine": "m", "shadow": True}, "not in shadow mode"),
        ({"profile_engine_extra": "[1]"}, "must be a JSON object"),
        ({"profile_engine_extra": "{"}, "must be a JSON object"),
    ):
        with pytest.raises(ValueError, match=message):
            from_options(**options)
    config = from_options(profile_engine="m", profile_engine_extra='{"ignore_eos": true}')
    assert config.profile_engine_body == {"ignore_eos": True}


def test_live_the_sidecar_measures_its_engine_then_plans_with_it(tmp_path: Path) -> None:
    """The embedded engine on the simulated H100 the sidecar drives: measured at the first
    start (the clock given back after), planned with under ``tokens``, and read back at the
    next start without measuring again."""
    config = embedded_config(
        tmp_path, device="sim:h100", profile_models=(), policy="tokens",
        profile_engine=SIMLLM, profile_clocks=2,
    )  # fmt: skip
    path = cached_path(tmp_path, "h100", SIMLLM)
    with LiveSidecar(config) as sidecar:
        prior = load_engine_profile(path)
        assert sorted(prior.step_ms) == list(EngineSweepSettings().buckets)
        low, top = sorted(prior.prefill_ms)
        assert prior.prefill_ms[low] > 2 * prior.prefill_ms[top]  # a prompt wants the clock
        url = f"http://{sidecar.url}/v2/models/{SIMLLM}/generate_stream"
        reply = httpx.post(url, json={"text_input": "a b", "max_tokens": 3}, timeout=30)
        assert reply.status_code == 200 and reply.text.count("data:") == 3
        state = sidecar.get("/admin/state", headers=ADMIN).json()
        assert state["policy"] == "tokens" and state["engine_profile"] == str(path)
    made = path.stat().st_mtime_ns
    with LiveSidecar(config) as sidecar:
        assert sidecar.get("/admin/state", headers=ADMIN).json()["policy"] == "tokens"
    assert path.stat().st_mtime_ns == made  # read, not measured again


# the server's thread ends with uvicorn's SystemExit: how a failed start is reported
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_live_an_engine_it_cannot_measure_stops_the_start(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A model no engine serves: the start stops, naming the stream that failed, and nothing is
    cached."""
    config = embedded_config(
        tmp_path, device="sim:h100", profile_models=(), profile_engine="absent",
        profile_clocks=2, port=0,
    )  # fmt: skip
    failed_start(config)
    assert "/v2/models/absent/generate_stream failed" in capfd.readouterr().err
    assert not cached_path(tmp_path, "h100", "absent").exists()
