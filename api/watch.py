"""Watch Triton: probe it, restart the embedded one when it dies, say whether we are live.

The rule, for every front end:

- Triton is *up* while ``/v2/health/ready`` answers 200 within the probe's timeout; the
  sidecar's readiness follows it.
- While Triton is down, new requests are refused at once with 503 and ``Retry-After`` (work
  that cannot run is not queued); requests already queued are still sent, and those Triton does
  not answer get 503. Nothing accepted goes unanswered.
- The embedded Triton is restarted when its process ends, or when it has not answered for
  ``restart_after_s`` (hung), with exponential backoff between attempts (``backoff_s`` doubling
  to ``max_backoff_s``). An external Triton is only probed: the sidecar serves again as soon as
  it answers.
- Liveness turns false once Triton has been down for ``liveness_grace_s``, so that a supervisor
  (Kubernetes' liveness probe) restarts the whole pod.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from api.embedded import EmbeddedTriton
from api.tasks import cancel_and_wait
from api.upstream import Upstream
from api.upstream_errors import UpstreamUnavailableError

log = logging.getLogger(__name__)


class TritonWatch:
    """Probes one Triton every ``probe_interval_s`` in a task; see the module docstring."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        embedded: EmbeddedTriton | None = None,
        on_restart: Callable[[], Awaitable[None]] | None = None,
        probe_interval_s: float = 0.5,
        liveness_grace_s: float = 60.0,
        restart_after_s: float = 10.0,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        time_source: Callable[[], float] = time.monotonic,
    ) -> None:
        self.upstream = upstream
        self.embedded = embedded
        self._on_restart = on_restart
        self.probe_interval_s = probe_interval_s
        self.liveness_grace_s = liveness_grace_s
        self.restart_after_s = restart_after_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._now = time_source
        self.up = True
        self.down_since_s: float | None = None
        self._next_restart_s = 0.0
        self._backoff_s = backoff_s
        self._task: asyncio.Task[None] | None = None

    def live(self) -> bool:
        """False once Triton has been down longer than ``liveness_grace_s``."""
        since = self.down_since_s
        return since is None or self._now() - since < self.liveness_grace_s

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="triton-watch")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def probe(self) -> bool:
        """One readiness probe of Triton."""
        timeout_s = max(1.0, 2 * self.probe_interval_s)
        try:
            resp = await self.upstream.request("GET", "/v2/health/ready", timeout_s=timeout_s)
        except UpstreamUnavailableError:
            return False
        return resp.status == 200

    def _mark(self, up: bool) -> None:
        now = self._now()
        if up and not self.up:
            log.warning(
                "Triton at %s is back after %.1f s",
                self.upstream.url,
                now - (self.down_since_s or now),
            )
        elif not up and self.up:
            log.warning("Triton at %s is down", self.upstream.url)
        self.up = up
        if up:
            self.down_since_s = None
            self._backoff_s = self.backoff_s
        elif self.down_since_s is None:
            self.down_since_s = now

    async def _run(self) -> None:
        while True:
            embedded = self.embedded
            dead = embedded is not None and not embedded.alive()
            self._mark(False if dead else await self.probe())
            if embedded is not None and not self.up and self._should_restart(dead):
                await self._restart(embedded)
            await asyncio.sleep(self.probe_interval_s)

    def _should_restart(self, dead: bool) -> bool:
        now = self._now()
        if now < self._next_restart_s:
            return False
        hung = self.down_since_s is not None and now - self.down_since_s >= self.restart_after_s
        return dead or hung

    async def _restart(self, embedded: EmbeddedTriton) -> None:
        why = await asyncio.to_thread(embedded.why_down)  # reads Triton's log: off the loop
        log.warning(
            "restarting the embedded Triton (next attempt no sooner than %.1f s): %s",
            self._backoff_s,
            why,
        )
        self._next_restart_s = self._now() + self._backoff_s
        self._backoff_s = min(2 * self._backoff_s, self.max_backoff_s)
        try:
            await asyncio.to_thread(embedded.restart)
        except Exception as err:
            log.error("the embedded Triton did not restart: %s", err)
            return
        await self.upstream.retarget(embedded.url)
        if self._on_restart is not None:
            await self._on_restart()
        self._mark(await self.probe())
