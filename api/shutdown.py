"""A bounded shutdown: SIGTERM (or SIGINT) drains the sidecar in at most ``grace_s``.

uvicorn alone waits for every open request, and a request held by a hung Triton only ends at
the upstream timeout (300 s): Kubernetes would SIGKILL the pod at 30 s with the GPU's clock still
locked. Here the first signal:

1. stops accepting connections, and makes readiness and new requests on open connections 503;
2. lets the queue and the requests in flight finish for up to ``grace_s``;
3. answers whatever is left with 503 (queued ones, and in-flight ones Triton has not answered);
4. then lets uvicorn shut down, which gives the clock back and stops the embedded Triton
   (SIGKILL if it does not go within seconds).

A second signal skips what is left of the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from types import FrameType

import uvicorn

from api.runtime import Runtime

log = logging.getLogger(__name__)
POLL_S = 0.05


class GracefulServer(uvicorn.Server):
    """``uvicorn.Server`` whose exit signal drains ``runtime`` first (see the module doc)."""

    def __init__(self, config: uvicorn.Config, runtime: Runtime, *, grace_s: float) -> None:
        super().__init__(config)
        self.runtime = runtime
        self.grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()

    async def startup(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)  # type: ignore[arg-type]

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop = self._loop
        if loop is None or not self.started or self.should_exit:
            super().handle_exit(sig, frame)
            return
        loop.call_soon_threadsafe(self._signalled)

    def _signalled(self) -> None:
        if self._drain is None:
            self._drain = asyncio.create_task(self.drain(), name="drain")
        else:
            self._hurry.set()

    async def drain(self) -> None:
        """Steps 1-3 of the module docstring, then ask uvicorn to exit."""
        started = time.monotonic()
        rt = self.runtime
        rt.draining = True
        for server in self.servers:
            server.close()
        for gpu in rt.gpus:  # no restarts of Triton while going down
            if gpu.watch is not None:
                await gpu.watch.stop()
        dispatchers = rt.dispatchers
        log.warning("shutting down: up to %.0f s for the work already accepted", self.grace_s)

        def busy() -> bool:
            return bool(rt.pending) or any(not d.idle for d in dispatchers)

        deadline = started + self.grace_s
        while busy() and not self._hurry.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hurry.wait(), min(POLL_S, left))
        if busy():
            log.warning(
                "grace period over: answering %d requests still open with 503", len(rt.pending)
            )
        for dispatcher in dispatchers:
            await dispatcher.stop(inflight_timeout_s=0.0)
        for task in list(rt.pending):
            task.cancel()
        if rt.pending:
            await asyncio.wait(list(rt.pending), timeout=1.0)
        log.info("drained in %.2f s", time.monotonic() - started)
        self.should_exit = True
