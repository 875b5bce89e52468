"""The runtime install alone: the sidecar in front of an existing Triton needs no extra.

A fresh virtualenv per test run would take minutes, so the optional packages are made
unfindable in a child interpreter instead, as if not installed: any import of them fails there,
and the child checks afterwards that none was loaded.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from api.embedded import EmbeddedTriton
from dvfs.simulated import SimulatedDevice

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = ("pytriton", "matplotlib", "httpx")  # the 'embedded' and 'plot' extras

BLOCK = """
import importlib.abc, sys
sys.path.insert(0, {root!r})
BLOCKED = {blocked!r}

class Hide(importlib.abc.MetaPathFinder):
    # wraps a finder: the blocked packages are not found, as if not installed

    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED or not hasattr(self.inner, "find_spec"):
            return None
        return self.inner.find_spec(name, path, target)

sys.meta_path[:] = [Hide(finder) for finder in sys.meta_path]
"""

SERVE = """
import json, urllib.request
from api.config import from_options
from api.server import SidecarServer

config = from_options(triton_url={triton!r}, device="sim:v100", policy="max", port=0,
                       state_dir={state!r}, shadow=True)
with SidecarServer(config) as sc:
    body = json.dumps({{"inputs": [{{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                    "data": [1.0] * 16}}]}}).encode()
    req = urllib.request.Request(f"http://{{sc.url}}/v2/models/simnet/infer", data=body,
                                 headers={{"Content-Type": "application/json"}})
    reply = json.load(urllib.request.urlopen(req, timeout=60))
    assert reply["outputs"][0]["data"] == [2.0] * 16, reply
    metrics = urllib.request.urlopen(f"http://{{sc.url}}/metrics", timeout=30).read().decode()
    assert "sidecar_shadow_mode" in metrics
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, loaded
print("served without", ", ".join(BLOCKED))
"""


def child(code: str, blocked: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    script = BLOCK.format(root=str(ROOT), blocked=blocked) + code
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd=ROOT
    )


def test_runtime_serves_in_front_of_triton_without_the_extras(tmp_path: Path) -> None:
    state = tmp_path / "gpu0.state"
    SimulatedDevice("v100", state_path=state)
    with EmbeddedTriton(state) as triton:  # "an existing Triton", started by the test
        proc = child(SERVE.format(triton=triton.url, state=str(tmp_path)), OPTIONAL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "served without pytriton, matplotlib, httpx" in proc.stdout


def test_embedded_default_without_its_extra_says_what_to_install() -> None:
    code = "from api.__main__ import main\nsys.exit(main(['serve', '--port', '0']))\n"
    proc = child(code, ("pytriton",))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "pip install '.[embedded]'" in proc.stderr
    assert "missing: pytriton" in proc.stderr and "--triton-url" in proc.stderr


def test_plot_without_its_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from time2clock.plot import PlotUnavailableError, pyplot

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlotUnavailableError, match=r"pip install '\.\[plot\]'"):
        pyplot()
