"""The compiled request path (``setup.py``): what runs is the build of the source beside it.

A compiled module shadows its ``.py``: an edit to the source that was not built again would
run the old code in silence. ``make`` builds again whenever a compiled module changes; these
tests make a stale or missing build loud wherever the tests run. The behaviour of the compiled
modules is what every other test of them checks (the pinned seeded decisions of
``test_plan_decisions`` were recorded from the Python source)."""

from __future__ import annotations

import importlib
import os
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from benchmarks.native_build import compiled_sources

ROOT = Path(__file__).resolve().parents[2]


def extension_of(source: Path) -> Path | None:
    """The compiled module built beside ``source``, if any."""
    for suffix in EXTENSION_SUFFIXES:
        candidate = source.with_suffix(suffix)
        if candidate.exists():
            return candidate
    return None


def test_the_compiled_list_names_modules_that_exist() -> None:
    sources = compiled_sources()
    assert sources, "nothing compiled"
    for source in sources:
        assert source.is_file(), source


def test_no_compiled_module_is_older_than_its_source() -> None:
    stale = [
        s.name
        for s in compiled_sources()
        if (ext := extension_of(s)) is not None and ext.stat().st_mtime < s.stat().st_mtime
    ]
    assert not stale, f"built before their source last changed: {stale}; run `make setup`"


@pytest.mark.skipif(
    bool(os.environ.get("SIDECAR_PURE_PYTHON")), reason="SIDECAR_PURE_PYTHON: the Python runs"
)
def test_each_built_module_is_what_imports_load() -> None:
    built = [(s, ext) for s in compiled_sources() if (ext := extension_of(s)) is not None]
    if not built:
        pytest.skip("no compiled modules here (no C compiler or mypyc when it was built)")
    assert len(built) == len(compiled_sources()), "built in part: run `make setup`"
    for source, ext in built:
        name = ".".join(source.relative_to(ROOT).with_suffix("").parts)
        module = importlib.import_module(name)
        assert Path(module.__file__ or "") == ext
