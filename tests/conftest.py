"""What every test shares: a cache directory of the session's own.

The sidecar's default state directory (the tables it profiles and learns) lives under
``XDG_CACHE_HOME``. A test, or a benchmark a test runs, that starts the embedded default with
the default state directory would otherwise profile its model under the test suite's load into
the user's own cache, where the next ``make demo`` reads that table as if it had profiled it.
The session gets one temporary cache instead, set here, before any test module imports the
defaults (so that defaults read at import and at call agree), inherited by every process a test
starts, and removed at the session's end.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_CACHE = Path(tempfile.mkdtemp(prefix="tests-cache-"))
os.environ["XDG_CACHE_HOME"] = str(_CACHE)


@pytest.fixture(scope="session", autouse=True)
def session_cache() -> Iterator[Path]:
    yield _CACHE
    shutil.rmtree(_CACHE, ignore_errors=True)
