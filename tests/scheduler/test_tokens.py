"""The token policy's core, driven with injected time and synthetic streams (deterministic)."""

from __future__ import annotations

import json
import math

import pytest

from scheduler.tokens import (
    SEQ_BUCKETS,
    EnginePrior,
    StepTimeModel,
    TokenPolicy,
    TokenPolicyParams,
    TokenSlo,
    seq_bucket,
)

CLOCKS = list(range(300, 2001, 100))  # 300..2000 MHz
TOP = CLOCKS[-1]


def prior(step_scale: float = 1.0) -> EnginePrior:
    """A prior shaped like a real engine: decode steps nearly flat in the clock (memory-bound),
    a prefill that goes as 1/f, energy per step lowest mid-ladder."""
    step_ms: dict[int, dict[int, float]] = {}
    step_j: dict[int, dict[int, float]] = {}
    for b in SEQ_BUCKETS[:-1]:
        step_ms[b] = {}
        step_j[b] = {}
        for f in CLOCKS:
            ms = step_scale * (3.0 + 0.05 * b) * (1.0 + 0.1 * (TOP / f - 1.0))
            watts = 120.0 + 200.0 * (f / TOP) ** 3
            step_ms[b][f] = ms
            step_j[b][f] = watts * ms / 1000.0
    prefill_ms = {f: 20.0 * TOP / f for f in CLOCKS}
    prefill_j = {f: (120.0 + 580.0 * (f / TOP) ** 3) * ms / 1000.0 for f, ms in prefill_ms.items()}
    return EnginePrior(tuple(CLOCKS), step_ms, step_j, prefill_ms, prefill_j, 1024, 1024)


def test_buckets() -> None:
    assert [seq_bucket(n) for n in (0, 1, 2, 3, 5, 200, 10_000)] == [1, 1, 2, 4, 8, 256, 512]


def test_step_model_moves_unmeasured_clocks_by_the_live_factor() -> None:
    model = StepTimeModel(prior(), TokenPolicyParams())
    before_low = model.predict_ms(600, 8)
    for _ in range(50):
        model.observe(1500, 8, 2.0 * model.prior_ms(1500, 8))  # live: twice the prior
    assert model.predict_ms(1500, 8) == pytest.approx(2.0 * model.prior_ms(1500, 8), rel=0.02)
    assert model.predict_ms(600, 8) == pytest.approx(2.0 * before_low, rel=0.05)
    assert model.samples == 50


def test_step_model_is_flat_where_live_gaps_do_not_depend_on_the_clock() -> None:
    model = StepTimeModel(prior(), TokenPolicyParams())
    for f in CLOCKS:
        for _ in range(30):
            model.observe(f, 16, 10.0)  # a memory-bound engine: the same step at every clock
    assert model.predict_ms(300, 16) == pytest.approx(10.0, rel=0.02)
    assert model.predict_ms(TOP, 16) == pytest.approx(10.0, rel=0.02)


class Plant:
    """Streams whose first token takes ``ttft_ms`` and whose tokens come every ``gap_ms``
    scaled by the clock the policy asked for (``gap_ms(f)``)."""

    def __init__(self, policy: TokenPolicy) -> None:
        self.policy = policy
        self.t = 0.0
        self.next_id = 0
        self.changes: list[tuple[float, int]] = []

    def run(
        self,
        seconds: float,
        *,
        rate_hz: float,
        prompt: int,
        tokens: int,
        ttft_ms: float,
        gap_ms: float,
        clock_sensitivity: float = 0.0,
    ) -> None:
        """Requests every ``1/rate_hz`` s, each streamed in one go (time advances by the
        stream's length, as a sequential plant)."""
        end = self.t + seconds
        while self.t < end:
            rid = self.next_id
            self.next_id += 1
            p = self.policy
            scale = 1.0 + clock_sensitivity * (TOP / p.clock_mhz - 1.0)
            p.on_release(rid, self.t, self.t, prompt)
            t = self.t + ttft_ms * scale / 1000.0
            for _ in range(tokens):
                p.on_token(rid, t)
                t += gap_ms * scale / 1000.0
            p.on_finish(rid, t - gap_ms * scale / 1000.0)
            self.t += 1.0 / rate_hz
            choice = p.decide(self.t)
            if choice is not None:
                self.changes.append((self.t, choice))


