"""``benchmarks.compiled``: its Python side is the same source without the compiled modules, and
both sides measure the same cell."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import instructions
from benchmarks.compiled import pure_copy, timed
from benchmarks.native_build import compiled_packages
from simulator.results import SOURCE_ROOT


def test_the_pure_copy_holds_every_source_and_no_extension(tmp_path: Path) -> None:
    pure_copy(tmp_path)
    packages = compiled_packages()
    assert packages, "setup.py compiles nothing"
    for package in packages:
        sources = {p.relative_to(SOURCE_ROOT) for p in (SOURCE_ROOT / package).rglob("*.py")}
        copied = {p.relative_to(tmp_path) for p in (tmp_path / package).rglob("*.py")}
        assert sources == copied
        assert not list((tmp_path / package).rglob("*.so"))


def test_the_python_side_runs_the_copy(tmp_path: Path) -> None:
    pure = pure_copy(tmp_path)
    us, module = timed("core", "max", 10, pure)
    assert us > 0
    assert Path(module) == pure / "scheduler" / "core.py"


def test_the_instruction_count_refuses_a_tree_that_is_not_a_checkout(tmp_path: Path) -> None:
    """``benchmarks.instructions`` says so at once (before any count) when ``--before-tree``
    holds no sidecar."""
    with pytest.raises(SystemExit) as info:
        instructions.main(["--before-tree", str(tmp_path), "--results-dir", str(tmp_path)])
    assert info.value.code == 2
    assert not (tmp_path / "instructions.md").exists()
