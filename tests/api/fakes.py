"""Fakes for testing the gateway's logic without Triton: an event loop on virtual time, an upstream
the test answers by hand, a simulated GPU that records every clock written, and a factory for
the dispatcher on top of them (a real scheduler core and a real policy).

Nothing here sleeps in real time. The event loop's clock is a :class:`dvfs.timesource.VirtualTime`,
the same one the dispatcher reads (``time_source``), so ``call_later`` timers, ``asyncio.sleep``
and the scheduler's times all agree. Virtual time moves only when nothing else can run: the
loop then jumps to its next timer. ``await idle()`` waits until everything that can happen
without time passing has happened. Work the gateway sends to a thread (``asyncio.to_thread``,
the clock applier's device calls) runs inline, so the order of events never depends on a
thread's timing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import selectors
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar, cast

from api.dispatcher import Answer, GpuDispatcher, Job, post
from api.hints import Hints
from api.metrics import GatewayMetrics
from api.upstream import Upstream, UpstreamResponse
from dvfs.profiles import GpuProfile
from dvfs.simulated import SimulatedDevice
from dvfs.timesource import VirtualTime
from scheduler.core import Scheduler, SchedulerConfig
from scheduler.policies import ClockPolicy
from scheduler.request import Request
from scheduler.view import ModelServing
from tests.scheduler.helpers import make_model_table
from time2clock.table import TableSet

T = TypeVar("T")
Params = ParamSpec("Params")
MODEL = "model"
HORIZON_S = 3600.0  # virtual time a test may use (by default) before it counts as stalled


class StalledError(RuntimeError):
    """The test waits for something that can never happen (no callback ready, no timer due
    before the horizon, nothing in flight)."""


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs what is submitted at once, in the caller's thread: ``asyncio.to_thread`` becomes
    deterministic (its result is delivered on the loop's next step). A thread pool only in
    name: asyncio accepts no other kind as the default executor; it never starts a thread."""

    def submit(
        self, fn: Callable[Params, T], /, *args: Params.args, **kwargs: Params.kwargs
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:  # delivered to whoever awaits it
            future.set_exception(err)
        return future


class _VirtualSelector(selectors.DefaultSelector):
    """The loop's selector: never blocks. When the loop would wait (nothing ready), it first
    wakes whoever awaits :func:`idle`, else moves the clock to the next timer."""

    def __init__(self, clock: VirtualTime, horizon_s: float) -> None:
        super().__init__()
        self.clock = clock
        self.horizon_s = horizon_s
        self.idle_waiters: list[asyncio.Future[None]] = []

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if ready or timeout == 0:
            return ready
        if self.idle_waiters:
            waiters, self.idle_waiters = self.idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            return []
        if timeout is None:
            raise StalledError("nothing is ready and no timer is set: the test waits forever")
        if self.clock() + timeout > self.horizon_s:
            raise StalledError(f"nothing but timers until {self.horizon_s:.0f} s of virtual time")
        self.clock.advance_by(timeout)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose time is ``clock`` (see the module's docstring)."""

    def __init__(self, clock: VirtualTime, horizon_s: float = HORIZON_S) -> None:
        self._virtual = _VirtualSelector(clock, horizon_s)
        super().__init__(self._virtual)
        self.clock = clock
        self.set_default_executor(InlineExecutor())

    def time(self) -> float:
        return self.clock()

    def idle(self) -> asyncio.Future[None]:
        """Resolved once nothing is left to run at the current virtual time."""
        waiter = self.create_future()
        self._virtual.idle_waiters.append(waiter)
        return waiter


def run_virtual(
    main: Callable[[VirtualTime], Coroutine[Any, Any, T]], *, horizon_s: float = HORIZON_S
) -> T:
    """Run ``main(clock)`` to completion on a :class:`VirtualLoop` starting at 0 s (stalled past
    ``horizon_s``); whatever it leaves running is cancelled, and the loop closed, on every exit
    path."""
    clock = VirtualTime()
    loop = VirtualLoop(clock, horizon_s)
    try:
        return loop.run_until_complete(main(clock))
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


async def idle() -> None:
    """Let everything run that can run without virtual time passing."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualLoop), "run the test with run_virtual()"
    await loop.idle()


# -- the upstream ------------------------------------------------------------------------------


@dataclass(eq=False)
class Call:
    """One request the dispatcher sent to the fake Triton; the test answers it."""

    method: str
    path: str
    body: bytes
    sent_s: float
    answer: asyncio.Future[UpstreamResponse]

    def reply(self, status: int = 200, body: bytes = b"{}") -> None:
        self.answer.set_result(UpstreamResponse(status, body, {"content-type": "application/json"}))

    def fail(self, error: BaseException) -> None:
        self.answer.set_exception(error)

    @property
    def open(self) -> bool:
        return not self.answer.done()


class FakeUpstream(Upstream):
    """Triton as the test plays it: every request waits until the test answers its :class:`Call`
    (or, with ``service_s``, is answered 200 after that much virtual time)."""

    def __init__(self, *, service_s: float | None = None) -> None:
        super().__init__("fake-triton:8000")
        self.service_s = service_s
        self.calls: list[Call] = []
        self.most_at_once = 0

    @property
    def open_calls(self) -> list[Call]:
        return [c for c in self.calls if c.open]

    def begin(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> Awaitable[UpstreamResponse]:
        """Sent at once, as the real one does over an idle connection: the call is recorded
        before this returns."""
        loop = asyncio.get_running_loop()
        call = Call(method, path, body, loop.time(), loop.create_future())
        self.calls.append(call)
        self.most_at_once = max(self.most_at_once, len(self.open_calls))
        if self.service_s is not None:
            loop.call_later(self.service_s, _reply_if_open, call)
        return self._answer(call)

    @staticmethod
    async def _answer(call: Call) -> UpstreamResponse:
        try:
            return await call.answer
        finally:
            if not call.answer.done():  # the dispatcher gave up on it (shutting down)
                call.answer.cancel()


def _reply_if_open(call: Call) -> None:
    if call.open:
        call.reply()


# -- the device --------------------------------------------------------------------------------


class RecordingDevice(SimulatedDevice):
    """A simulated GPU that records every clock written to it (None: a reset) and can run a
    hook in the middle of a write, as if other work happened while NVML took its time."""

    def __init__(self, clock: VirtualTime, profile: GpuProfile | str = "v100") -> None:
        super().__init__(profile, time_source=clock)
        self.writes: list[int | None] = []
        self.during_write: Callable[[int | None], None] | None = None

    def set_clock_mhz(self, clock_mhz: int) -> None:
        self._hook(clock_mhz)
        super().set_clock_mhz(clock_mhz)
        self.writes.append(clock_mhz)

    def reset(self) -> None:
        self._hook(None)
        super().reset()
        self.writes.append(None)

    def _hook(self, clock_mhz: int | None) -> None:
        hook, self.during_write = self.during_write, None
        if hook is not None:
            hook(clock_mhz)


# -- the dispatcher ----------------------------------------------------------------------------


@dataclass
class Gateway:
    """A started :class:`GpuDispatcher` and the parts around it."""

    dispatcher: GpuDispatcher
    scheduler: Scheduler[Job]
    device: RecordingDevice
    upstream: FakeUpstream
    metrics: GatewayMetrics
    clock: VirtualTime
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    def request(
        self,
        *,
        timeout_us: int | None = None,
        slo_ms: float = 100.0,
        priority: int = 0,
        nice: int = 0,
        client_id: str = "default",
        model: str = MODEL,
        tag: str = "",
        send: Callable[[Upstream], Awaitable[Answer]] | None = None,
        stream: bool = False,
    ) -> Request[Job]:
        """A request arriving now, as a front end builds it: POSTed to the upstream with
        ``tag`` as its body (to tell the calls apart), unless it brings its own ``send``."""
        path = f"/v2/models/{model}/infer"
        job = Job(send=send or post(path, tag.encode(), {}), timeout_us=timeout_us, stream=stream)
        hints = Hints(priority=priority, nice=nice, slo_ms=slo_ms, client_id=client_id)
        return hints.request(model, self.clock(), slo_ms, job)

    def submit(self, request: Request[Job] | None = None, **hints: Any) -> asyncio.Task[Any]:
        """A client waiting for its answer (a task: cancel it and the client is gone)."""
        task = asyncio.create_task(self.dispatcher.submit(request or self.request(**hints)))
        self.tasks.append(task)
        return task

    def gauge(self, name: str, **labels: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)


def make_scheduler(
    policy: ClockPolicy, *, max_inflight: int = 1, max_queue: int = 1000, **cfg: Any
) -> Scheduler[Job]:
    """A real scheduler core over one hand-made table of :data:`MODEL` (batch 1, one instance)."""
    return Scheduler(
        TableSet([make_model_table(model=MODEL)]),
        policy,
        SchedulerConfig(max_inflight=max_inflight, max_queue=max_queue, **cfg),
        {MODEL: ModelServing(1, 1)},
    )


@asynccontextmanager
async def gateway(
    clock: VirtualTime,
    policy: Callable[[list[int]], ClockPolicy],
    *,
    shadow: bool = False,
    service_s: float | None = None,
    stop_timeout_s: float = 30.0,
    device_profile: GpuProfile | str = "v100",
    **cfg: Any,
) -> AsyncIterator[Gateway]:
    """``async with gateway(clock, MaxPolicy) as gw:`` a started dispatcher (``policy`` built on
    the device's clock ladder), stopped when the block ends."""
    device = RecordingDevice(clock, device_profile)
    scheduler = make_scheduler(policy(device.supported_clocks_mhz()), **cfg)
    upstream = FakeUpstream(service_s=service_s)
    metrics = GatewayMetrics()
    dispatcher = GpuDispatcher(
        gpu="0",
        scheduler=scheduler,
        device=device,
        upstream=upstream,
        metrics=metrics,
        shadow=shadow,
        time_source=clock,
        sleep=clock.advance_by,  # reading a clock change back polls in virtual time
    )
    dispatcher.start()
    gw = Gateway(dispatcher, scheduler, device, upstream, metrics, clock)
    try:
        yield gw
    finally:
        await dispatcher.stop(stop_timeout_s)


def outcome(task: asyncio.Task[Any]) -> str:
    """How a client's wait ended: ``ok <status>``, ``cancelled`` or ``<Error>: <message>``."""
    assert task.done(), "not answered yet"
    if task.cancelled():
        return "cancelled"
    err = task.exception()
    if err is not None:
        return f"{type(err).__name__}: {err}"
    return f"ok {cast(Any, task.result()).status}"
