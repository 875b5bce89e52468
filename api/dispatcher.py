"""One dispatch loop per GPU: drives the scheduler core in the event loop and talks to Triton.

The core is synchronous and only ever called from the event loop's thread, so it needs no lock.
Clock changes are applied off the request path by :class:`ClockApplier` (an NVML call takes
milliseconds), coalesced to the latest target; in shadow mode they are recorded by a
:class:`api.shadow.ShadowLedger` and never written. Every accepted request gets an answer: Triton's
reply, or an error (Triton unreachable, timeout expired in the queue, shutting down).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from api.metrics import GatewayMetrics
from api.shadow import ShadowLedger
from api.tasks import cancel_and_wait
from api.upstream import Upstream
from api.upstream_errors import UpstreamUnavailableError
from dvfs.clockdelay import time_landing
from dvfs.device import Device
from dvfs.errors import DeviceError
from scheduler.changedelay import ChangeDelays
from scheduler.core import Scheduler
from scheduler.policies import ClockPolicy
from scheduler.request import Request
from scheduler.view import ModelServing
from time2clock.online import TableRefit
from time2clock.table import ModelTable, TableSet

log = logging.getLogger(__name__)
MAX_TIMER_US = 86_400 * 10**6  # a queued timeout longer than a day is not worth a timer


class RejectedError(Exception):
    """The scheduler refused the request (queue full, fair share reached); carries the reason."""


class UnavailableError(Exception):
    """An accepted request could not be served: Triton down, timeout expired, shutting down."""


class TokenSource(Protocol):
    """What times a stream's tokens (:class:`api.streaming.TokenMeter`): it calls each
    listener with the time of every token."""

    def listen(self, listener: Callable[[float], None]) -> None: ...


class Answer(Protocol):
    """An upstream's answer to one request: ``ok`` when the upstream served it."""

    @property
    def ok(self) -> bool: ...


Send = Callable[[Upstream], Awaitable[Answer]]


@dataclass(slots=True)
class Job:
    """One request as the dispatcher sends it: ``send`` carries it to the upstream (each
    protocol brings its own), started as far as it goes without waiting (an HTTP request is
    written at once over an idle connection), and returns the answer to await. A cancelled
    ``future`` (the client went away) is never sent. ``at_level(p)``, where the protocol can,
    is the same request with Triton's ``priority`` set to ``p`` (sent instead when the model
    has priority levels)."""

    send: Send
    timeout_us: int | None = None
    # Made by the dispatcher that takes the job (unset before: no repr, no comparison).
    future: asyncio.Future[Any] = field(init=False, repr=False, compare=False)
    # A stream (tokens of a generative model): when its client leaves after it was sent, the
    # send is cut short and its place at the upstream freed at once; ``tokens`` tells the
    # policy of each token as it goes by.
    stream: bool = False
    tokens: TokenSource | None = None
    at_level: Callable[[int], Send] | None = None


async def _raise(error: Exception) -> Answer:
    raise error


def post(path: str, body: bytes, headers: dict[str, str]) -> Send:
    """A ``send`` that POSTs ``body`` to ``path`` on the upstream's HTTP endpoint."""

    def send(upstream: Upstream) -> Awaitable[Answer]:
        return upstream.begin("POST", path, body, headers)

    return send


#: Clock changes the admin state lists per GPU (the newest first).
RECENT_CLOCK_SETS = 32


def _newest_first(
    changes: deque[tuple[float, int | None]], now_s: float
) -> list[dict[str, object]]:
    """Clock changes ``(at_s, clock_mhz)`` for the admin state: newest first, with their ages."""
    return [{"age_s": round(now_s - at, 3), "clock_mhz": clock} for at, clock in reversed(changes)]


