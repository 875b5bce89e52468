"""The package builds with the build backend it declares, and its wheel holds what the README's
layout says: the runtime and the tools of their own (simulator, load generator, GPU check), not
the benchmarks, the demo or the tests, which run from a checkout."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from benchmarks.native_build import compiled_sources

ROOT = Path(__file__).resolve().parents[2]
IN_THE_WHEEL = {"api", "dvfs", "scheduler", "time2clock", "loadgen", "simulator", "gpucheck"}


@pytest.mark.timeout(1200)  # the build compiles the request path: minutes on a small machine
def test_the_wheel_builds_with_its_declared_backend_and_holds_the_packages(
    tmp_path: Path,
) -> None:
    # pip's isolated build installs build-system.requires (setuptools >= 77 for the SPDX
    # license string) into a fresh environment, as any user's `pip install .` does.
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(ROOT), "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(z.read(metadata).decode())
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    # The compiled request path (setup.py): one library of mypyc's for all of its modules.
    native = {t for t in tops if t.startswith("sidecar_native__mypyc.")}
    packages = tops - native
    assert packages == IN_THE_WHEEL
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["License-Expression"] == project["license"] == "Apache-2.0"
    assert meta["Name"] == project["name"]
    # Every runtime package's modules, not only its __init__.
    for package in ("api", "scheduler", "time2clock", "dvfs"):
        modules = {n for n in names if n.startswith(f"{package}/")}
        local = {p.relative_to(ROOT).as_posix() for p in (ROOT / package).rglob("*.py")}
        assert local <= modules, f"{package}: {sorted(local - modules)} not in the wheel"
    if native:  # built compiled (a C compiler and mypyc were there): every module of it
        suffix = native.pop().removeprefix("sidecar_native__mypyc")
        compiled = {n.removesuffix(suffix) + ".py" for n in names if n.endswith(suffix)}
        assert {p.relative_to(ROOT).as_posix() for p in compiled_sources()} <= compiled
