"""An HTTP inference request, from its path, headers and body to its reply: what the sidecar's
connection (:mod:`api.connection`) and the FastAPI route (:mod:`api.routes.inference`) both run.

Compiled with the rest of the request path (``setup.py``): the connection's call into
:func:`infer`, and :func:`infer`'s into admission, are calls between compiled functions.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from api.admission import Inbound, Outcome, admit
from api.dispatcher import Job, post
from api.errors import error_body
from api.hints import HEADER_LENGTH, json_header_bytes, parse_json_object
from api.runtime import Runtime
from api.tensors import MAX_JSON_DEPTH, ModelLimits, check_request, nesting_bound
from api.triton_priority import post_at_level
from api.upstream import UpstreamResponse

PASS_HEADERS = ("content-type", HEADER_LENGTH, "accept-encoding", "content-encoding")
GPU_HEADER = "x-sidecar-gpu"  # which GPU of the node served the request
Reply = tuple[int, dict[str, str], bytes]


class HttpBody:
    """An HTTP inference body as admission reads it: the JSON (or the binary extension's JSON
    header), parsed once."""

    def __init__(self, body: bytes, headers: Mapping[str, str]) -> None:
        self._body = body
        self._headers = headers
        self._json: dict[str, Any] | None = None
        self._shallow = False

    def _parsed(self) -> dict[str, Any]:
        if self._json is None:
            raw = json_header_bytes(self._body, self._headers)
            self._json = parse_json_object(raw)
            self._shallow = nesting_bound(raw) <= MAX_JSON_DEPTH
        return self._json

    def parameters(self) -> Any:
        return self._parsed().get("parameters")

    def check(self, *, max_elements: int, model: ModelLimits | None) -> None:
        header_length = self._headers.get(HEADER_LENGTH)
        binary = len(self._body) - int(header_length) if header_length is not None else 0
        request = self._parsed()
        check_request(
            request, binary, max_elements=max_elements, model=model, shallow=self._shallow
        )


STATUS = {
    Outcome.BAD_REQUEST: 400,
    Outcome.UNAUTHORIZED: 401,
    Outcome.UNKNOWN_MODEL: 404,
    Outcome.REJECTED: 429,
    Outcome.UNAVAILABLE: 503,
}


async def infer(
    rt: Runtime,
    model: str,
    version: str | None,
    body: bytes,
    headers: Mapping[str, str],
    arrival_s: float | None = None,
) -> Reply:
    """Schedule one inference request and return Triton's reply (or the protocol's error);
    ``arrival_s``: when its first byte was read (default: now)."""
    path = (
        f"/v2/models/{model}/versions/{version}/infer" if version else f"/v2/models/{model}/infer"
    )
    forward = {k: v for k in PASS_HEADERS if (v := headers.get(k)) is not None}
    inbound = Inbound(
        protocol="http",
        model=model,
        body=HttpBody(body, headers),
        headers=headers,
        arrival_s=time.monotonic() if arrival_s is None else arrival_s,
        job=Job(send=post(path, body, forward), at_level=post_at_level(path, body, forward)),
    )
    admission = await admit(rt, inbound)
    if admission.answer is not None:
        answer: UpstreamResponse = admission.answer
        headers = answer.headers
        if admission.gpu is not None:
            headers = {**headers, GPU_HEADER: admission.gpu}
        return answer.status, headers, answer.body
    status, out_headers, content = error_body(STATUS[admission.outcome], admission.message)
    if admission.retry:
        out_headers = {**out_headers, "retry-after": "1"}
    return status, out_headers, content


def infer_target(path: str) -> tuple[str, str | None] | None:
    """``(model, version)`` when ``path`` is an inference path (version None when it names
    none), else None."""
    parts = path.split("/")
    # ["", "v2", "models", m, "infer"] or ["", "v2", "models", m, "versions", v, "infer"]
    shaped = len(parts) == 5 or (len(parts) == 7 and parts[4] == "versions")
    if shaped and parts[1] == "v2" and parts[2] == "models" and parts[-1] == "infer":
        return parts[3], parts[5] if len(parts) == 7 else None
    return None


def too_large(limit: int) -> Reply:
    """413 for a body over ``--max-body-bytes``, as every HTTP path says it."""
    return error_body(413, f"request body larger than {limit} bytes (--max-body-bytes)")
