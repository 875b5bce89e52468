"""The dispatcher's logic without Triton: a fake upstream answered by hand, a simulated GPU, a real
scheduler core and real policies, all on virtual time (see :mod:`tests.api.fakes`).

What is pinned down: a queued request's timeout answers it at its time and it is never sent; a
client that leaves gives up its place in the queue, while a request already at Triton completes;
stopping answers the queue at once and waits a bounded time for what is in flight; the clock
applier writes only the latest target and shadow mode writes nothing; every error from the
upstream is answered, never dropped.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, replace
from typing import Any

import pytest

from api.dispatcher import MAX_TIMER_US, ClockApplier, RejectedError
from api.upstream import Upstream
from api.upstream_errors import UpstreamUnavailableError
from dvfs.profiles import get_profile
from dvfs.timesource import VirtualTime
from scheduler.changedelay import ChangeDelayParams, ChangeDelays
from scheduler.params import SlackParams
from scheduler.policies import ClockPolicy, FixedPolicy, MaxPolicy, SeedPolicy, SlackPolicy
from scheduler.registry import POLICIES, make_policy
from scheduler.request import Request
from tests.api.fakes import (
    MODEL,
    Gateway,
    RecordingDevice,
    gateway,
    idle,
    make_scheduler,
    outcome,
    run_virtual,
)

SHUTTING_DOWN = "UnavailableError: the sidecar is shutting down"
EXPIRED = "UnavailableError: Request timeout expired"


def answered_at(task: asyncio.Task[Any], clock: VirtualTime) -> list[float]:
    """Filled with the virtual time ``task`` ends at, when it does."""
    at: list[float] = []
    task.add_done_callback(lambda _: at.append(clock()))
    return at


# -- timeouts ----------------------------------------------------------------------------------


def test_a_timeout_answers_a_queued_request_at_its_time_and_it_is_never_sent() -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy, max_inflight=1) as gw:
            first = gw.submit(tag="first")
            late = gw.submit(tag="late", timeout_us=5_000)
            ended = answered_at(late, clock)
            await idle()
            assert [c.body for c in gw.upstream.calls] == [b"first"]
            assert gw.scheduler.queue_len == 1
            await asyncio.sleep(0.004)
            assert not late.done()
            await asyncio.sleep(0.002)
            assert outcome(late) == EXPIRED and ended == [pytest.approx(0.005)]
            assert gw.scheduler.queue_len == 0  # its place is free at once, not at the head
            assert gw.gauge("sidecar_queue_length", gpu="0") == 0
            gw.upstream.calls[0].reply()
            await idle()
            assert outcome(first) == "ok 200"
            assert [c.body for c in gw.upstream.calls] == [b"first"]
            assert gw.dispatcher.idle

    run_virtual(main)


def test_a_timeout_covers_the_wait_in_the_queue_not_the_time_at_triton() -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy) as gw:
            sent = gw.submit(timeout_us=1_000)
            await asyncio.sleep(0.050)  # fifty times its timeout, at Triton all along
            assert not sent.done()
            gw.upstream.calls[0].reply()
            await idle()
            assert outcome(sent) == "ok 200"

    run_virtual(main)


def test_a_timeout_too_long_for_a_timer_is_checked_when_the_request_reaches_the_head() -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy, max_inflight=1) as gw:
            first = gw.submit(tag="first")
            patient = gw.submit(tag="patient", timeout_us=MAX_TIMER_US)
            await asyncio.sleep(2 * MAX_TIMER_US / 1e6)  # Triton holds the first for two days
            assert not patient.done()
            gw.upstream.calls[0].reply()
            await idle()
            assert outcome(first) == "ok 200" and outcome(patient) == EXPIRED
            assert [c.body for c in gw.upstream.calls] == [b"first"]
            assert gw.dispatcher.idle

    run_virtual(main, horizon_s=3 * MAX_TIMER_US / 1e6)


# -- cancellation ------------------------------------------------------------------------------


def test_a_client_that_leaves_while_queued_gives_up_its_place_and_is_never_sent() -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy, max_inflight=1) as gw:
            first = gw.submit(tag="first")
            gone = gw.submit(tag="gone")
            third = gw.submit(tag="third")
            await idle()
            assert gw.scheduler.queue_len == 2
            gone.cancel()
            await idle()
            assert gone.cancelled() and gw.scheduler.queue_len == 1
            assert gw.gauge("sidecar_queue_length", gpu="0") == 1
            gw.upstream.calls[0].reply()
            await idle()
            assert [c.body for c in gw.upstream.calls] == [b"first", b"third"]
            gw.upstream.calls[1].reply()
            await idle()
            assert outcome(first) == outcome(third) == "ok 200"
            assert gw.dispatcher.idle

    run_virtual(main)


def test_a_client_that_leaves_as_its_turn_comes_is_not_sent() -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy, max_inflight=1) as gw:
            first = gw.submit(tag="first")
            gone = gw.submit(tag="gone")
            third = gw.submit(tag="third")
            await idle()
            gw.upstream.calls[0].reply()  # its slot frees up in the same step the client
            gone.cancel()  # leaves: the dispatcher meets it at the head, already cancelled
            await idle()
            assert gone.cancelled() and outcome(first) == "ok 200"
            assert [c.body for c in gw.upstream.calls] == [b"first", b"third"]
            gw.upstream.calls[1].reply()
            await idle()
            assert outcome(third) == "ok 200" and gw.dispatcher.idle

    run_virtual(main)


def test_a_client_that_leaves_while_its_request_is_at_triton_lets_it_complete() -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy, max_inflight=1) as gw:
            gone = gw.submit(tag="gone")
            waiting = gw.submit(tag="waiting")
            await idle()
            gone.cancel()
            await asyncio.sleep(0.010)
            call = gw.upstream.calls[0]
            assert call.open, "a request at Triton is not recalled"
            assert len(gw.scheduler.inflight) == 1  # its slot stays taken until Triton answers
            assert [c.body for c in gw.upstream.calls] == [b"gone"]
            call.reply()
            await idle()
            assert gone.cancelled()
            assert [c.body for c in gw.upstream.calls] == [b"gone", b"waiting"]
            gw.upstream.calls[1].reply()
            await idle()
            assert outcome(waiting) == "ok 200" and gw.dispatcher.idle

    run_virtual(main)


def test_a_stream_whose_client_leaves_is_cut_short_and_frees_its_place_at_once() -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy, max_inflight=1) as gw:
            gone = gw.submit(tag="stream", stream=True)
            waiting = gw.submit(tag="waiting")
            await idle()
            stream_call = gw.upstream.calls[0]
            await asyncio.sleep(0.010)  # tokens flowing
            gone.cancel()
            await idle()
            assert gone.cancelled()
            assert not stream_call.open, "the upstream is still generating for nobody"
            assert [c.body for c in gw.upstream.calls] == [b"stream", b"waiting"]
            gw.upstream.calls[1].reply()
            await idle()
            assert outcome(waiting) == "ok 200" and gw.dispatcher.idle

    run_virtual(main)


# -- refusals ----------------------------------------------------------------------------------


def test_a_full_queue_refuses_with_the_reason_and_sends_nothing() -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy, max_inflight=1, max_queue=2) as gw:
            accepted = [gw.submit(tag=str(i)) for i in range(3)]
            refused = gw.submit(tag="refused")
            await idle()
            assert outcome(refused).startswith("RejectedError: queue full (2 requests waiting)")
            assert isinstance(refused.exception(), RejectedError)
            for i in range(3):
                gw.upstream.calls[i].reply()
                await idle()
            assert [outcome(t) for t in accepted] == ["ok 200"] * 3
            assert b"refused" not in [c.body for c in gw.upstream.calls]

    run_virtual(main)


# -- drain and stop ----------------------------------------------------------------------------


def test_stop_answers_the_queue_at_once_and_lets_in_flight_work_finish() -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy, max_inflight=1) as gw:
            at_triton = gw.submit(tag="at-triton")
            queued = [gw.submit(tag=f"queued-{i}") for i in range(2)]
            await idle()
            stopping = asyncio.create_task(gw.dispatcher.stop(inflight_timeout_s=30.0))
            await idle()
            assert [outcome(t) for t in queued] == [SHUTTING_DOWN] * 2
            assert not at_triton.done() and not stopping.done()
            late = gw.submit(tag="late")
            await idle()
            assert outcome(late) == SHUTTING_DOWN
            await asyncio.sleep(1.0)
            gw.upstream.calls[0].reply()
            await idle()
            assert outcome(at_triton) == "ok 200"
            assert stopping.done() and clock() == pytest.approx(1.0)
            assert [c.body for c in gw.upstream.calls] == [b"at-triton"]

    run_virtual(main)


def test_stop_waits_a_bounded_time_for_a_hung_triton_and_answers_its_requests() -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy, max_inflight=2) as gw:
            hung = [gw.submit(tag=f"hung-{i}") for i in range(2)]
            await idle()
            assert len(gw.upstream.open_calls) == 2
            await gw.dispatcher.stop(inflight_timeout_s=2.0)
            assert clock() == pytest.approx(2.0)
            assert [outcome(t) for t in hung] == [SHUTTING_DOWN] * 2
            assert gw.upstream.open_calls == []  # the calls were abandoned, not left pending

    run_virtual(main)


def test_stop_ends_the_clock_applier_and_a_clock_asked_for_later_is_not_written() -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy) as gw:
            await idle()
            top = gw.device.supported_clocks_mhz()[-1]
            assert gw.device.writes == [top]
            await gw.dispatcher.stop()
            low = gw.device.supported_clocks_mhz()[0]
            gw.dispatcher.set_policy(FixedPolicy(gw.device.supported_clocks_mhz(), low))
            await idle()
            assert gw.device.writes == [top]

    run_virtual(main)


def test_the_admin_state_lists_every_target_asked_for_and_the_clocks_applied() -> None:
    """Targets asked for at once reach the device as the latest alone; the admin state still
    shows each target, so a rise that never reached the GPU is seen."""

    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy) as gw:
            await idle()
            c = gw.device.supported_clocks_mhz()
            for target in (c[0], c[10], c[10], c[20], c[5]):
                gw.dispatcher.set_policy(FixedPolicy(c, target))
            await idle()
            assert gw.device.writes == [c[-1], c[5]]
            state = gw.dispatcher.state()
            asked = [t["clock_mhz"] for t in state["recent_clock_targets"]]  # type: ignore[attr-defined]
            applied = [t["clock_mhz"] for t in state["recent_clock_sets"]]  # type: ignore[attr-defined]
            assert asked == [c[5], c[20], c[10], c[0], c[-1]] and applied == [c[5], c[-1]]

    run_virtual(main)


# -- errors from the upstream ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (UpstreamUnavailableError("Triton at x is unavailable: refused"),
         "UnavailableError: Triton at x is unavailable: refused"),
        (RuntimeError("a bug"), "UnavailableError: request to Triton failed: a bug"),
        (500, "ok 500"),
        (400, "ok 400"),
    ],
)  # fmt: skip
def test_every_answer_from_triton_reaches_its_client_and_the_next_request_goes_on(
    answer: BaseException | int, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy, max_inflight=1) as gw:
            failing = gw.submit(tag="failing")
            after = gw.submit(tag="after")
            await idle()
            if isinstance(answer, int):
                gw.upstream.calls[0].reply(status=answer, body=b'{"error": "bad input"}')
            else:
                gw.upstream.calls[0].fail(answer)
            await idle()
            assert outcome(failing) == expected
            assert [c.body for c in gw.upstream.calls] == [b"failing", b"after"]
            gw.upstream.calls[1].reply()
            await idle()
            assert outcome(after) == "ok 200" and gw.dispatcher.idle

    with caplog.at_level(logging.ERROR, logger="api.dispatcher"):
        run_virtual(main)
    unexpected = isinstance(answer, RuntimeError)
    assert ("request to Triton failed" in caplog.text) == unexpected  # a bug is logged


@dataclass
class GrpcLikeAnswer:
    ok: bool
    status: str


def test_a_request_is_written_to_triton_in_the_dispatch_pass_itself() -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy) as gw:
            client = gw.submit(tag="now")
            await asyncio.sleep(0)  # one turn of the loop: the client's own step, no other
            # Sent before the task that awaits Triton's answer has run at all.
            assert [c.body for c in gw.upstream.calls] == [b"now"]
            gw.upstream.calls[0].reply()
            await idle()
            assert outcome(client) == "ok 200" and gw.dispatcher.idle

    run_virtual(main)


def test_a_protocol_s_own_send_is_answered_whatever_it_returns_or_raises() -> None:
    async def main(clock: VirtualTime) -> None:
        async def refused(_: Upstream) -> GrpcLikeAnswer:
            return GrpcLikeAnswer(ok=False, status="INVALID_ARGUMENT")

        async def broken(_: Upstream) -> GrpcLikeAnswer:
            raise ConnectionResetError("stream reset")

        async def nothing(_: Upstream) -> Any:
            return None

        def unsendable(_: Upstream) -> Any:  # fails while it starts, before anything awaits
            raise ValueError("header cannot be sent")

        async with gateway(clock, MaxPolicy, max_inflight=4) as gw:
            answers = [gw.submit(send=f) for f in (refused, broken, nothing, unsendable)]
            await idle()
            assert [outcome(t) for t in answers] == [
                "ok INVALID_ARGUMENT",
                "UnavailableError: request to Triton failed: stream reset",
                "UnavailableError: no response from Triton",
                "UnavailableError: request to Triton failed: header cannot be sent",
            ]
            assert gw.upstream.calls == [] and gw.dispatcher.idle

    run_virtual(main)


# -- the clock ---------------------------------------------------------------------------------


def applier_run(
    shadow: bool, script: Any
) -> tuple[list[int | None], list[int | None], RecordingDevice]:
    """Run ``script(applier, device)`` against a started :class:`ClockApplier`; the device's
    writes and the targets reported applied."""
    reported: list[int | None] = []
    box: list[RecordingDevice] = []

    async def main(clock: VirtualTime) -> None:
        device = RecordingDevice(clock)
        box.append(device)
        applier = ClockApplier(device, reported.append, shadow=shadow)
        applier.start()
        try:
            await script(applier, device)
        finally:
            await applier.stop()

    run_virtual(main)
    return box[0].writes, reported, box[0]


def test_the_clock_applier_writes_only_the_latest_of_the_targets_asked_for_at_once() -> None:
    async def script(applier: ClockApplier, device: RecordingDevice) -> None:
        low, mid, high = device.supported_clocks_mhz()[0:30:10]
        for c in (low, mid, high, mid):
            applier.request(c)
        await idle()

    writes, reported, device = applier_run(False, script)
    mid = device.supported_clocks_mhz()[10]
    assert writes == [mid] and reported == [mid]


def test_targets_asked_for_during_a_slow_write_collapse_into_the_latest() -> None:
    async def script(applier: ClockApplier, device: RecordingDevice) -> None:
        c = device.supported_clocks_mhz()

        def meanwhile(_: int | None) -> None:
            for x in (c[1], c[2], c[3]):
                applier.request(x)

        device.during_write = meanwhile
        applier.request(c[0])
        await idle()

    writes, reported, device = applier_run(False, script)
    c = device.supported_clocks_mhz()
    assert writes == [c[0], c[3]] and reported == [c[0], c[3]]


def test_a_target_already_applied_is_not_written_again_and_none_gives_the_clock_back() -> None:
    async def script(applier: ClockApplier, device: RecordingDevice) -> None:
        top = device.supported_clocks_mhz()[-1]
        for target in (top, top, None, None, top):
            applier.request(target)
            await idle()

    writes, reported, device = applier_run(False, script)
    top = device.supported_clocks_mhz()[-1]
    assert writes == [top, None, top] and reported == [top, None, top]


def test_a_failed_write_is_logged_not_reported_and_the_next_target_is_applied(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def script(applier: ClockApplier, device: RecordingDevice) -> None:
        applier.request(1)  # not on the ladder: the device refuses
        await idle()
        assert device.clock_mhz() == device.supported_clocks_mhz()[0]
        applier.request(device.supported_clocks_mhz()[-1])
        await idle()

    with caplog.at_level(logging.ERROR, logger="api.dispatcher"):
        writes, reported, device = applier_run(False, script)
    top = device.supported_clocks_mhz()[-1]
    assert writes == [top] and reported == [top]
    assert "could not set the clock to 1 MHz" in caplog.text


def test_shadow_mode_reports_every_new_target_and_never_writes_the_device() -> None:
    async def script(applier: ClockApplier, device: RecordingDevice) -> None:
        c = device.supported_clocks_mhz()
        for target in (c[-1], c[-1], c[0], None):
            applier.request(target)
            await idle()
        assert device.clock_mhz() == c[0]  # where the simulated GPU idles, untouched
        assert device.stats().clock_changes == 0

    writes, reported, device = applier_run(True, script)
    c = device.supported_clocks_mhz()
    assert writes == [] and reported == [c[-1], c[0], None]


def seed_proposals(clocks_mhz: list[int], requests: int, slo_ms: float) -> list[int]:
    """The clocks the core proposes when ``requests`` arrive at once (no dispatcher)."""
    core = make_scheduler(SeedPolicy(clocks_mhz), max_inflight=1)
    proposals = []
    for _ in range(requests):
        result = core.enqueue(Request(MODEL, 0.0, slo_ms), 0.0)
        if result.clock_mhz is not None:
            proposals.append(result.clock_mhz)
    return proposals


def test_a_burst_of_clock_changes_reaches_the_gpu_as_its_last_target() -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, SeedPolicy, max_inflight=1) as gw:
            clocks = gw.device.supported_clocks_mhz()
            proposed = seed_proposals(clocks, 12, slo_ms=60.0)
            assert len(set(proposed)) >= 3, "the burst should move the clock several times"
            burst = [gw.submit(slo_ms=60.0) for _ in range(12)]
            await idle()
            target = gw.scheduler.clock_target_mhz
            assert target is not None and gw.device.writes[-1] == target
            assert len(gw.device.writes) < len(proposed)  # coalesced, not one write each
            assert gw.gauge("sidecar_gpu_clock_set_hertz", gpu="0") == target * 1e6
            for _ in burst:
                gw.upstream.open_calls[0].reply()
                await idle()
            assert all(outcome(t) == "ok 200" for t in burst)

    run_virtual(main)


def test_a_shadow_dispatcher_decides_as_always_and_writes_nothing() -> None:
    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, MaxPolicy, shadow=True) as gw:
            served = gw.submit()
            await idle()
            gw.upstream.calls[0].reply()
            await idle()
            top = gw.device.supported_clocks_mhz()[-1]
            assert outcome(served) == "ok 200"
            assert gw.device.writes == []
            assert gw.gauge("sidecar_gpu_clock_shadow_hertz", gpu="0") == top * 1e6
            assert gw.gauge("sidecar_gpu_clock_set_hertz", gpu="0") is None
            assert gw.gauge("sidecar_shadow_mode", gpu="0") == 1.0
            assert gw.dispatcher.shadow is not None
            assert gw.dispatcher.shadow.completed == 1

    run_virtual(main)


# -- everything at once ------------------------------------------------------------------------


@dataclass
class Client:
    tag: str
    task: asyncio.Task[Any]
    arrival_s: float
    timeout_s: float | None
    calls_before_leaving: int | None = None  # how many calls Triton had got when it left


def leave(clients: list[Client], rng: random.Random, gw: Gateway) -> None:
    """One client still waiting, at random, goes away."""
    waiting = [c for c in clients if not c.task.done()]
    if waiting:
        gone = rng.choice(waiting)
        gone.task.cancel()
        gone.calls_before_leaving = len(gw.upstream.calls)


async def random_traffic(gw: Gateway, rng: random.Random, steps: int) -> list[Client]:
    """Arrivals (one in five a stream), clients leaving, Triton answering (200, 500 or an
    error) and time passing, in a seeded random order; then everything still open answered."""
    clients: list[Client] = []
    for step in range(steps):
        action = rng.random()
        if action < 0.4:
            timeout_s = rng.choice([None, None, 0.002, 0.02, 0.5])
            client = Client(
                f"r{step}",
                gw.submit(
                    tag=f"r{step}",
                    timeout_us=None if timeout_s is None else round(timeout_s * 1e6),
                    slo_ms=rng.choice([20.0, 60.0, 200.0]),
                    priority=rng.choice([0, 1, 2]),
                    nice=rng.randint(-5, 5),
                    client_id=rng.choice("abc"),
                    stream=rng.random() < 0.2,
                ),
                gw.clock(),
                timeout_s,
            )
            clients.append(client)
        elif action < 0.5:
            leave(clients, rng, gw)
        elif action < 0.8:
            open_calls = gw.upstream.open_calls
            if open_calls:
                call = rng.choice(open_calls)
                kind = rng.random()
                if kind < 0.8:
                    call.reply()
                elif kind < 0.9:
                    call.reply(status=500)
                else:
                    call.fail(UpstreamUnavailableError("connection reset"))
                if rng.random() < 0.3:  # a client leaves in the same step a slot frees up
                    leave(clients, rng, gw)
        else:
            await asyncio.sleep(rng.choice([0.0005, 0.003, 0.03]))
        await idle()
    while gw.upstream.open_calls or not gw.dispatcher.idle:
        for call in gw.upstream.open_calls:
            call.reply()
        await asyncio.sleep(0.001)  # policies may hold a batch back for a while
    return clients


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_request_is_answered_once_and_nothing_is_sent_that_should_not_be(
    policy: str, seed: int
) -> None:
    max_inflight = 3

    def build(clocks_mhz: list[int]) -> ClockPolicy:
        return make_policy(policy, clocks_mhz)

    async def main(clock: VirtualTime) -> None:
        async with gateway(clock, build, max_inflight=max_inflight, max_queue=8) as gw:
            clients = await random_traffic(gw, random.Random(seed), steps=400)
            calls = gw.upstream.calls
            index = {call.body.decode(): i for i, call in enumerate(calls)}
            assert len(index) == len(calls), "a request was sent twice"
            assert gw.upstream.most_at_once <= max_inflight
            ends: dict[str, int] = {}
            for c in clients:
                end = outcome(c.task)
                kind = end.split(":")[0].split(" ")[0]
                ends[kind] = ends.get(kind, 0) + 1
                i = index.get(c.tag)
                if end == EXPIRED or end.startswith("RejectedError"):
                    assert i is None, f"{c.tag} ({end}) was sent"
                if i is None:
                    assert not end.startswith("ok"), f"{c.tag} was answered without being sent"
                    continue
                if c.calls_before_leaving is not None:
                    assert i < c.calls_before_leaving, f"{c.tag} was sent after its client left"
                if c.timeout_s is not None:
                    waited_s = calls[i].sent_s - c.arrival_s
                    assert waited_s <= c.timeout_s + 1e-9, f"{c.tag} was sent after its timeout"
            assert gw.dispatcher.idle
            await idle()
            target = gw.scheduler.clock_target_mhz
            last = gw.device.writes[-1] if gw.device.writes else None
            assert last == target, "the GPU is not at the clock the scheduler decided"
            # every way a request can end happened in this run
            assert {"ok", "UnavailableError", "cancelled", "RejectedError"} <= set(ends), ends

    run_virtual(main)


# -- the clock-change delay, timed ---------------------------------------------------------


def test_the_applier_times_raises_from_the_ask_to_the_reading_and_not_drops() -> None:
    """A raise is timed from when it was asked for until the clock read back shows it (the
    simulated GPU lands it 20 ms later; the reading is polled every half millisecond); neither
    the first write nor a drop is timed."""
    delays = ChangeDelays(ChangeDelayParams(every_s=0.0, min_samples=1))
    timed: list[float | None] = []

    async def main(clock: VirtualTime) -> None:
        device = RecordingDevice(clock, replace(get_profile("v100"), clock_change_delay_s=0.02))
        low, high = device.supported_clocks_mhz()[10], device.supported_clocks_mhz()[-1]
        applier = ClockApplier(
            device,
            lambda _: None,
            delays=delays,
            on_delay=lambda: timed.append(delays.measured_ms),
            time_source=clock,
            sleep=clock.advance_by,
        )
        applier.start()
        try:
            for target in (low, high, low, high):
                applier.request(target)
                await idle()
                await asyncio.sleep(0.1)
        finally:
            await applier.stop()

    run_virtual(main)
    assert delays.timed == 2 == delays.landed_count  # the two raises
    assert len(timed) == 2 and delays.measured_ms is not None
    assert 20.0 <= delays.measured_ms <= 20.5 + 1e-9


def test_the_dispatcher_has_the_policy_plan_with_the_delay_its_raises_take(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a GPU that lands a change in 20 ms, a policy configured with 5 ms plans with 20 ms
    once enough raises were timed; the admin state, the metric and the log say so. Told not to
    learn, it keeps 5 ms and nothing is timed."""

    async def serve(clock: VirtualTime, learn: bool) -> tuple[SlackPolicy, dict[str, Any]]:
        profile = replace(get_profile("v100"), clock_change_delay_s=0.02)
        params = SlackParams(change_delay_ms=5.0, learn_change_delay=learn)
        async with gateway(
            clock, lambda c: SlackPolicy(c, params), service_s=0.008, device_profile=profile
        ) as gw:
            for _ in range(12):  # each arrives to an idle GPU at its floor: a raise
                await gw.submit(slo_ms=17.0)
                await asyncio.sleep(0.3)
            assert isinstance(gw.scheduler.policy, SlackPolicy)
            state = gw.dispatcher.state()["clock_change_delay"]
            assert isinstance(state, dict)
            planned = gw.gauge("sidecar_gpu_clock_change_delay_seconds", gpu="0", figure="planned")
            if learn:
                assert planned == state["planned_ms"] / 1000.0
            else:
                assert planned is None and state["planned_ms"] is None
            policy = gw.scheduler.policy
            # A policy that plans no raise: nothing planned, nothing timed; what was measured stays.
            gw.dispatcher.set_policy(MaxPolicy(gw.device.supported_clocks_mhz()))
            swapped = gw.dispatcher.state()["clock_change_delay"]
            assert isinstance(swapped, dict) and swapped["configured_ms"] is None
            assert swapped["measured_ms"] == state["measured_ms"]
            assert (
                gw.gauge("sidecar_gpu_clock_change_delay_seconds", gpu="0", figure="planned")
                is None
            )
            assert gw.dispatcher.delays is not None and not gw.dispatcher.delays.due(clock())
            return policy, state

    async def main(clock: VirtualTime) -> None:
        policy, state = await serve(clock, True)
        assert 20.0 <= policy.params.change_delay_ms <= 20.5 + 1e-9
        assert (
            state["configured_ms"] == 5.0 and state["planned_ms"] == policy.params.change_delay_ms
        )
        assert state["landed"] == state["timed"] and 8 <= state["timed"] <= 12
        policy, state = await serve(clock, False)
        assert policy.params.change_delay_ms == 5.0
        assert state["configured_ms"] is None and state["timed"] == 0

    with caplog.at_level(logging.INFO, logger="api.dispatcher"):
        run_virtual(main)
    assert "GPU 0: clock changes land in 20." in caplog.text
    assert "raises are planned with 20." in caplog.text and "(configured: 5.0 ms)" in caplog.text
