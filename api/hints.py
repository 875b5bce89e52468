"""Scheduling hints from a KServe v2 inference request, validated at the edge.

Hints ride in the request's JSON ``parameters`` (for binary-tensor requests, in the JSON header
that ``Inference-Header-Content-Length`` delimits, so the tensors are never touched): ``priority``
and ``timeout`` with Triton's meaning, and ``nice``, ``slo_ms``, ``client_id`` (and, for streams of
tokens, ``ttft_ms`` and ``tpot_ms``). Clients that cannot set parameters may send the headers
``x-nice``, ``x-slo-ms``, ``x-client-id``, ``x-ttft-ms``, ``x-tpot-ms`` instead; parameters
win when both are given. Triton accepts the extra parameters, so the body is forwarded as is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from scheduler.request import Request
from scheduler.weights import NICE_MAX, NICE_MIN

if TYPE_CHECKING:
    from api.dispatcher import Job

HEADER_LENGTH = "inference-header-content-length"
MAX_CLIENT_ID = 128
MAX_TIMEOUT_US = 2**64 - 1  # Triton reads ``timeout`` as an unsigned 64-bit microsecond count


class BadRequestError(ValueError):
    """A malformed body or a bad hint; the message names the field and what is allowed."""


@dataclass(slots=True)  # not frozen: built per request, and cheaper so
class Hints:
    priority: int = 0
    timeout_us: int | None = None
    nice: int = 0
    slo_ms: float | None = None
    client_id: str = "default"
    ttft_ms: float | None = None  # generative models: time to the first token
    tpot_ms: float | None = None  # and time per output token after it

    def request(
        self,
        model: str,
        arrival_s: float,
        default_slo_ms: float,
        job: Job,
        outside_ms: float = 0.0,
    ) -> Request[Job]:
        """The scheduler's request with these hints, whatever the protocol that carried them.

        ``outside_ms``: the part of the SLO (and of the TTFT) spent outside the sidecar; the
        request is held to the rest. A hint that leaves nothing is a bad request."""
        slo_ms = self.slo_ms or default_slo_ms
        ttft_ms = self.ttft_ms
        if outside_ms > 0.0:
            for name, value in (("slo_ms", slo_ms), ("ttft_ms", ttft_ms)):
                if value is not None and value <= outside_ms:
                    raise BadRequestError(
                        f"{name} {value:g} leaves nothing for the sidecar: {outside_ms:g} ms of "
                        "every SLO is spent outside it (--slo-outside-ms)"
                    )
            slo_ms -= outside_ms
            ttft_ms = None if ttft_ms is None else ttft_ms - outside_ms
        return Request(
            model=model,
            arrival_s=arrival_s,
            slo_ms=slo_ms,
            priority=self.priority,
            nice=self.nice,
            client_id=self.client_id,
            payload=job,
            ttft_ms=ttft_ms,
            tpot_ms=self.tpot_ms,
        )


def json_header(body: bytes, headers: Mapping[str, str]) -> dict[str, Any]:
    """The request's JSON object: the whole body, or its binary-extension header."""
    return parse_json_object(json_header_bytes(body, headers))


def json_header_bytes(body: bytes, headers: Mapping[str, str]) -> bytes:
    """The bytes of the request's JSON: the whole body, or what ``Inference-Header-Content-
    Length`` delimits."""
    length_text = headers.get(HEADER_LENGTH)
    if length_text is None:
        return body
    try:
        length = int(length_text)
    except ValueError:
        raise BadRequestError(f"{HEADER_LENGTH} must be an integer, got {length_text!r}") from None
    if not 0 < length <= len(body):
        raise BadRequestError(f"{HEADER_LENGTH} is {length} but the body has {len(body)} bytes")
    return body[:length]


_decode = msgspec.json.Decoder().decode


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object. msgspec reads it (several times faster than the standard
    library); what msgspec refuses is read again by :func:`json.loads`, which decides, so that
    exactly what the standard library accepts is accepted (``NaN``, lone surrogates...)."""
    try:
        obj = _decode(raw)
    except (msgspec.DecodeError, ValueError, RecursionError):  # bad UTF-8 raises ValueError
        try:
            obj = json.loads(raw)
        except ValueError as err:  # bad JSON or UTF-8, or an integer past 4,300 digits
            raise BadRequestError(f"malformed request body: {err}") from None
        except RecursionError:
            raise BadRequestError("malformed request body: JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise BadRequestError("malformed request body: expected a JSON object")
    return obj


def _int(name: str, value: Any, lo: int, hi: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BadRequestError(f"{name} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise BadRequestError(f"{name} must be an integer, got {value!r}") from None
    if number < lo or (hi is not None and number > hi):
        allowed = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise BadRequestError(f"{name} must be in {allowed}, got {number}")
    return number


def _strict_int(name: str, value: Any, lo: int, hi: int) -> int:
    """A parameter Triton itself reads: a JSON integer, not a string that looks like one."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"{name} must be an integer, got {value!r}")
    return _int(name, value, lo, hi)


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BadRequestError(f"{name} must be a positive number of milliseconds, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise BadRequestError(
            f"{name} must be a positive number of milliseconds, got {value!r}"
        ) from None
    if not (number > 0 and math.isfinite(number)):
        raise BadRequestError(f"{name} must be a positive number of milliseconds, got {value!r}")
    return number


def parse_hints(
    request: Mapping[str, Any], headers: Mapping[str, str], priority_levels: int
) -> Hints:
    """Hints from ``parameters`` (then headers), each checked against its allowed range."""
    params = request.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequestError("parameters must be a JSON object")

    def pick(param: str, header: str) -> Any:
        return params[param] if param in params else headers.get(header)

    priority = params.get("priority")
    if priority is not None:
        priority = _strict_int("priority", priority, 0, priority_levels)
    else:
        priority = headers.get("x-priority")
    timeout = params.get("timeout")
    timeout_us = None if timeout is None else _strict_int("timeout", timeout, 0, MAX_TIMEOUT_US)
    nice = pick("nice", "x-nice")
    slo = pick("slo_ms", "x-slo-ms")
    ttft = pick("ttft_ms", "x-ttft-ms")
    tpot = pick("tpot_ms", "x-tpot-ms")
    client = pick("client_id", "x-client-id")
    if client is not None and (not isinstance(client, str) or not 0 < len(client) <= MAX_CLIENT_ID):
        raise BadRequestError(f"client_id must be a string of 1..{MAX_CLIENT_ID} characters")
    return Hints(
        priority=0 if priority is None else _int("priority", priority, 0, priority_levels),
        timeout_us=timeout_us or None,  # Triton's rule: 0 means no timeout
        nice=0 if nice is None else _int("nice", nice, NICE_MIN, NICE_MAX),
        slo_ms=None if slo is None else _positive("slo_ms", slo),
        client_id=client or "default",
        ttft_ms=None if ttft is None else _positive("ttft_ms", ttft),
        tpot_ms=None if tpot is None else _positive("tpot_ms", tpot),
    )
