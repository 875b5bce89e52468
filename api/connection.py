"""Limits on an HTTP connection that uvicorn's httptools protocol does not enforce itself.

uvicorn bounds open connections (``limit_concurrency``) and idle keep-alive time, but with
httptools it accepts request headers of any size and waits for them forever: one client sending
a 64 MB header, or 200 sending a byte a second, held the sidecar. This protocol answers 431 once
the request line and headers pass ``max_header_bytes``, and 408 when they have not arrived within
``header_timeout_s`` of the connection opening (or of the request's first byte); then closes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def _reply(status: str, message: str) -> bytes:
    body = ('{"error": "' + message + '"}').encode()
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header size bound and a header deadline."""

    max_header_bytes = 64 * 1024
    header_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._rejected = False
        self._in_headers = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        super().data_received(data)
        if self._in_headers and not self._rejected:  # this chunk ended inside the headers
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self._reject(
                    "431 Request Header Fields Too Large",
                    f"request line and headers exceed {self.max_header_bytes} bytes",
                )

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _reject(self, status: str, message: str) -> None:
        self._rejected = True
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(_reply(status, message))
            self.transport.close()

    def _too_slow(self) -> None:
        self._header_timer = None
        if self.cycle is None or self.cycle.response_complete:  # no request being served
            self._reject("408 Request Timeout", "request headers not received in time")

    def send_400_response(self, msg: str) -> None:
        """A request httptools cannot parse: 400 in the protocol's JSON shape, then close."""
        self._reject("400 Bad Request", msg.replace('"', "'"))

    def on_message_begin(self) -> None:
        self._header_bytes = 0
        self._in_headers = True
        self._arm()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._disarm()
        super().on_headers_complete()


def bounded_protocol(max_header_bytes: int, header_timeout_s: float) -> type[HttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with these bounds."""
    return type(
        "SidecarHttpProtocol",
        (BoundedHttpToolsProtocol,),
        {"max_header_bytes": max_header_bytes, "header_timeout_s": header_timeout_s},
    )
