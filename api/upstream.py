"""The connection to Triton: one pooled keep-alive HTTP session; bodies pass through as bytes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp

FORWARD_HEADERS = (
    "content-type",
    "inference-header-content-length",
    "accept-encoding",
    "content-encoding",
)


STREAM_HEADERS = ("content-type", "cache-control")


class UpstreamUnavailableError(Exception):
    """Triton could not be reached or dropped the connection."""


@dataclass(frozen=True, slots=True)
class UpstreamResponse:
    status: int
    body: bytes
    headers: dict[str, str]

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass(frozen=True, slots=True)
class UpstreamStream:
    """A reply that arrives in pieces (server-sent events): its status, headers, and chunks."""

    status: int
    headers: dict[str, str]
    chunks: AsyncIterator[bytes]


class Upstream:
    """A Triton server at ``host:port``."""

    def __init__(self, url: str, *, max_connections: int = 64, timeout_s: float = 300.0) -> None:
        self.url = url if url.startswith("http") else f"http://{url}"
        self._max_connections = max_connections
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        # A stream may last minutes: bounded between chunks, not in total.
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=60)
        # No Accept-Encoding of aiohttp's own: only the client's is forwarded, so a client that
        # did not ask for compression never gets a compressed body.
        self._session = aiohttp.ClientSession(
            self.url,
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
        )

    async def retarget(self, url: str) -> None:
        """Talk to Triton at ``url`` from now on (the embedded one restarted on new ports)."""
        new_url = url if url.startswith("http") else f"http://{url}"
        if new_url == self.url and self._session is not None:
            return
        old, self._session = self._session, None
        self.url = new_url
        await self.open()
        if old is not None:
            await old.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> UpstreamResponse:
        """Send one request; :class:`UpstreamUnavailableError` when Triton cannot be reached
        (or does not answer within ``timeout_s``, when given)."""
        if self._session is None:
            raise UpstreamUnavailableError("the connection to Triton is closed")
        timeout = self._timeout if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._session.request(
                method, path, data=body or None, headers=headers, timeout=timeout
            ) as resp:
                content = await resp.read()
                out = {
                    k.lower(): v for k, v in resp.headers.items() if k.lower() in FORWARD_HEADERS
                }
                return UpstreamResponse(resp.status, content, out)
        except (aiohttp.ClientConnectionError, aiohttp.ServerTimeoutError, TimeoutError) as err:
            raise UpstreamUnavailableError(f"Triton at {self.url} is unavailable: {err}") from err

    @asynccontextmanager
    async def stream(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> AsyncIterator[UpstreamStream]:
        """Send one request whose reply streams: chunks as they come; leaving the block closes
        the connection, which tells the upstream that nobody reads any more."""
        if self._session is None:
            raise UpstreamUnavailableError("the connection to Triton is closed")
        try:
            async with self._session.request(
                method, path, data=body or None, headers=headers, timeout=self._stream_timeout
            ) as resp:
                out = {k.lower(): v for k, v in resp.headers.items() if k.lower() in STREAM_HEADERS}
                try:
                    yield UpstreamStream(resp.status, out, resp.content.iter_any())
                finally:
                    resp.close()  # not back to the pool: a stream cut short must end upstream
        except (aiohttp.ClientConnectionError, aiohttp.ServerTimeoutError, TimeoutError) as err:
            raise UpstreamUnavailableError(f"{self.url} is unavailable: {err}") from err