class ClockApplier:
    """Sets the GPU's clock in a worker thread, always to the latest target asked for.

    With ``shadow`` it only reports each new target to ``on_change``: no device call at all.
    With ``delays`` it times a raise now and then (:mod:`scheduler.changedelay`): from when it
    was asked for until the clock read back shows it, polled on another worker thread so that
    the next change never waits; ``on_delay`` is told of each raise timed.
    """

    def __init__(
        self,
        device: Device,
        on_change: Callable[[int | None], None],
        *,
        shadow: bool = False,
        delays: ChangeDelays | None = None,
        on_delay: Callable[[], None] | None = None,
        time_source: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.device = device
        self.shadow = shadow
        self.delays = delays
        self._on_change = on_change
        self._on_delay = on_delay
        self._now = time_source
        self._sleep = sleep
        self._target: int | None = None
        self._asked_s = 0.0  # when the target was first asked for
        self._applied: int | bool | None = False  # False: nothing applied yet
        self._locked_mhz: int | None = None  # the clock locked last (None: none, or reset)
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._timing: asyncio.Task[None] | None = None  # a raise being timed
        self._newer = threading.Event()  # set when a change after the one timed is applied

    def request(self, clock_mhz: int | None) -> None:
        """Ask for ``clock_mhz`` (None: give the clock back to the GPU)."""
        if clock_mhz != self._target:
            self._asked_s = self._now()
        self._target = clock_mhz
        self._event.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="clock-applier")

    async def stop(self) -> None:
        self._newer.set()
        await cancel_and_wait(self._task)
        await cancel_and_wait(self._timing)

    async def _run(self) -> None:
        while True:
            await self._event.wait()
            self._event.clear()
            target, asked_s = self._target, self._asked_s
            if self._applied is not False and target == self._applied:
                continue
            timed = False
            if not self.shadow:
                time_it = (
                    self.delays is not None
                    and self._timing is None
                    and self.delays.wants(asked_s, self._locked_mhz, target)
                )
                self._newer.set()  # a raise being timed no longer can be
                try:
                    if target is None:
                        await asyncio.to_thread(self.device.reset)
                    else:
                        timed = await asyncio.to_thread(self._set, target, time_it)
                except DeviceError:
                    log.exception("could not set the clock to %s MHz", target)
                    continue
            self._applied = self._locked_mhz = target
            self._on_change(target)
            if timed:
                assert target is not None and self.delays is not None
                self.delays.started(asked_s)
                self._newer = threading.Event()
                self._timing = asyncio.create_task(self._time(target, asked_s, self._newer))

    def _set(self, target_mhz: int, time_it: bool) -> bool:
        """Lock ``target_mhz``; whether to time it (asked to, and the reading was elsewhere)."""
        if time_it:
            time_it = self.device.clock_mhz() != target_mhz
        self.device.set_clock_mhz(target_mhz)
        return time_it

    async def _time(self, target_mhz: int, asked_s: float, newer: threading.Event) -> None:
        delays = self.delays
        assert delays is not None
        try:
            delay_ms = await asyncio.to_thread(
                time_landing,
                self.device,
                target_mhz,
                asked_s,
                newer.is_set,
                now=self._now,
                sleep=self._sleep,
            )
        except DeviceError:
            log.warning("could not read the clock back to time a change", exc_info=True)
            delay_ms = None
        finally:
            self._timing = None
        if delay_ms is not None:
            delays.landed(delay_ms)
        elif not newer.is_set():
            delays.missed(asked_s)
        else:
            return  # cut short by the next change: says nothing of the delay
        if self._on_delay is not None:
            self._on_delay()


