"""Property-based fuzzing of the inference and admin endpoints on the real embedded stack.

Seeded (``derandomize``), ``FUZZ_EXAMPLES`` cases per property (a few hundred in ``make test``,
10,000 in ``make fuzz``). The property: whatever a client sends, the reply is the protocol's own
(200, or a 4xx/503 with ``{"error": ...}``), nothing is logged as an unhandled exception, Triton
is never restarted, and a valid request is still served afterwards.
"""

from __future__ import annotations

import json
import logging
import os
import string
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.live import LiveSidecar, embedded_config

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "300"))
ADMIN = {"Authorization": "Bearer test-token"}
ALLOWED = {200, 400, 401, 403, 404, 405, 408, 413, 422, 429, 503}
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
VALID = {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}


class Errors(logging.Handler):
    """Every ERROR (or worse) any logger emits while the fuzzing runs."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveSidecar, Errors]]:
    errors = Errors()
    logging.getLogger().addHandler(errors)
    try:
        config = embedded_config(tmp_path_factory.mktemp("state"), max_queue=64)
        with LiveSidecar(config) as sc:
            yield sc, errors
    finally:
        logging.getLogger().removeHandler(errors)


@pytest.fixture(scope="module")
def http(stack: tuple[LiveSidecar, Errors]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{stack[0].url}", timeout=60) as client:
        yield client


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)
dims = st.integers(min_value=-2, max_value=10**13)
tensors = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["INPUT0", "INPUT1", ""]) | json_values,
        "shape": st.lists(dims, max_size=4) | json_values,
        "datatype": st.sampled_from(["FP32", "INT8", "BYTES", "FP16", "BOOL", "X"]) | json_values,
        "data": st.lists(st.floats(allow_nan=False, width=32), max_size=40) | json_values,
        "parameters": st.dictionaries(
            st.sampled_from(["binary_data_size", "shared_memory_region", "x"]),
            st.integers(min_value=-5, max_value=10**6) | json_values,
            max_size=2,
        ),
    },
)
hint_params = st.dictionaries(
    st.sampled_from(["priority", "timeout", "nice", "slo_ms", "client_id", "other"]),
    st.integers(min_value=-(2**65), max_value=2**65) | json_values,
    max_size=4,
)
requests = st.fixed_dictionaries(
    {},
    optional={
        "inputs": st.lists(tensors, max_size=3) | json_values,
        "parameters": hint_params | json_values,
        "outputs": json_values,
        "id": json_values,
    },
)


def _check(reply: httpx.Response) -> None:
    assert reply.status_code in ALLOWED, (reply.status_code, reply.text[:300])
    if reply.status_code != 200:
        assert "error" in reply.json(), reply.text[:300]


@FUZZ
@given(
    request=requests,
    model=st.sampled_from(["simnet", "noop", "ghost", "x" * 300]),
    binary_tail=st.none() | st.binary(max_size=200),
    header_length=st.none()
    | st.integers(min_value=-5, max_value=500)
    | st.text(alphabet=string.ascii_letters + string.digits + "-+.", min_size=1, max_size=5),
)
def test_fuzzed_inference_requests_get_protocol_answers(
    http: httpx.Client,
    request: dict[str, Any],
    model: str,
    binary_tail: bytes | None,
    header_length: int | str | None,
) -> None:
    head = json.dumps(request).encode()
    headers = {}
    body = head
    if binary_tail is not None:
        body = head + binary_tail
        headers["Inference-Header-Content-Length"] = str(
            len(head) if header_length is None else header_length
        )
    _check(http.post(f"/v2/models/{model}/infer", content=body, headers=headers))


@FUZZ
@given(raw=st.binary(max_size=300))
def test_fuzzed_raw_bodies_get_protocol_answers(http: httpx.Client, raw: bytes) -> None:
    _check(http.post("/v2/models/simnet/infer", content=raw))


@FUZZ
@given(
    method=st.sampled_from(["GET", "PUT", "POST", "DELETE"]),
    path=st.sampled_from(["/state", "/policy", "/clock", "/table", "/nothing"]),
    body=json_values,
    token=st.sampled_from(["test-token", "wrong", "t\u00e9st", "-"]),
)
def test_fuzzed_admin_calls_get_protocol_answers(
    http: httpx.Client, method: str, path: str, body: Any, token: str
) -> None:
    headers = {b"Authorization": f"Bearer {token}".encode()}
    _check(http.request(method, f"/admin{path}", content=json.dumps(body), headers=headers))


def test_after_the_fuzzing_the_stack_still_serves(
    stack: tuple[LiveSidecar, Errors], http: httpx.Client
) -> None:
    sidecar, errors = stack
    http.put("/admin/clock", json={"clock_mhz": None}, headers=ADMIN)
    http.put("/admin/policy", json={"policy": "slack"}, headers=ADMIN)
    reply = http.post("/v2/models/simnet/infer", content=json.dumps({"inputs": [VALID]}))
    assert reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [2.0] * 16
    assert sidecar.runtime.embedded is not None and sidecar.runtime.embedded.restarts == 0
    assert not errors.records, [r.getMessage() for r in errors.records[:5]]
