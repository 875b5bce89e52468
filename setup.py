"""The build's one step beyond pyproject.toml: the request path compiled with mypyc.

The modules below run on every request (the HTTP connection, admission, the scheduler core's
enqueue, dispatch, completion and clock plan, the dispatcher, the upstream client, the
metrics a request changes, gRPC's HTTP/2 at both ends and its message checks); mypyc
compiles them, type annotations and all, into one C extension (docs/performance.md, "The
compiled request path", says what it saves and how that is measured). The Python source
stays beside it and is what runs wherever the build could not compile (no mypyc, no C
compiler, a type check that fails) or was told not to (``SIDECAR_PURE_PYTHON=1``): the build
then says why and ships the Python.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup

# What runs per request. The settings they read stay plain Python (scheduler/params.py), and
# so does what an async generator is made of (api/upstream_stream.py, the gRPC front end's
# streams): mypyc compiles neither.
COMPILED = [
    "api/admission.py",
    "api/connection.py",
    "api/counts.py",
    "api/dispatcher.py",
    "api/grpc_frontend/channel.py",
    "api/grpc_frontend/h2.py",
    "api/grpc_frontend/h2server.py",
    "api/grpc_frontend/protocol.py",
    "api/grpc_frontend/unary.py",
    "api/hints.py",
    "api/http_infer.py",
    "api/tensors.py",
    "api/upstream.py",
    "api/upstream_errors.py",
    "scheduler/adaptive.py",
    "scheduler/constraints.py",
    "scheduler/core.py",
    "scheduler/feedback.py",
    "scheduler/observe.py",
    "scheduler/policies.py",
    "scheduler/queue.py",
    "scheduler/request.py",
    "scheduler/view.py",
    "scheduler/waitbound.py",
    "scheduler/weights.py",
]


def _warn(why: str) -> None:
    print(f"setup.py: the request path stays pure Python: {why}", file=sys.stderr)


def compiled_modules() -> list[Extension]:
    """The request path as C extensions, or none (the reason printed) where it cannot be built."""
    if os.environ.get("SIDECAR_PURE_PYTHON"):
        _warn("SIDECAR_PURE_PYTHON is set")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypyc (part of mypy) is not installed")
        return []
    try:
        extensions: list[Extension] = mypycify(COMPILED, opt_level="3", group_name="sidecar_native")
    except (Exception, SystemExit) as e:  # mypyc exits on a failed type check
        _warn(f"mypyc could not compile it ({e!r})")
        return []
    for extension in extensions:
        extension.optional = True  # no C compiler: a warning, and the Python source runs
    return extensions


setup(ext_modules=compiled_modules())
