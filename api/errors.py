"""Errors in the KServe v2 / Triton shape: ``{"error": "..."}`` with Triton's status codes."""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def error_body(status: int, message: str) -> tuple[int, dict[str, str], bytes]:
    """The same error as (status, headers, body), for code that writes the reply itself."""
    return status, {"content-type": "application/json"}, json.dumps({"error": message}).encode()


def install(app: FastAPI) -> None:
    """Make FastAPI's own errors (404 route, 405, validation) speak the protocol's shape too."""

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    async def validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        parts = [f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors()]
        return error(400, "; ".join(parts) or "invalid request")

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
