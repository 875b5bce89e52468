"""The modules the build compiles, as ``setup.py`` lists them (its ``COMPILED``), read without
running ``setup.py``: for the tests that check the build is current and for the benchmark that
runs the same source uncompiled."""

from __future__ import annotations

import ast
from pathlib import Path

from simulator.results import SOURCE_ROOT


def compiled_sources(root: Path = SOURCE_ROOT) -> list[Path]:
    """The source files of the compiled modules, under ``root``."""
    tree = ast.parse((root / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "COMPILED" for t in node.targets
        ):
            return [root / p for p in ast.literal_eval(node.value)]
    raise ValueError(f"{root / 'setup.py'} has no COMPILED list")


def compiled_packages(root: Path = SOURCE_ROOT) -> list[str]:
    """The top-level packages that hold compiled modules."""
    return sorted({p.relative_to(root).parts[0] for p in compiled_sources(root)})
