"""What every test shares: a cache directory of the session's own.

The sidecar's default state directory (the tables it profiles and learns) lives under
``XDG_CACHE_HOME``. A test, or a benchmark a test runs, that starts the embedded default with
the default state directory would otherwise profile its model under the test suite's load into
the user's own cache, where the next ``make demo`` reads that table as if it had profiled it.
The session gets one temporary cache instead, removed at its end; every process a test starts
inherits it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def session_cache() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tests-cache-"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(path))
        yield path
    shutil.rmtree(path, ignore_errors=True)
