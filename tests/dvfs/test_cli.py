from __future__ import annotations

import pytest

import dvfs.nvml
from dvfs.__main__ import main
from dvfs.factory import default_device_spec, open_device, parse_device_spec
from tests.dvfs.fake_nvml import FakeNvml


def test_list_without_gpu_says_so_and_shows_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "NVML GPUs: none" in out
    assert "rtx3090" in out and "titanrtx" in out


def test_reset_without_nvml_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reset"]) == 2
    assert "no NVIDIA GPU" in capsys.readouterr().err


def test_set_and_reset_with_nvml(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeNvml(gpus=2)
    monkeypatch.setattr(dvfs.nvml, "pynvml", fake)
    assert main(["set", "--gpu", "1", "--clock-mhz", "1200"]) == 0
    assert ("lock", "handle1", 1200, 1200) in fake.calls
    assert ("reset", "handle1") not in fake.calls  # `set` outlives the command
    assert main(["reset"]) == 0
    assert ("reset", "handle0") in fake.calls and ("reset", "handle1") in fake.calls
    assert "GPU 1" in capsys.readouterr().out
    assert main(["list"]) == 0
    assert "NVIDIA H200" in capsys.readouterr().out


def test_device_specs() -> None:
    assert parse_device_spec("sim:V100") == ("sim", "v100")
    assert parse_device_spec("nvml:1") == ("nvml", "1")
    for bad in ("v100", "sim:gtx480", "nvml:x", "cuda:0"):
        with pytest.raises(ValueError, match="bad device"):
            parse_device_spec(bad)
    assert open_device("sim:a100").identity.uuid == "SIM-a100-0"
    assert default_device_spec() == "sim:v100"