class GpuDispatcher:
    """The queue, the in-flight set and the clock of one GPU, live."""

    def __init__(
        self,
        *,
        gpu: str,
        scheduler: Scheduler[Job],
        device: Device,
        upstream: Upstream,
        metrics: GatewayMetrics,
        shadow: bool = False,
        time_source: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """With ``shadow`` the clock is decided as always but never written (see
        :mod:`api.shadow`). The fits of the tables' refits (times and energy) run on a worker thread
        (milliseconds of Python each, tens with tables of many clocks: on the event loop they
        would hold up every request meanwhile). Active, it times the GPU's clock changes and
        has the policy plan with what they take (:mod:`scheduler.changedelay`), reading the
        clock back every half millisecond (``sleep``) on a worker thread."""
        self.gpu = gpu
        self.scheduler = scheduler
        self.device = device
        self.upstream = upstream
        self.metrics = metrics
        self._now = time_source
        self.delays: ChangeDelays | None = None if shadow else ChangeDelays()
        self._planned_delay_ms: float | None = None
        self._clock = ClockApplier(
            device,
            self._clock_applied,
            shadow=shadow,
            delays=self.delays,
            on_delay=self._plan_delay,
            time_source=time_source,
            sleep=sleep,
        )
        self.shadow: ShadowLedger | None = None
        if shadow:
            self.shadow = ShadowLedger(
                gpu=gpu, device=device, tables=lambda: scheduler.tables, metrics=metrics
            )
        self._served = metrics.gpu_requests.labels(gpu)
        # Each send's task, with what it awaits (closed if the task is cancelled unstarted).
        self._sends: dict[asyncio.Task[None], Awaitable[Answer]] = {}
        self._streams: dict[int, asyncio.Task[None]] = {}  # in-flight streams by request seq
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._refit: asyncio.Future[None] | None = None  # a refit's fits, running
        # The last clocks applied, with when (for the admin state: what the policy did lately,
        # including a rise too short for anyone polling the target to see).
        self._clock_sets: deque[tuple[float, int | None]] = deque(maxlen=RECENT_CLOCK_SETS)
        self._clock_targets: deque[tuple[float, int | None]] = deque(maxlen=RECENT_CLOCK_SETS)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        metrics, scheduler = self.metrics, self.scheduler
        metrics.shadow_mode.labels(self.gpu).set(0.0 if self.shadow is None else 1.0)
        # Read when scraped, not written at every event.
        metrics.queue_length.labels(self.gpu).set_function(lambda: scheduler.queue_len)
        metrics.inflight.labels(self.gpu).set_function(lambda: len(scheduler.inflight))
        if self.shadow is not None:
            self.shadow.start()
        scheduler.refit_offload = self._offload_refit
        self._clock.start()
        self._policy_changed()

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
        if self._refit is not None:
            await asyncio.wait([self._refit])
        await self._clock.stop()
        if self.shadow is not None:
            await self.shadow.stop()

    def _offload_refit(self, job: TableRefit) -> None:
        """Run ``job``'s fits on a worker thread; the core adopts them back here."""
        self._refit = future = asyncio.get_running_loop().run_in_executor(None, job.run)

        def fitted(done: asyncio.Future[None]) -> None:
            self._refit = None
            if not done.cancelled() and done.exception() is not None:
                log.error("refitting the tables failed", exc_info=done.exception())
            if not self._closed:
                self.scheduler.adopt_refit(job)
                self._pump()

        future.add_done_callback(fitted)

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing in flight."""
        return not self.scheduler.queue_len and not self.scheduler.inflight

    def _policy_changed(self) -> None:
        """The core's policy is new (or first): apply its clock, publish it, arm its timer."""
        self._plan_delay()
        self._ask(self.scheduler.clock_target_mhz)
        self.metrics.set_policy(self.gpu, self.scheduler.policy.name)
        self._arm_timer()

    # -- the scheduler's lifecycle: every change goes through here -----------------------

    @property
    def policy(self) -> ClockPolicy:
        return self.scheduler.policy

    @property
    def clock_target_mhz(self) -> int | None:
        return self.scheduler.clock_target_mhz

    def set_policy(self, policy: ClockPolicy) -> None:
        """Run ``policy`` from now on: its initial clock is applied, its timer armed."""
        self.scheduler.set_policy(policy)
        self._policy_changed()

    @property
    def tables(self) -> TableSet:
        return self.scheduler.tables

    def set_tables(self, tables: TableSet, reference: TableSet | None = None) -> None:
        """Replace every model's table (``reference``: those loaded from a file, the
        reference of their models' learning from now on); the policy re-plans from the next
        event."""
        self.scheduler.set_tables(tables, reference)
        self._pump()

    def set_serving(self, model: str, serving: ModelServing) -> None:
        """How Triton serves ``model`` (read from its config); a change re-plans, the same
        serving again changes nothing."""
        if self.scheduler.serving_known(model) == serving:
            return
        self.scheduler.set_serving(model, serving)
        self._pump()

    @property
    def priority_levels(self) -> int:
        return self.scheduler.config.priority_levels

    def level_of(self, priority: int) -> int:
        """The queue level a request's ``priority`` puts it in (0: the default level)."""
        return self.scheduler.config.level_of(priority)

    # -- requests ----------------------------------------------------------------------

    async def submit(self, request: Request[Job]) -> Any:
        """Queue ``request`` (its ``payload`` a :class:`Job`) and wait for Triton's answer."""
        job = _job(request)
        if self._closed:
            raise UnavailableError("the sidecar is shutting down")
        loop = self._running()
        job.future = loop.create_future()
        result = self.scheduler.enqueue(request, self._now())
        if not result.accepted:
            raise RejectedError(result.reason or "refused")
        self._apply(result.clock_mhz)
        self._pump()
        timer = None
        if job.timeout_us is not None and job.timeout_us < MAX_TIMER_US and not job.future.done():
            timer = loop.call_later(job.timeout_us / 1e6, self._expire, request)
        try:
            return await job.future
        except asyncio.CancelledError:  # the client went away: its place in the queue goes too
            if not self._forget(request) and (stream := self._streams.get(request.seq)):
                stream.cancel()  # already sent: the upstream stops generating for nobody
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, request: Request[Job]) -> None:
        """A queued request's ``timeout`` ran out: answered now, not when it reaches the head."""
        if self._forget(request):
            self._fail(request, UnavailableError("Request timeout expired"))

    def _forget(self, request: Request[Job]) -> bool:
        if not self.scheduler.cancel(request):
            return False
        self._arm_timer()
        return True

    def _running(self) -> asyncio.AbstractEventLoop:
        """The event loop the dispatcher runs in, looked up again only once it has stopped:
        asyncio's own lookup asks the OS for the process id at every call on Python 3.11 (a
        system call), several times per request otherwise."""
        loop = self._loop
        if loop is None or not loop.is_running():
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _pump(self) -> None:
        """Send what the core says to send, while it has room."""
        while (d := self.scheduler.next_dispatch(self._now())) is not None:
            self._apply(d.clock_mhz)
            request, job = d.request, _job(d.request)
            now = self._now()
            if job.future.cancelled():  # its client is gone: nothing to send, nobody to answer
                self._apply(self.scheduler.on_complete(request, 0.0, now, measured=False).clock_mhz)
                continue
            if job.timeout_us is not None and (now - request.arrival_s) * 1e6 > job.timeout_us:
                self._apply(self.scheduler.on_complete(request, 0.0, now, measured=False).clock_mhz)
                self._fail(request, UnavailableError("Request timeout expired"))
                continue
            # Started here (over HTTP, written to Triton) before the task that awaits the
            # answer first runs: that turn of the loop is not on the request's latency.
            answer = self._start(request, job)
            task = self._running().create_task(
                self._send(request, answer, now, self.scheduler.clock_target_mhz)
            )
            self._sends[task] = answer
            task.add_done_callback(self._sent)
            self.metrics.queue_delay_of(self.metrics.model_label(request.model)).observe(
                now - request.arrival_s
            )
            if job.tokens is not None:
                job.tokens.listen(partial(self._token, request))
            if job.stream:
                self._streams[request.seq] = task
                task.add_done_callback(partial(self._stream_done, request.seq))
        self._arm_timer()

    def _token(self, request: Request[Job], now_s: float) -> None:
        if request.seq in self.scheduler.inflight:
            self._apply(self.scheduler.on_token(request, now_s))

    def _stream_done(self, seq: int, _: asyncio.Task[None]) -> None:
        self._streams.pop(seq, None)

    def _start(self, request: Request[Job], job: Job) -> Awaitable[Answer]:
        """``job`` sent to the upstream, as far as its protocol starts it before it is awaited
        (an error raised on the way is raised where it is awaited)."""
        try:
            # priority: the sidecar's level carried to Triton's priority queue (docs/priority.md)
            level = self.scheduler.serving(request.model).triton_priority(request.level)
            send = job.send if level is None or job.at_level is None else job.at_level(level)
            return send(self.upstream)
        except Exception as err:
            return _raise(err)

    def _sent(self, task: asyncio.Task[None]) -> None:
        answer = self._sends.pop(task, None)
        if task.cancelled() and inspect.iscoroutine(answer):
            answer.close()  # cancelled before it first ran: nobody awaits what was started

    async def _send(
        self,
        request: Request[Job],
        answer: Awaitable[Answer],
        sent_s: float,
        planned_mhz: int | None,
    ) -> None:
        """Await ``request``'s answer and hand it to its client; ``planned_mhz``: the clock it
        was sent at (shadow mode's ledger)."""
        job = _job(request)
        error: Exception | None = None
        response: Any = None
        try:
            response = await answer
        except asyncio.CancelledError:
            if self._closed:  # shutting down with Triton not answering
                self._fail(request, UnavailableError("the sidecar is shutting down"))
                raise
            # A stream whose client left: its place at the upstream is free now.
            done = self.scheduler.on_complete(request, self._now() - sent_s, self._now(),
                                              measured=False)  # fmt: skip
            self._apply(done.clock_mhz)
            self._pump()
            return
        except UpstreamUnavailableError as down:
            error = UnavailableError(str(down))
        except Exception as err:  # answered below, never silently dropped
            log.exception("request to Triton failed")
            error = UnavailableError(f"request to Triton failed: {err}")
        now = self._now()
        # The reply first: the caller's wake-up is queued before the bookkeeping below, which
        # runs next in the same turn of the loop (before any other I/O is read), so it is off
        # the request's own latency and still done before anything else is served.
        if error is not None or response is None:
            self._fail(request, error or UnavailableError("no response from Triton"))
        elif not job.future.done():
            job.future.set_result(response)
        self._running().call_soon(
            self._completed, request, response, error is None, sent_s, now, planned_mhz
        )

    def _completed(
        self,
        request: Request[Job],
        response: Any,
        answered: bool,
        sent_s: float,
        now: float,
        planned_mhz: int | None,
    ) -> None:
        """What a request's answer (or its failure) changes: the scheduler, the clock, the
        metrics and the shadow ledger; then the next sends."""
        job = _job(request)
        service_s = now - sent_s
        served = answered and response is not None and bool(response.ok)
        # A stream's length is its output's, not an execution time: tables do not learn from it.
        done = self.scheduler.on_complete(
            request, service_s, now, measured=served and not job.stream
        )
        self._apply(done.clock_mhz)
        metrics = self.metrics
        model = metrics.model_label(request.model)
        scale = self.scheduler.policy.model_scale(request.model)
        if scale is not None:
            metrics.base_speed.labels(self.gpu, model).set(scale)
        client = metrics.client_label(request.client_id)
        metrics.gpu_time_of(client, str(request.level), str(request.nice)).inc(service_s)
        if answered and response is not None:
            latency_s = now - request.arrival_s
            metrics.latency_of(model, client).observe(latency_s)
            if response.ok:
                self._served.inc()
                if self.shadow is not None:
                    self.shadow.on_complete(request.model, planned_mhz)
                met = "true" if latency_s * 1000.0 <= request.slo_ms else "false"
                metrics.slo_of(model, client, met).inc()
        self._pump()

    def _fail(self, request: Request[Job], error: Exception) -> None:
        job = _job(request)
        if not job.future.done():
            job.future.set_exception(error)

    # -- clock and timers --------------------------------------------------------------

    def _apply(self, clock_mhz: int | None) -> None:
        if clock_mhz is not None:
            self._ask(clock_mhz)

    def _ask(self, clock_mhz: int | None) -> None:
        """Ask the applier for ``clock_mhz``, keeping each change of target for the admin state:
        an applier that lags behind (a slow device call) applies only the latest target, so a
        short rise may never reach the GPU, and the targets show what the policy asked for."""
        if not self._clock_targets or self._clock_targets[-1][1] != clock_mhz:
            self._clock_targets.append((self._now(), clock_mhz))
        self._clock.request(clock_mhz)

    def _clock_applied(self, clock_mhz: int | None) -> None:
        if self.shadow is not None:
            self.shadow.would_set(clock_mhz)
            return
        self._clock_sets.append((self._now(), clock_mhz))
        self.metrics.clock_changes.labels(self.gpu).inc()
        self.metrics.clock_set.labels(self.gpu).set(0.0 if clock_mhz is None else clock_mhz * 1e6)

    def _plan_delay(self) -> None:
        """Have the policy plan raises with the delay the GPU's changes were timed to take
        (a raise was timed, or the policy is new); timing stops while it plans none."""
        delays, policy = self.delays, self.scheduler.policy
        if delays is None:
            return
        planned = delays.plan_for(policy)
        measured = delays.measured_ms
        if measured is not None:
            self.metrics.clock_change_delay.labels(self.gpu, "measured").set(measured / 1000.0)
        if planned is None:
            self._planned_delay_ms = None
            with suppress(KeyError):  # a policy that plans no raise: no figure planned
                self.metrics.clock_change_delay.remove(self.gpu, "planned")
            return
        self.metrics.clock_change_delay.labels(self.gpu, "planned").set(planned / 1000.0)
        if self._planned_delay_ms is not None and abs(planned - self._planned_delay_ms) < 1.0:
            return
        configured = policy.configured_change_delay_ms()
        if measured is not None and (self._planned_delay_ms is not None or planned != configured):
            log.info(
                "GPU %s: clock changes land in %.1f ms (p%.0f of the last %d timed); raises "
                "are planned with %.1f ms (configured: %.1f ms)",
                self.gpu,
                measured,
                delays.params.quantile * 100,
                min(delays.landed_count, delays.params.window),
                planned,
                configured,
            )
        self._planned_delay_ms = planned

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
            self._timer = self._running().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, None
        self._apply(self.scheduler.poll(self._now()))
        self._pump()

    def state(self) -> dict[str, object]:
        """A snapshot for the admin API, taken in the event loop (the only thread that changes
        the scheduler); the device is not read here (an NVML call may block)."""
        s = self.scheduler
        now = self._now()
        rates = s.arrival_rates_rps(now)
        learner = s.learner
        models = sorted(
            {
                *s.tables.models,
                *rates,
                *s.inflight_by_model(),
                *s.queued_by_model(),
                *(learner.models if learner is not None else ()),
            }
        )
        return {
            "gpu": self.gpu,
            "device": self.device.identity.name,
            "policy": s.policy.name,
            "mode": "active" if self.shadow is None else "shadow",
            "clock_target_mhz": s.clock_target_mhz,
            "recent_clock_sets": _newest_first(self._clock_sets, now),
            "recent_clock_targets": _newest_first(self._clock_targets, now),
            "clock_change_delay": (
                None
                if self.delays is None
                else self.delays.state(s.policy.configured_change_delay_ms())
            ),
            "queue_length": s.queue_len,
            "queue_by_level": s.queue.level_sizes(),
            "inflight": len(s.inflight),
            "arrival_rate_rps": round(sum(rates.values()), 3),
            "max_inflight": s.config.max_inflight,
            "max_queue": s.config.max_queue,
            "learning": learner is not None,
            "models": {
                m: {
                    "queued": s.queued_by_model().get(m, 0),
                    "inflight": s.inflight_count(m),
                    "depth": s.release_depth(m),
                    "max_batch": s.serving(m).max_batch,
                    "instances": s.serving(m).instances,
                    "triton_priority_levels": s.serving(m).priority_levels,
                    "arrival_rate_rps": round(rates.get(m, 0.0), 3),
                    "table": _table_summary(s.table_for(m)),
                    "learning": None if learner is None else learner.state(m, now),
                }
                for m in models
            },
            **({} if self.shadow is None else {"shadow": self.shadow.state()}),
            **({} if (held := s.policy.state()) is None else {"feedback": held}),
        }


def _job(request: Request[Job]) -> Job:
    job = request.payload
    assert job is not None, "every gateway request carries its Job"
    return job


def _table_summary(table: ModelTable | None) -> dict[str, object] | None:
    if table is None:
        return None
    return {
        "gpu": table.gpu,
        "batches": table.batches,
        "clocks": len(table.clocks_mhz),
        "top_clock_ms": {
            b: round(table.predict_ms(table.clocks_mhz[-1], b), 3) for b in table.batches
        },
    }
