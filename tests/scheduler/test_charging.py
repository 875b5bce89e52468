"""What CFS charges a request: the GPU time its model takes per request in full batches, by the
table at the clock targeted, and not its time from dispatch to completion (which counts its wait
at Triton behind other models' work)."""

from __future__ import annotations

import pytest

from scheduler.core import Scheduler
from scheduler.policies import FixedPolicy
from scheduler.queue import vruntime_charge
from scheduler.view import ModelServing
from tests.scheduler.helpers import CLOCKS, make_model_table, make_request, make_scheduler

FAST, SLOW = "fast", "slow"
CLOCK = 900


def two_models(**cfg: object) -> Scheduler[None]:
    """``fast`` runs batches of up to 8 (8 take 3 times one), ``slow`` one at a time and 4
    times ``fast``'s batch 1; the clock fixed."""
    fast = make_model_table(model=FAST, batches={1: 1.0, 8: 3.0})
    slow = make_model_table(model=SLOW, slower=4.0)
    serving = {FAST: ModelServing(8, 1), SLOW: ModelServing(1, 1)}
    return make_scheduler(FixedPolicy(CLOCKS, CLOCK), fast, slow, serving=serving, **cfg)


def test_a_request_is_charged_its_share_of_a_full_batch_at_the_clock_targeted() -> None:
    s = two_models()
    fast, slow = s.table_for(FAST), s.table_for(SLOW)
    assert fast is not None and slow is not None
    assert s.charge_ms(FAST) == pytest.approx(fast.predict_ms(CLOCK, 8) / 8)
    assert s.charge_ms(FAST) == pytest.approx(fast.predict_ms(CLOCK, 1) * 3 / 8)
    assert s.charge_ms(SLOW) == pytest.approx(slow.predict_ms(CLOCK, 1))


def test_completion_charges_nothing_for_the_wait_at_triton() -> None:
    s = two_models()
    s.enqueue(make_request(model=FAST, client_id="a", nice=5), 0.0)
    s.enqueue(make_request(model=FAST, client_id="a", nice=5), 0.0)
    d = s.next_dispatch(0.0)
    assert d is not None
    charged = vruntime_charge(s.charge_ms(FAST), 5)
    assert s.queue.flow_vruntimes(2) == {"a": pytest.approx(charged)}
    s.on_complete(d.request, 0.5, 0.5)  # half a second at Triton, mostly waiting
    assert s.queue.flow_vruntimes(2) == {"a": pytest.approx(charged)}
    assert s.queue.service_ms(FAST) == pytest.approx(s.charge_ms(FAST))


def test_two_models_share_the_gpu_time_by_weight_whatever_they_wait_at_triton() -> None:
    """Two clients of equal weight, one sending only the cheap model and one only the costly
    one, both always waiting; one request at Triton at a time, and every cheap request waits
    there behind a costly execution. Charged by time at Triton, the cheap client would get a
    fifth of the GPU time; charged by GPU time, it gets half."""
    s = two_models(max_inflight=1)
    gpu_ms = {FAST: s.charge_ms(FAST), SLOW: s.charge_ms(SLOW)}
    served = {"cheap": 0.0, "costly": 0.0}
    now = 0.0
    for _ in range(100):
        s.enqueue(make_request(model=FAST, client_id="cheap", arrival_s=now), now)
        s.enqueue(make_request(model=SLOW, client_id="costly", arrival_s=now), now)
    for _ in range(99):
        d = s.next_dispatch(now)
        assert d is not None
        request = d.request
        at_triton_ms = gpu_ms[request.model] + (gpu_ms[SLOW] if request.model == FAST else 0.0)
        now += gpu_ms[request.model] / 1000.0
        s.on_complete(request, at_triton_ms / 1000.0, now)
        served[request.client_id] += gpu_ms[request.model]
    share = served["cheap"] / (served["cheap"] + served["costly"])
    # within one costly request of an even split
    assert abs(share - 0.5) <= gpu_ms[SLOW] / (served["cheap"] + served["costly"])


def test_a_model_without_a_table_is_charged_its_time_at_triton() -> None:
    s = two_models()
    s.enqueue(make_request(model="unknown", client_id="a"), 0.0)
    s.enqueue(make_request(model="unknown", client_id="a"), 0.0)
    d = s.next_dispatch(0.0)
    assert d is not None
    assert d.request.charged_ms == pytest.approx(s.config.default_slo_ms / 4)
    s.on_complete(d.request, 0.030, 0.030)
    assert s.queue.flow_vruntimes(2) == {"a": pytest.approx(30.0)}
    assert s.charge_ms("unknown") == pytest.approx(30.0)


def test_a_stream_is_charged_its_time_at_triton() -> None:
    s = two_models()
    s.set_serving(FAST, ModelServing(8, 1, streams=4))
    s.enqueue(make_request(model=FAST, client_id="a"), 0.0)
    s.enqueue(make_request(model=FAST, client_id="a"), 0.0)
    d = s.next_dispatch(0.0)
    assert d is not None
    s.on_complete(d.request, 2.0, 2.0, measured=False)  # a stream's length is no sample
    assert s.queue.flow_vruntimes(2) == {"a": pytest.approx(2000.0)}


def test_a_request_never_sent_is_refunded_and_teaches_nothing() -> None:
    s = two_models()
    s.enqueue(make_request(model=FAST, client_id="a"), 0.0)
    s.enqueue(make_request(model=FAST, client_id="a"), 0.0)
    d = s.next_dispatch(0.0)
    assert d is not None
    s.on_complete(d.request, 0.0, 0.0, measured=False)  # its client left before it went
    assert s.queue.flow_vruntimes(2) == {"a": pytest.approx(0.0)}
    assert s.queue.service_ms(FAST) is None