def make_policy(**params: float) -> TokenPolicy:
    defaults = {"min_samples": 30, "boost_hold_s": 0.0}
    defaults.update(params)
    return TokenPolicy(
        CLOCKS,
        TokenSlo(ttft_ms=500.0, tpot_ms=30.0),
        prior(),
        TokenPolicyParams(**defaults),  # type: ignore[arg-type]
    )


def test_it_stays_at_the_top_until_it_has_measured_enough() -> None:
    policy = make_policy(min_samples=1000)
    plant = Plant(policy)
    plant.run(20.0, rate_hz=10, prompt=500, tokens=20, ttft_ms=50, gap_ms=5)
    assert plant.changes == [] and policy.clock_mhz == TOP


def test_tails_far_under_the_slos_bring_the_clock_down_and_it_holds() -> None:
    policy = make_policy()
    plant = Plant(policy)
    plant.run(60.0, rate_hz=10, prompt=200, tokens=20, ttft_ms=40, gap_ms=5)
    assert policy.clock_mhz < TOP
    low = policy.clock_mhz
    # Hysteresis: on a steady plant the clock settles; changes are few and far apart.
    assert len(plant.changes) <= 4
    gaps = [b[0] - a[0] for a, b in zip(plant.changes, plant.changes[1:], strict=False)]
    assert all(g >= policy.params.dwell_s for g in gaps)
    plant.run(30.0, rate_hz=10, prompt=200, tokens=20, ttft_ms=40, gap_ms=5)
    assert policy.clock_mhz == low


def test_measured_misses_raise_the_clock_at_once() -> None:
    policy = make_policy()
    plant = Plant(policy)
    plant.run(60.0, rate_hz=10, prompt=200, tokens=20, ttft_ms=40, gap_ms=5)
    low = policy.clock_mhz
    assert low < TOP
    before = len(plant.changes)
    # The engine slows down (say a longer context): streams now miss the TPOT SLO.
    plant.run(5.0, rate_hz=10, prompt=200, tokens=20, ttft_ms=40, gap_ms=45)
    assert policy.clock_mhz > low
    assert len(plant.changes) > before
    assert policy.tpot_loop.backoffs >= 1  # the feedback cut the budget


def test_a_prompt_that_would_be_late_is_boosted_and_the_boost_ends() -> None:
    policy = make_policy(boost_hold_s=1.0)
    plant = Plant(policy)
    plant.run(60.0, rate_hz=10, prompt=200, tokens=20, ttft_ms=40, gap_ms=5)
    base = policy.base_mhz
    assert base < TOP
    t = plant.t
    # A 30,000-token prompt arrives: at the base clock it would miss its first token's budget.
    policy.on_release(10_000, t, t, 30_000)
    boosted = policy.decide(t + 0.01)
    assert boosted is not None and boosted > base and policy.boosts == 1
    policy.on_token(10_000, t + 0.2)
    policy.on_token(10_000, t + 0.21)
    policy.on_finish(10_000, t + 0.21)
    assert policy.decide(t + 0.5) is None  # held
    assert policy.decide(t + 1.2) == base  # back to the base clock


def test_the_admission_limit_caps_sequences_whose_mean_gap_would_miss() -> None:
    policy = make_policy()
    plant = Plant(policy)
    plant.run(30.0, rate_hz=10, prompt=200, tokens=20, ttft_ms=40, gap_ms=5)
    # Per the prior, 3 + 0.05·n ms a step: the most sequences (256) fit a 30 ms SLO.
    assert policy.admission_limit == policy.params.max_seqs
    slow = TokenPolicy(
        CLOCKS,
        TokenSlo(ttft_ms=500.0, tpot_ms=10.0),
        prior(),
        TokenPolicyParams(min_samples=30, boost_hold_s=0.0),
    )
    plant = Plant(slow)
    plant.run(30.0, rate_hz=10, prompt=10, tokens=20, ttft_ms=5, gap_ms=4)
    limit = slow.admission_limit
    budget = 10.0 * slow.params.headroom
    assert 1 < limit < slow.params.max_seqs
    # The largest count whose predicted step (prompts of 10 tokens barely add) fits the budget.
    assert slow.steps.predict_ms(slow.clock_mhz, limit) <= budget
    assert slow.steps.predict_ms(slow.clock_mhz, limit + 1) > budget * 0.98


