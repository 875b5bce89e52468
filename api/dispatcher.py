"""One dispatch loop per GPU: drives the scheduler core in the event loop and talks to Triton.

The core is synchronous and only ever called from the event loop's thread, so it needs no lock.
Clock changes are applied off the request path by :class:`ClockApplier` (an NVML call takes
milliseconds), coalesced to the latest target. Every accepted request gets an answer: Triton's
reply, or an error (Triton unreachable, timeout expired in the queue, shutting down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from api.metrics import GatewayMetrics
from api.upstream import Upstream, UpstreamResponse, UpstreamUnavailableError
from dvfs.device import Device
from dvfs.errors import DeviceError
from scheduler.core import Scheduler
from scheduler.request import Request

log = logging.getLogger(__name__)
MAX_TIMER_US = 86_400 * 10**6  # a queued timeout longer than a day is not worth a timer


class RejectedError(Exception):
    """The scheduler refused the request (queue full, fair share reached); carries the reason."""


class UnavailableError(Exception):
    """An accepted request could not be served: Triton down, timeout expired, shutting down."""


@dataclass(slots=True)
class Job:
    """What the gateway needs to send one request to Triton and answer it."""

    path: str
    body: bytes
    headers: dict[str, str]
    timeout_us: int | None = None
    future: asyncio.Future[UpstreamResponse] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class ClockApplier:
    """Sets the GPU's clock in a worker thread, always to the latest target asked for."""

    def __init__(self, device: Device, on_change: Callable[[int | None], None]) -> None:
        self.device = device
        self._on_change = on_change
        self._target: int | None = None
        self._applied: int | bool | None = False  # False: nothing applied yet
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def request(self, clock_mhz: int | None) -> None:
        """Ask for ``clock_mhz`` (None: give the clock back to the GPU)."""
        self._target = clock_mhz
        self._event.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="clock-applier")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await self._event.wait()
            self._event.clear()
            target = self._target
            if self._applied is not False and target == self._applied:
                continue
            try:
                if target is None:
                    await asyncio.to_thread(self.device.reset)
                else:
                    await asyncio.to_thread(self.device.set_clock_mhz, target)
            except DeviceError:
                log.exception("could not set the clock to %s MHz", target)
                continue
            self._applied = target
            self._on_change(target)


