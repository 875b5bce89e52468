"""The tenants file: who may claim which priority, nice and client id."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.hints import Hints
from api.tenants import ANONYMOUS, Tenants, UnknownTokenError
from tests.api.live import LiveSidecar, embedded_config

TENANTS = f"""
[defaults]
highest_priority = 0
lowest_nice = 0

[[tenant]]
token = "tok-search"
client_id = "search"
highest_priority = 1
lowest_nice = -5
slo_ms = 40

[[tenant]]
token_sha256 = "{hashlib.sha256(b"tok-batch").hexdigest()}"
client_id = "batch"
highest_priority = 2
lowest_nice = 5
"""


@pytest.fixture
def tenants(tmp_path: Path) -> Tenants:
    path = tmp_path / "tenants.toml"
    path.write_text(TENANTS)
    return Tenants.load(path)


def test_unknown_clients_are_held_to_the_defaults(tenants: Tenants) -> None:
    greedy = Hints(priority=1, nice=-20, client_id="search")
    assert tenants.apply(greedy, None) == Hints(priority=0, nice=0, client_id=ANONYMOUS)
    assert tenants.apply(Hints(nice=3, client_id="me"), None) == Hints(nice=3, client_id="me")


def test_tenants_get_their_id_and_their_rights_at_most(tenants: Tenants) -> None:
    asked = Hints(priority=1, nice=-20, client_id="someone-else")
    assert tenants.apply(asked, "Bearer tok-search") == Hints(
        priority=1, nice=-5, slo_ms=40.0, client_id="search"
    )
    assert tenants.apply(asked, "Bearer tok-batch") == Hints(priority=2, nice=5, client_id="batch")
    assert tenants.apply(Hints(priority=0, nice=10), "Bearer tok-batch").nice == 10
    with pytest.raises(UnknownTokenError):
        tenants.apply(asked, "Bearer nope")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[tenant]]\nclient_id = 'x'\n", "needs token"),
        ("[[tenant]]\ntoken = 't'\n", "client_id"),
        ("[defaults]\nlowest_nice = -30\n", "lowest_nice must be"),
        ("[[tenant]]\ntoken='t'\nclient_id='a'\n[[tenant]]\ntoken='t'\nclient_id='b'\n", "same"),
        ("not toml [", "--tenants"),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        Tenants.load(path)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveSidecar]:
    state = tmp_path_factory.mktemp("state")
    (state / "tenants.toml").write_text(TENANTS)
    with LiveSidecar(embedded_config(state, tenants=state / "tenants.toml")) as sc:
        yield sc


def body(**params: object) -> bytes:
    tensor = {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}
    return json.dumps({"inputs": [tensor], "parameters": params}).encode()


def test_live_claims_are_held_to_the_file(sidecar: LiveSidecar) -> None:
    greedy = body(priority=1, nice=-20, client_id="search")
    assert sidecar.post("/v2/models/simnet/infer", content=greedy).status_code == 200
    r = sidecar.post(
        "/v2/models/simnet/infer", content=greedy, headers={"Authorization": "Bearer wrong"}
    )
    assert r.status_code == 401 and "matches no tenant" in r.json()["error"]
    r = sidecar.post(
        "/v2/models/simnet/infer", content=greedy, headers={"Authorization": "Bearer tok-search"}
    )
    assert r.status_code == 200
    weights = {
        (s.labels["client"], s.labels["priority"]): s.value
        for f in text_string_to_metric_families(sidecar.get("/metrics").text)
        if f.name == "sidecar_client_weight"
        for s in f.samples
    }
    assert weights[(ANONYMOUS, "2")] == 1024  # nice 0, the default level: not search's place
    assert weights[("search", "1")] == 3121  # nice -5, its own highest level
    assert ("search", "2") not in weights