def test_state_is_plain_data() -> None:
    policy = make_policy()
    plant = Plant(policy)
    plant.run(10.0, rate_hz=10, prompt=200, tokens=20, ttft_ms=40, gap_ms=5)
    state = policy.state()
    assert state["policy"] == "tokens" and state["clock_mhz"] == policy.clock_mhz
    budgets = [v for k, v in state.items() if k.endswith("_ms")]
    assert len(budgets) == 2
    assert all(isinstance(v, float) and math.isfinite(v) for v in budgets)
    json.dumps(state)  # plain data


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="tpot_ms"):
        TokenSlo(ttft_ms=100.0, tpot_ms=0.0)
    with pytest.raises(ValueError, match="headroom"):
        TokenPolicyParams(headroom=1.5)


def test_in_the_core_its_admission_limit_caps_streams_and_it_hears_every_token() -> None:
    """``TokenClockPolicy`` in a :class:`Scheduler`: streams are released up to the admission
    limit, and releases, tokens and ends reach the token policy."""
    from scheduler.core import Scheduler
    from scheduler.request import Request
    from scheduler.tokens import TokenClockPolicy
    from scheduler.view import ModelServing
    from time2clock.table import TableSet

    policy = TokenClockPolicy(CLOCKS, TokenSlo(500.0, 30.0), prior())
    policy.tokens.admission_limit = 2
    core: Scheduler[None] = Scheduler(TableSet(), policy)
    core.set_serving("llm", ModelServing(streams=256))
    for _ in range(4):
        request: Request[None] = Request("llm", arrival_s=0.0, slo_ms=1e6, prompt_tokens=8)
        assert core.enqueue(request, 0.0).accepted
    sent = [d.request for _ in range(4) if (d := core.next_dispatch(0.01)) is not None]
    assert len(sent) == 2 and core.queue_len == 2 and policy.tokens.running == 2
    for t in (0.05, 0.06, 0.07):
        core.on_token(sent[0], t)
    core.on_complete(sent[0], 0.07, 0.07, measured=False)
    assert policy.tokens.running == 1 and policy.tokens._tokens_total == 3
    assert core.next_dispatch(0.08) is not None and core.next_dispatch(0.08) is None
    state = policy.state()
    assert state is not None and state[0]["admission_limit"] == 2


def test_measured_tails_far_under_the_slos_let_the_budget_pass_the_planned_share() -> None:
    """The model errs slow: while the measured tails stay far under the SLOs the feedback takes
    the budget past SLO × headroom (up to the feedback's bound), and a measured miss cuts it."""
    policy = make_policy()
    plant = Plant(policy)
    plant.run(60.0, rate_hz=10, prompt=200, tokens=20, ttft_ms=40, gap_ms=5)
    ttft_budget, tpot_budget = policy.budgets()
    h = policy.params.headroom
    assert ttft_budget > policy.slo.ttft_ms * h and tpot_budget > policy.slo.tpot_ms * h
    cap = h * policy.params.feedback.max_scale
    assert ttft_budget <= policy.slo.ttft_ms * cap + 1e-9
    plant.run(5.0, rate_hz=10, prompt=200, tokens=20, ttft_ms=40, gap_ms=45)
    assert policy.budgets()[1] < tpot_budget


def test_measured_tails_under_the_history_scale_the_predictions_down() -> None:
    """Tails measured far under the history's prediction (a burst's ratios still in it) scale
    every candidate's prediction down, never below the floor; without calibration they stand."""
    runs = {}
    for floor in (1.0, 0.6):
        policy = make_policy(calibration_floor=floor, history_s=120.0)
        plant = Plant(policy)
        # A burst whose first tokens came late (queueing the model does not see), then calm.
        plant.run(10.0, rate_hz=10, prompt=200, tokens=20, ttft_ms=400, gap_ms=5)
        plant.run(20.0, rate_hz=10, prompt=200, tokens=20, ttft_ms=40, gap_ms=5)
        runs[floor] = (policy.predict(plant.t), policy.calibration)
    raw, calibrated = runs[1.0][0], runs[0.6][0]
    ttft_factor, _ = runs[0.6][1]
    assert runs[1.0][1] == (1.0, 1.0)
    assert 0.6 <= ttft_factor < 1.0
    for a, b in zip(raw, calibrated, strict=True):
        assert b.ttft_p99_ms <= a.ttft_p99_ms
