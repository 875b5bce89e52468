from __future__ import annotations

import json
from typing import cast

import pytest

from api.dispatcher import Job, Send
from api.hints import BadRequestError, Hints, json_header, parse_hints


def body(params: dict[str, object] | None = None) -> bytes:
    req: dict[str, object] = {"inputs": []}
    if params is not None:
        req["parameters"] = params
    return json.dumps(req).encode()


def test_defaults_and_parameters() -> None:
    assert parse_hints(json_header(body(), {}), {}, 2) == Hints()
    hints = parse_hints(
        json_header(
            body(
                {"priority": 1, "timeout": 5000, "nice": -5, "slo_ms": 30, "client_id": "tenant-a"}
            ),
            {},
        ),
        {},
        2,
    )
    assert hints == Hints(priority=1, timeout_us=5000, nice=-5, slo_ms=30.0, client_id="tenant-a")


def test_headers_are_a_fallback_and_parameters_win() -> None:
    headers = {"x-nice": "7", "x-slo-ms": "12.5", "x-client-id": "b"}
    assert parse_hints(json_header(body(), {}), headers, 2) == Hints(
        nice=7, slo_ms=12.5, client_id="b"
    )
    assert parse_hints(json_header(body({"nice": 1}), {}), headers, 2).nice == 1


def test_binary_requests_read_only_the_json_header() -> None:
    header = body({"nice": 3})
    raw = header + b"\x00\x01\xff" * 20  # tensor bytes that are not JSON
    hints = parse_hints(
        json_header(raw, {"inference-header-content-length": str(len(header))}), {}, 2
    )
    assert hints.nice == 3


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"nice": 50}, r"nice must be in -20\.\.19, got 50"),
        ({"nice": "x"}, "nice must be an integer"),
        ({"nice": True}, "nice must be an integer"),
        ({"priority": 3}, r"priority must be in 0\.\.2, got 3"),
        ({"slo_ms": -1}, "slo_ms must be a positive number"),
        ({"slo_ms": "inf"}, "slo_ms must be a positive number"),
        ({"timeout": -5}, r"timeout must be in 0\.\."),
        ({"client_id": ""}, "client_id must be a string"),
        ({"client_id": 7}, "client_id must be a string"),
    ],
)
def test_bad_hints_name_the_field_and_range(params: dict[str, object], message: str) -> None:
    with pytest.raises(BadRequestError, match=message):
        parse_hints(json_header(body(params), {}), {}, 2)


def test_malformed_bodies() -> None:
    with pytest.raises(BadRequestError, match="malformed request body"):
        json_header(b"{not json", {})
    with pytest.raises(BadRequestError, match="expected a JSON object"):
        json_header(b"[1, 2]", {})
    with pytest.raises(BadRequestError, match="is 99 but the body has 2 bytes"):
        json_header(b"{}", {"inference-header-content-length": "99"})
    with pytest.raises(BadRequestError, match="must be an integer"):
        json_header(b"{}", {"inference-header-content-length": "two"})
    with pytest.raises(BadRequestError, match="parameters must be a JSON object"):
        parse_hints({"parameters": [1]}, {}, 2)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"priority": "1"}, "priority must be an integer"),
        ({"timeout": "100"}, "timeout must be an integer"),
        ({"timeout": 2**64}, r"timeout must be in 0\.\.18446744073709551615"),
        ({"timeout": 1.5}, "timeout must be an integer"),
    ],
)
def test_parameters_triton_reads_must_be_json_integers(
    params: dict[str, object], message: str
) -> None:
    with pytest.raises(BadRequestError, match=message):
        parse_hints(json_header(body(params), {}), {}, 2)


def test_timeout_zero_means_none_as_in_triton() -> None:
    assert parse_hints(json_header(body({"timeout": 0}), {}), {}, 2).timeout_us is None
    assert parse_hints(json_header(body({"timeout": 2**64 - 1}), {}), {}, 2).timeout_us == 2**64 - 1
    assert parse_hints(json_header(body(), {}), {"x-priority": "1"}, 2).priority == 1


def test_hostile_json_is_a_bad_request_not_a_crash() -> None:
    with pytest.raises(BadRequestError, match="nested too deeply"):
        json_header(b"[" * 100_000 + b"]" * 100_000, {})
    with pytest.raises(BadRequestError, match="malformed request body"):
        json_header(b'{"inputs": ' + b"9" * 5000 + b"}", {})
    with pytest.raises(BadRequestError, match="malformed request body"):
        json_header(b'{"a": "\xff"}', {})


def test_the_time_outside_the_sidecar_comes_off_every_slo() -> None:
    """``--slo-outside-ms``: the request is held to its SLO and TTFT less the time spent
    outside the sidecar; the default SLO too; TPOT (a gap between tokens) is left alone."""
    job = Job(send=cast(Send, None))  # carried, never sent
    hinted = Hints(slo_ms=30.0, ttft_ms=400.0, tpot_ms=25.0)
    request = hinted.request("m", 1.0, 100.0, job, outside_ms=1.5)
    assert (request.slo_ms, request.ttft_ms, request.tpot_ms) == (28.5, 398.5, 25.0)
    assert Hints().request("m", 1.0, 100.0, job, outside_ms=1.5).slo_ms == 98.5
    assert Hints(slo_ms=30.0).request("m", 1.0, 100.0, job).slo_ms == 30.0
    with pytest.raises(BadRequestError, match="slo_ms 1 leaves nothing for the sidecar"):
        Hints(slo_ms=1.0).request("m", 1.0, 100.0, job, outside_ms=1.5)
    with pytest.raises(BadRequestError, match=r"ttft_ms 1\.5 leaves nothing"):
        Hints(ttft_ms=1.5).request("m", 1.0, 100.0, job, outside_ms=1.5)