class GpuDispatcher:
    """The queue, the in-flight set and the clock of one GPU, live."""

    def __init__(
        self,
        *,
        gpu: str,
        scheduler: Scheduler,
        device: Device,
        upstream: Upstream,
        metrics: GatewayMetrics,
        time_source: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gpu = gpu
        self.scheduler = scheduler
        self.device = device
        self.upstream = upstream
        self.metrics = metrics
        self._now = time_source
        self._clock = ClockApplier(device, self._clock_applied)
        self._sends: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self._clock.start()
        self.change_policy()

    async def stop(self, inflight_timeout_s: float = 30.0) -> None:
        """Answer everything still waiting, give in-flight requests ``inflight_timeout_s`` to
        finish (then answer them 503: a hung Triton must not hold the exit), stop the clock."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for request in self.scheduler.drain():
            self._fail(request, UnavailableError("the sidecar is shutting down"))
        if self._sends:
            await asyncio.wait(self._sends, timeout=inflight_timeout_s)
        for task in list(self._sends):
            task.cancel()
        if self._sends:
            await asyncio.wait(self._sends, timeout=1.0)
        await self._clock.stop()

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing in flight."""
        return not self.scheduler.queue_len and not self.scheduler.inflight

    def change_policy(self) -> None:
        """The core's policy is new (or first): apply its clock, publish it, arm its timer."""
        self._clock.request(self.scheduler.clock_target_mhz)
        self.metrics.set_policy(self.gpu, self.scheduler.policy.name)
        self._arm_timer()

    # -- requests ----------------------------------------------------------------------

    async def submit(self, request: Request) -> UpstreamResponse:
        """Queue ``request`` (its ``payload`` a :class:`Job`) and wait for Triton's answer."""
        if self._closed:
            raise UnavailableError("the sidecar is shutting down")
        result = self.scheduler.enqueue(request, self._now())
        if not result.accepted:
            raise RejectedError(result.reason or "refused")
        self._apply(result.clock_mhz)
        self._pump()
        job: Job = request.payload
        timer = None
        if job.timeout_us is not None and job.timeout_us < MAX_TIMER_US and not job.future.done():
            timer = asyncio.get_running_loop().call_later(
                job.timeout_us / 1e6, self._expire, request
            )
        try:
            return await job.future
        except asyncio.CancelledError:  # the client went away: its place in the queue goes too
            self._forget(request)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, request: Request) -> None:
        """A queued request's ``timeout`` ran out: answered now, not when it reaches the head."""
        if self._forget(request):
            self._fail(request, UnavailableError("Request timeout expired"))

    def _forget(self, request: Request) -> bool:
        if not self.scheduler.cancel(request):
            return False
        self._gauges()
        self._arm_timer()
        return True

    def _pump(self) -> None:
        """Send what the core says to send, while it has room."""
        while (d := self.scheduler.next_dispatch(self._now())) is not None:
            self._apply(d.clock_mhz)
            request, job = d.request, d.request.payload
            now = self._now()
            if job.timeout_us is not None and (now - request.arrival_s) * 1e6 > job.timeout_us:
                self.scheduler.on_complete(request, 0.0, now)
                self._fail(request, UnavailableError("Request timeout expired"))
                continue
            self.metrics.queue_delay.labels(self.metrics.model_label(request.model)).observe(
                now - request.arrival_s
            )
            task = asyncio.create_task(self._send(request, now))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)
        self._gauges()
        self._arm_timer()

    async def _send(self, request: Request, sent_s: float) -> None:
        job: Job = request.payload
        error: Exception | None = None
        response: UpstreamResponse | None = None
        try:
            response = await self.upstream.request("POST", job.path, job.body, job.headers)
        except asyncio.CancelledError:  # shutting down with Triton not answering
            self._fail(request, UnavailableError("the sidecar is shutting down"))
            raise
        except UpstreamUnavailableError as err:
            error = UnavailableError(str(err))
        except Exception as err:  # answered below, never silently dropped
            log.exception("request to Triton failed")
            error = UnavailableError(f"request to Triton failed: {err}")
        now = self._now()
        service_s = now - sent_s
        done = self.scheduler.on_complete(request, service_s, now)
        self._apply(done.clock_mhz)
        client = self.metrics.client_label(request.client_id)
        self.metrics.gpu_time.labels(client, str(request.level), str(request.nice)).inc(service_s)
        if error is not None or response is None:
            self._fail(request, error or UnavailableError("no response from Triton"))
        else:
            latency_s = now - request.arrival_s
            model = self.metrics.model_label(request.model)
            self.metrics.latency.labels(model, client).observe(latency_s)
            if response.status == 200:
                met = "true" if latency_s * 1000.0 <= request.slo_ms else "false"
                self.metrics.slo.labels(model, client, met).inc()
            if not job.future.done():
                job.future.set_result(response)
        self._pump()

    def _fail(self, request: Request, error: Exception) -> None:
        job: Job = request.payload
        if not job.future.done():
            job.future.set_exception(error)

    # -- clock and timers --------------------------------------------------------------

    def _apply(self, clock_mhz: int | None) -> None:
        if clock_mhz is not None:
            self._clock.request(clock_mhz)

    def _clock_applied(self, clock_mhz: int | None) -> None:
        self.metrics.clock_changes.labels(self.gpu).inc()
        self.metrics.clock_set.labels(self.gpu).set(0.0 if clock_mhz is None else clock_mhz * 1e6)

    def _arm_timer(self) -> None:
        wake = self.scheduler.wake_at_s()
        if wake == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = wake
        if wake is not None and not self._closed:
            delay = max(0.0, wake - self._now())
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, None
        self._apply(self.scheduler.poll(self._now()))
        self._pump()

    def _gauges(self) -> None:
        self.metrics.queue_length.labels(self.gpu).set(self.scheduler.queue_len)
        self.metrics.inflight.labels(self.gpu).set(len(self.scheduler.inflight))

    def state(self) -> dict[str, object]:
        """A snapshot for the admin API."""
        s = self.scheduler
        return {
            "gpu": self.gpu,
            "device": self.device.identity.name,
            "policy": s.policy.name,
            "clock_target_mhz": s.clock_target_mhz,
            "clock_mhz": self.device.clock_mhz(),
            "queue_length": s.queue_len,
            "queue_by_level": s.queue.level_sizes(),
            "inflight": len(s.inflight),
            "arrival_rate_rps": round(s.arrival_rate_rps(self._now()), 3),
            "max_inflight": s.config.max_inflight,
            "max_queue": s.config.max_queue,
        }
