"""The token policy's core, driven with injected time and synthetic streams (deterministic)."""

from __future__ import annotations

import heapq
import json
import math

import numpy as np
import pytest

from dvfs.energy import EnergyReading
from scheduler.core import Scheduler
from scheduler.request import Request
from scheduler.tokens import (
    SEQ_BUCKETS,
    EnginePrior,
    StepTimeModel,
    TokenClockPolicy,
    TokenPolicy,
    TokenPolicyParams,
    TokenSlo,
    seq_bucket,
)
from scheduler.view import ModelServing
from time2clock.table import TableSet

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
    """An engine in virtual time, events in time order: requests every ``1 / rate_hz`` s; a
    request's first token comes ``ttft_ms`` after its release, then ``tokens − 1`` more, one
    every ``gap_ms``; both stretch as ``1 + sensitivity · (TOP / f − 1)`` at the clock the
    policy asked for last. The policy decides at every event."""

    def __init__(self, policy: TokenPolicy) -> None:
        self.policy = policy
        self.t = 0.0
        self.next_id = 0
        self.changes: list[tuple[float, int]] = []
        self.tpots: list[float] = []

    def stretch(self, sensitivity: float) -> float:
        return 1.0 + sensitivity * (TOP / self.policy.clock_mhz - 1.0)

    def run(
        self,
        seconds: float,
        *,
        rate_hz: float,
        prompt: int,
        tokens: int,
        ttft_ms: float,
        gap_ms: float,
        sensitivity: float = 0.5,
    ) -> None:
        p = self.policy
        end = self.t + seconds
        events: list[tuple[float, int, int, int]] = []  # (at, order, request, tokens left)
        order = 0
        arrival = self.t
        firsts: dict[int, float] = {}
        while events or arrival < end:
            if arrival < end and (not events or arrival <= events[0][0]):
                now, rid, left = arrival, self.next_id, -1
                self.next_id += 1
                arrival += 1.0 / rate_hz
            else:
                now, _, rid, left = heapq.heappop(events)
            self.t = now
            if left < 0:
                p.on_release(rid, now, now, prompt)
                at, left = now + ttft_ms * self.stretch(sensitivity) / 1000.0, tokens
            else:
                p.on_token(rid, now)
                firsts.setdefault(rid, now)
                left -= 1
                if left == 0:
                    p.on_finish(rid, now)
                    self.tpots.append((now - firsts[rid]) * 1000.0 / (tokens - 1))
                    at = math.nan
                else:
                    at = now + gap_ms * self.stretch(sensitivity) / 1000.0
            if not math.isnan(at):
                order += 1
                heapq.heappush(events, (at, order, rid, left))
            choice = p.decide(now)
            if choice is not None:
                self.changes.append((now, choice))


def make_policy(**params: object) -> TokenPolicy:
    return TokenPolicy(
        CLOCKS,
        TokenSlo(ttft_ms=500.0, tpot_ms=30.0),
        prior(),
        TokenPolicyParams(**params),  # type: ignore[arg-type]
    )


STEADY = {"rate_hz": 10.0, "prompt": 200, "tokens": 20, "ttft_ms": 40.0, "gap_ms": 5.0}


def test_it_plans_with_the_prior_tail_factor_until_it_has_measured_enough() -> None:
    policy = make_policy(min_samples=1000)
    plant = Plant(policy)
    plant.run(20.0, **STEADY)  # type: ignore[arg-type]
    assert policy.tail_factor(1000) == policy.params.prior_tail
    assert len(policy._ratios) > 150
    measured = make_policy(min_samples=50)
    Plant(measured).run(20.0, **STEADY)  # type: ignore[arg-type]
    assert measured.tail_factor(1000) != measured.params.prior_tail


def test_the_tail_factor_is_the_quantile_of_measured_tpot_over_the_model() -> None:
    """Streams whose TPOT is a known multiple of the model's gap: the tail factor is the
    ``tail_quantile`` of those multiples."""
    policy = make_policy(min_samples=10, tail_neighbours=5000)
    rng = np.random.default_rng(7)
    multiples = rng.uniform(1.0, 2.0, 400)
    t = 0.0
    policy.decide(t)
    for rid, k in enumerate(multiples):
        gap_s = k * policy._gap_now_ms / 1000.0  # the model's gap holds: no period runs
        policy.on_release(rid, t, t, 100)
        t += 0.01
        for _ in range(11):  # 11 tokens: 10 gaps of k · the model's
            policy.on_token(rid, t)
            t += gap_s
        policy.on_finish(rid, t - gap_s)
    assert policy.tail_factor(TOP) == pytest.approx(np.quantile(multiples, 0.99), rel=0.03)


def test_the_tail_factor_near_a_clock_comes_from_the_streams_that_ran_near_it() -> None:
    policy = make_policy(min_samples=10, tail_neighbours=100)
    for i in range(100):
        policy._ratios.append((600.0, 3.0 + 0.001 * i))  # slow clock: long chunks, big tails
    for i in range(100):
        policy._ratios.append((1800.0, 1.2 + 0.001 * i))
    assert policy.tail_factor(600) == pytest.approx(3.1, abs=0.01)
    assert policy.tail_factor(1800) == pytest.approx(1.3, abs=0.01)


def test_tails_far_under_the_slos_bring_the_clock_down_and_it_holds() -> None:
    policy = make_policy()
    plant = Plant(policy)
    plant.run(60.0, **STEADY)  # type: ignore[arg-type]
    assert policy.clock_mhz < TOP
    low = policy.base_mhz
    before = len(plant.changes)
    plant.run(30.0, **STEADY)  # type: ignore[arg-type]
    # On a steady plant the clock stays put: at most a couple of ladder steps either way.
    assert abs(policy.base_mhz - low) <= 200
    assert len(plant.changes) - before <= 10
    assert max(plant.tpots) < policy.slo.tpot_ms


def test_a_burst_of_prompts_raises_the_clock_within_the_short_window_and_it_is_held() -> None:
    policy = make_policy(hold_s=5.0, short_window_s=5.0)
    plant = Plant(policy)
    plant.run(40.0, **STEADY)  # type: ignore[arg-type]
    calm = policy.base_mhz
    # Prompts 20 times longer for 5 s: they would take most of the engine's time.
    plant.run(5.0, **dict(STEADY, prompt=4000))  # type: ignore[arg-type]
    raised = policy.base_mhz
    assert raised > calm
    first_up = min(t for t, c in plant.changes if t > 40.0 and c > calm)
    assert first_up < 40.0 + policy.params.short_window_s
    plant.run(2.0, **STEADY)  # type: ignore[arg-type]
    # Held: the highest need over hold_s, but above the static clock only over rise_s.
    static = policy.static_mhz
    assert static is not None
    assert policy.base_mhz >= min(raised, static)
    plant.run(30.0, **STEADY)  # type: ignore[arg-type]
    assert policy.base_mhz < raised  # the burst has left the rate windows and the hold


def test_measured_misses_tighten_the_tpot_budget_and_raise_the_clock() -> None:
    policy = make_policy()
    plant = Plant(policy)
    plant.run(60.0, **STEADY)  # type: ignore[arg-type]
    low = policy.base_mhz
    budget = policy.budgets()[1]
    # The engine slows down (say a longer context): streams now miss the TPOT SLO.
    plant.run(20.0, **dict(STEADY, gap_ms=40.0))  # type: ignore[arg-type]
    assert policy.tpot_loop.backoffs >= 1
    assert policy.budgets()[1] < budget
    assert policy.base_mhz > low


def test_only_decode_only_gaps_teach_the_step_model() -> None:
    policy = make_policy()
    policy.decide(0.0)  # sets the clock at 0: gaps in the next settle_s are not learned
    policy.on_release(1, 0.0, 0.0, 100)
    policy.on_token(1, 0.5)  # first token: no prompt waits from here on
    policy.on_token(1, 0.6)
    assert policy.steps.samples == 1
    policy.on_release(2, 0.6, 0.6, 100)  # a prompt joins the next iteration
    policy.on_token(2, 0.7)  # its first token, then the running stream's token
    policy.on_token(1, 0.7)  # this gap carried a prefill: not a decode step
    assert policy.steps.samples == 1
    policy.on_token(1, 0.8)  # decode-only again
    policy.on_token(2, 0.8)
    assert policy.steps.samples == 3


def test_a_prompt_that_would_be_late_is_boosted_and_the_boost_ends() -> None:
    policy = make_policy(boost_hold_s=1.0)
    plant = Plant(policy)
    plant.run(60.0, **STEADY)  # type: ignore[arg-type]
    base = policy.base_mhz
    assert base < TOP
    t = plant.t + 1.0
    # A 4,000-token prompt arrives: at the base clock it would miss its first token's target
    # (the top clock makes it, at the prompts' speed learned from the plant: 3.5x the prior).
    assert 3.0 < policy.prefill_factor < 4.0
    policy.on_release(10_000, t, t, 4_000)
    boosted = policy.decide(t + 0.01)
    assert boosted is not None and boosted > base and policy.boosts == 1
    policy.on_token(10_000, t + 0.2)
    policy.on_token(10_000, t + 0.21)
    policy.on_finish(10_000, t + 0.21)
    assert policy.decide(t + 0.5) is None  # held
    assert policy.decide(t + 1.2) == policy.base_mhz < boosted  # back to the base clock


def test_the_admission_limit_caps_sequences_whose_mean_gap_would_miss() -> None:
    for tpot_ms in (30.0, 10.0):
        policy = TokenPolicy(CLOCKS, TokenSlo(ttft_ms=500.0, tpot_ms=tpot_ms), prior())
        Plant(policy).run(30.0, rate_hz=10, prompt=10, tokens=20, ttft_ms=5, gap_ms=4)
        limit, budget = policy.admission_limit, tpot_ms * policy.params.headroom
        # The largest count whose predicted gap at the base clock fits the budget.
        assert policy._gap_model(policy.base_mhz, limit, policy._rate) <= budget
        if limit < policy.params.max_seqs:
            assert policy._gap_model(policy.base_mhz, limit + 1, policy._rate) > budget
        if tpot_ms == 10.0:
            assert 1 < limit < policy.params.max_seqs  # 3 + 0.05·n ms a step caps it


def test_requests_held_at_the_sidecar_raise_the_clock_until_the_engine_admits_them() -> None:
    """Past the admission limit requests wait at the sidecar, their TTFT growing; while any
    does, the base goes to the lowest clock whose limit lets them all in (a faster clock
    shortens the gaps, so more sequences fit), and back to the need once none waits."""
    policy = TokenPolicy(CLOCKS, TokenSlo(ttft_ms=500.0, tpot_ms=10.0), prior())
    running = 8
    for rid in range(running):
        policy.on_release(rid, 0.0, 0.0, 10)
    needs = [CLOCKS[0]] * 3
    policy._tpot_clock = lambda running, rate: needs.pop(0)  # type: ignore[method-assign]
    policy._static_clock = lambda now_s: None  # type: ignore[method-assign]
    policy._energy_floor = lambda gaps, counts, rate: CLOCKS[0]  # type: ignore[method-assign]
    policy._period(0.0)
    assert policy.base_mhz == CLOCKS[0]
    wanted = policy.admission_limit + 5
    policy.on_held(wanted - running)
    policy._period(0.25)
    limits = {f: policy._limit(f) for f in CLOCKS}
    assert CLOCKS[0] < policy.base_mhz < TOP  # the ladder has a clock that admits them
    assert policy.admission_limit == limits[policy.base_mhz] >= wanted
    assert all(limits[f] < wanted for f in CLOCKS if f < policy.base_mhz)
    assert policy.state()["held"] == wanted - running
    policy.on_held(0)
    policy._period(0.5)
    assert policy.base_mhz == CLOCKS[0]


def test_state_is_plain_data() -> None:
    policy = make_policy()
    Plant(policy).run(10.0, **STEADY)  # type: ignore[arg-type]
    state = policy.state()
    assert state["policy"] == "tokens" and state["clock_mhz"] == policy.clock_mhz
    for key in ("ttft_target_ms", "tpot_budget_ms", "tail_factor"):
        assert isinstance(state[key], float) and math.isfinite(state[key])  # type: ignore[arg-type]
    assert state["tpot_debt"] == round(policy.tpot_loop.debt, 2)
    json.dumps(state)  # plain data
    plans = policy.predict(10.0)
    assert len(plans) == len(CLOCKS)
    feasible = [pl.clock_mhz for pl in plans if pl.feasible]
    assert feasible and min(feasible) <= policy.need_mhz


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="tpot_ms"):
        TokenSlo(ttft_ms=100.0, tpot_ms=0.0)
    with pytest.raises(ValueError, match="headroom"):
        TokenPolicyParams(headroom=1.5)
    with pytest.raises(ValueError, match="tail_quantile"):
        TokenPolicyParams(tail_quantile=1.0)
    with pytest.raises(ValueError, match="prior_tail"):
        TokenPolicyParams(prior_tail=0.5)


def four_streams(
    policy: TokenClockPolicy, depth: int
) -> tuple[Scheduler[None], list[Request[None]]]:
    """A core with ``policy`` serving one stream model of release ``depth``: four requests
    enqueued at 0 s, and those it sends at 10 ms."""
    core: Scheduler[None] = Scheduler(TableSet(), policy)
    core.set_serving("llm", ModelServing(streams=depth))
    for _ in range(4):
        request: Request[None] = Request("llm", arrival_s=0.0, slo_ms=1e6, prompt_tokens=8)
        assert core.enqueue(request, 0.0).accepted
    return core, [d.request for _ in range(4) if (d := core.next_dispatch(0.01)) is not None]


def test_in_the_core_its_admission_limit_caps_streams_and_it_hears_every_token() -> None:
    """``TokenClockPolicy`` in a :class:`Scheduler`: streams are released up to the admission
    limit, and releases, tokens and ends reach the token policy."""
    # A TPOT SLO whose 90% falls between the prior's gaps of 2 and 3 sequences at the top
    # clock (tight enough that no lower clock fits): 2 sequences at once.
    probe = make_policy()
    gaps = [probe._gap_model(TOP, n, 0.0) for n in (2, 3)]
    tpot_ms = sum(gaps) / 2.0 / probe.params.headroom
    policy = TokenClockPolicy(CLOCKS, TokenSlo(500.0, tpot_ms), prior())
    policy.tokens.decide(0.0)  # the first control period sets the limit
    assert policy.tokens.admission_limit == 2
    core, sent = four_streams(policy, depth=256)
    assert len(sent) == 2 and core.queue_len == 2 and policy.tokens.running == 2
    assert policy.tokens.held == 2  # the requests the limit holds are told to the policy
    for t in (0.05, 0.06, 0.07):
        core.on_token(sent[0], t)
    core.on_complete(sent[0], 0.07, 0.07, measured=False)
    assert policy.tokens.running == 1 and policy.tokens._tokens_total == 3
    assert core.next_dispatch(0.08) is not None and core.next_dispatch(0.08) is None
    state = policy.state()
    assert state is not None and state[0]["admission_limit"] == 2


def test_in_the_core_the_gpus_energy_counter_reaches_it() -> None:
    """The core hands every value of the GPU's energy counter to the policy: joules per output
    token are measured at the clock in force (the counter's values, in order)."""
    policy = TokenClockPolicy(CLOCKS, TokenSlo(500.0, 30.0), prior())
    core, sent = four_streams(policy, depth=256)
    core.poll(0.5)
    clock = policy.tokens.clock_mhz
    core.on_energy(EnergyReading(100.0, 1.0), None)
    for i in range(10):
        core.on_token(sent[0], 1.0 + i * 0.001)
    core.on_energy(EnergyReading(105.0, 1.1), None)  # 5 J over the 10 tokens
    assert policy.tokens.clock_mhz == clock
    state = policy.state()
    assert state is not None
    assert state[0]["measured_j_per_token"] == {clock: 0.5}


def test_in_the_core_requests_the_engines_own_depth_holds_are_not_held_for_the_clock() -> None:
    """Requests wait because the engine's own sequence limit (its release depth) is full, not
    the admission limit: no clock would let them in, so they do not raise it."""
    policy = TokenClockPolicy(CLOCKS, TokenSlo(500.0, 30.0), prior())
    core, sent = four_streams(policy, depth=2)
    assert len(sent) == 2 and core.queue_len == 2
    assert policy.tokens.admission_limit > 2 and policy.tokens.held == 0


def scripted(policy: TokenPolicy, needs: list[int], static: int | None) -> list[int]:
    """The base clock after each control period (0.25 s apart) whose TPOT need is scripted,
    the static clock fixed and the energy floor at the bottom."""
    needs_left = list(needs)
    policy._tpot_clock = lambda running, rate: needs_left.pop(0)  # type: ignore[method-assign]
    policy._static_clock = lambda now_s: static  # type: ignore[method-assign]
    policy._energy_floor = lambda gaps, counts, rate: CLOCKS[0]  # type: ignore[method-assign]
    bases = []
    for i in range(len(needs)):
        policy._period(i * 0.25)
        bases.append(policy.base_mhz)
    return bases


def test_a_need_above_the_static_clock_is_held_rise_s_and_one_below_it_hold_s() -> None:
    spike = [800] * 4 + [1800] + [800] * 15  # one period's need far above the rest
    above = scripted(make_policy(hold_s=2.0, rise_s=0.5), spike, static=1000)
    assert above[4] == 1800  # a need raises the base at once
    assert above[5:7] == [1800, 1800]  # held rise_s (0.5 s: two more periods)
    assert above[7:13] == [1000] * 6  # then the static clock, not the 2-s high
    assert above[13:] == [800] * 7  # the spike has left hold_s
    below = scripted(make_policy(hold_s=2.0, rise_s=0.5), spike, static=2000)
    assert below[4:13] == [1800] * 9  # under the static clock: held hold_s (2 s)
    assert below[13:] == [800] * 7
    learning = scripted(make_policy(hold_s=2.0, rise_s=0.5), spike, static=None)
    assert learning == below  # before the static clock is known: held hold_s


def test_the_static_clock_is_the_lowest_whose_counterfactual_tail_fits_the_budget() -> None:
    policy = make_policy(static_min_samples=10)
    budget = policy.budgets()[1]
    rng = np.random.default_rng(3)
    ladder = np.asarray(CLOCKS, dtype=float)
    for _ in range(200):
        # Every stream's TPOT, had each clock been held through its life: falling with it.
        policy._fixed_tpots.append((1.0, rng.uniform(0.5, 1.0) * budget * 1000.0 / ladder))
    worst = np.quantile(np.stack([v for _, v in policy._fixed_tpots]), 0.99, axis=0)
    expected = CLOCKS[int(np.flatnonzero(worst <= budget)[0])]
    assert policy._static_clock(2.0) == expected
    # Past the window (60 s) the last static_min_samples streams are kept: the clock is theirs.
    assert len(policy._fixed_tpots) == 200
    later = policy._static_clock(70.0)
    kept = np.stack([v for _, v in policy._fixed_tpots])
    assert len(kept) == 10
    tail = np.quantile(kept, 0.99, axis=0)
    assert later == CLOCKS[int(np.flatnonzero(tail <= budget)[0])]
    assert make_policy(static_min_samples=10)._static_clock(70.0) is None  # none ever ended


def test_a_slow_engine_gets_a_static_clock_from_older_streams() -> None:
    """Fewer streams end in the window than static_min_samples: the window reaches back to the
    last static_min_samples of them instead of leaving the static clock unknown."""
    policy = make_policy(static_min_samples=20, static_window_s=10.0)
    ladder = np.asarray(CLOCKS, dtype=float)
    for i in range(30):  # one stream every 2 s: 5 in any 10-s window
        policy._fixed_tpots.append((2.0 * i, 10.0 * TOP / ladder))
    assert policy._static_clock(60.0) is not None
    assert len(policy._fixed_tpots) == 20 and policy._fixed_tpots[0][0] == 20.0


def test_held_clocks_predict_the_measured_tpot_at_the_clock_that_ran() -> None:
    """A stream's counterfactual TPOT at the clock it ran at (never changed) is its TPOT, and
    at a higher clock it is shorter."""
    policy = make_policy()
    policy.decide(0.0)  # one control period; none runs while the streams below go by
    clock = policy.clock_mhz
    i = CLOCKS.index(clock)
    t, tpots = 0.0, []
    for rid, gap_ms in enumerate((5.0, 7.0, 9.0)):
        policy.on_release(rid, t, t, 100)
        t += 0.01
        for _ in range(21):
            policy.on_token(rid, t)
            t += gap_ms / 1000.0
        policy.on_finish(rid, t - gap_ms / 1000.0)
        tpots.append(gap_ms)
    fixed = [v for _, v in policy._fixed_tpots]
    assert [v[i] for v in fixed] == pytest.approx(tpots, rel=1e-6)
    assert all(v[-1] <= v[i] for v in fixed)


def test_the_base_never_goes_below_the_energy_floor() -> None:
    """With a prefill whose energy is least mid-ladder, the floor is the clock of least joules
    per output token and the base does not go under it, however light the load."""
    policy = make_policy()
    plant = Plant(policy)
    plant.run(30.0, rate_hz=2.0, prompt=2000, tokens=20, ttft_ms=40.0, gap_ms=5.0)
    floor = policy.floor_mhz
    assert CLOCKS[0] < floor < TOP
    assert policy.base_mhz >= floor and policy.need_mhz < floor  # the need alone would go lower
    p = policy.prior
    gaps, counts = policy._gap_vector(policy.running, policy._rate)

    def joules(f: int) -> float:
        i = CLOCKS.index(f)
        n = float(counts[i])
        step = np.interp(n, sorted(p.step_j), [p.step_j[b][f] for b in sorted(p.step_j)])
        prompt = policy._rate * gaps[i] / 1000.0 / n * p.prefill_j[f] / 1024
        return float(step / n + prompt)

    assert policy._energy_floor(gaps, counts, policy._rate) == min(CLOCKS, key=joules)


def test_the_static_clocks_gaps_are_at_the_running_count_and_the_long_window_rate() -> None:
    """The gaps the static clock integrates: every clock at the sequences running now (no
    growth by Little's law, which the energy floor's counts do take) and the prompt rate over
    window_s, not the short window's burst."""
    policy = make_policy()
    plant = Plant(policy)
    plant.run(25.0, **STEADY)  # type: ignore[arg-type]
    plant.run(3.0, **dict(STEADY, rate_hz=40.0))  # type: ignore[arg-type]  # a burst
    now = plant.t
    policy._period(now)
    long_rate = policy._prompt_rate(now, short=False)
    assert long_rate < policy._rate  # the need sees the burst
    running = policy.running
    expected = [policy._gap_model(f, running, long_rate, learned=False) for f in CLOCKS]
    assert policy._gap_vec == pytest.approx(np.minimum(expected, 1e6))
    # With sequences running, Little's growth (the floor's counts) makes a low clock slower
    # still; the static clock's gaps leave the count as it is.
    grown, counts = policy._gap_vector(20, long_rate)
    flat, same = policy._gap_vector(20, long_rate, littles=False)
    assert policy.clock_mhz > CLOCKS[0] and counts[0] > 20 and grown[0] > flat[0]
    assert list(same) == [20.0] * len(CLOCKS)


def test_a_trusted_static_clock_is_not_left_for_a_need_above_it_past_its_period() -> None:
    """Judged on confident_samples streams or more, the static clock is trusted: a need above
    it raises the base only while it lasts (no rise_s hold); judged on fewer, it is held."""
    spike = [800] * 4 + [1800] + [800] * 15

    def run(samples: int) -> list[int]:
        policy = make_policy(hold_s=2.0, rise_s=0.5, static_min_samples=100)

        def static(now_s: float) -> int:
            policy._static_samples = samples
            return 1000

        policy._static_clock = static  # type: ignore[method-assign]
        needs = list(spike)
        policy._tpot_clock = lambda running, rate: needs.pop(0)  # type: ignore[method-assign]
        policy._energy_floor = lambda gaps, counts, rate: CLOCKS[0]  # type: ignore[method-assign]
        bases = []
        for i in range(len(spike)):
            policy._period(i * 0.25)
            bases.append(policy.base_mhz)
        assert policy.state()["static_trusted"] is (samples >= 200)
        return bases

    trusted = run(200)
    assert trusted[4] == 1800  # a need still raises the base at once
    assert trusted[5:13] == [1000] * 8  # and the next period it is back at the static clock
    assert trusted[13:] == [800] * 7
    unsure = run(150)
    assert unsure[5:7] == [1800, 1800]  # held rise_s, as before the static clock is trusted
    assert unsure[7:13] == [1000] * 6


def test_a_trusted_static_clock_lets_boosts_give_up_on_prompts_no_clock_can_save() -> None:
    """A prompt that even the top clock would get late is lost to the p99: once the static
    clock is trusted, a boost plans for the prompts that can still make it (the lost one's
    tokens still count ahead of theirs), and none at all when none can."""

    def urgent(trusted: bool, lost_only: bool) -> int | None:
        policy = make_policy()
        policy.base_mhz = CLOCKS[0]
        policy.static_mhz = 1000
        policy._static_samples = 200 if trusted else 150
        now = 10.0
        # Waited 1 s already: past the TTFT target (475 ms) whatever the clock.
        policy.on_release(1, now, now - 1.0, 100)
        if not lost_only:
            policy.on_release(2, now, now, 100)  # fresh and short: the bottom clock makes it
        return policy._urgent_clock(now)

    assert urgent(trusted=False, lost_only=False) == TOP  # before: the top for a lost cause
    assert urgent(trusted=True, lost_only=False) == CLOCKS[0]
    assert urgent(trusted=True, lost_only=True) is None
    assert urgent(trusted=False, lost_only=True) == TOP


def test_confident_samples_below_the_static_minimum_is_refused() -> None:
    with pytest.raises(ValueError, match="confident_samples"):
        TokenPolicyParams(static_min_samples=100, confident_samples=50)


def lone_prompts(policy: TokenPolicy, slowdown: float, count: int, start_s: float = 10.0) -> None:
    """``count`` prompts of 1,000 tokens, one at a time, each getting its first token
    ``slowdown`` times the model's time after its release, and ending there."""
    now = start_s
    for i in range(count):
        model_ms = float(policy._prefill_model(np.asarray([1000.0]))(policy.clock_mhz)[0])
        policy.on_release(i, now, now, 1000)
        now += slowdown * model_ms / 1000.0
        policy.on_token(i, now)
        policy.on_finish(i, now)
        now += 0.5


def test_prompts_slower_than_the_prior_scale_the_boosts_model_up() -> None:
    """Lone prompts whose first token comes twice as late as the prior says: from the
    ``min_prefill_samples``-th on, the model of waiting prompts is scaled by 2, and a prompt
    that waited the same gets a faster clock than it would from the prior alone."""
    slow = make_policy(min_prefill_samples=20)
    lone_prompts(slow, 2.0, 19)
    assert slow.prefill_factor == 1.0  # not yet
    lone_prompts(slow, 2.0, 1, start_s=100.0)
    assert slow.prefill_factor == pytest.approx(2.0, rel=1e-6)
    assert slow.state()["prefill_samples"] == 20

    def urgent(policy: TokenPolicy) -> int | None:
        policy.base_mhz = CLOCKS[0]
        now = 200.0
        policy.on_release(99, now, now - 0.3, 1000)  # waited 300 ms of its 475 ms target
        return policy._urgent_clock(now)

    fresh_clock, slow_clock = urgent(make_policy()), urgent(slow)
    assert fresh_clock is not None and slow_clock is not None
    assert CLOCKS[0] < fresh_clock < slow_clock < TOP
    # each the lowest clock where the (scaled) model meets the target, the change's 50 ms in
    target_ms = make_policy().budgets()[0]
    for policy, clock, factor in ((make_policy(), fresh_clock, 1.0), (slow, slow_clock, 2.0)):
        model = policy._prefill_model(np.asarray([1000.0]))
        model_ms = {f: float(model(f)[0]) for f in CLOCKS}
        at = {f: 300.0 + 50.0 + factor * ms for f, ms in model_ms.items()}
        assert at[clock] <= target_ms < at[clock - 100]


def test_prompts_faster_than_the_prior_keep_its_margin() -> None:
    """An engine faster than its profile leaves the model as it is (its margin is the boost's),
    and the admin state shows how much faster."""
    policy = make_policy()
    lone_prompts(policy, 0.5, 30)
    assert policy.prefill_factor == 1.0
    assert policy.state()["prefill_ratio"] == pytest.approx(0.5, rel=1e-3)


def test_only_lone_prompts_at_a_landed_clock_are_learned_from() -> None:
    """A prompt released while another waits for its first token (its time includes the
    other's), or whose clock changed before its first token, is not a measurement of the
    prior's prediction for it."""
    policy = make_policy()
    policy.on_release(1, 10.0, 10.0, 1000)
    policy.on_release(2, 10.0, 10.0, 1000)  # behind the first
    policy.on_token(1, 10.1)
    policy.on_token(2, 10.2)
    assert policy.state()["prefill_samples"] == 1
    policy.on_release(3, 11.0, 11.0, 1000)
    policy._clock_since_s = 11.01  # a change asked for during its prefill
    policy.on_token(3, 11.1)
    assert policy.state()["prefill_samples"] == 1
    policy.on_release(4, 11.03, 11.03, 1000)  # that change has not landed yet
    policy.on_token(4, 11.2)
    assert policy.state()["prefill_samples"] == 1


def test_the_starts_first_arrivals_are_not_a_rate_for_the_static_clock() -> None:
    """A few prompts in the first fraction of a second: the need's rate sees them at once, but
    the long rate (the static clock's) counts at least short_window_s, so the first streams'
    counterfactual TPOTs are not those of clocks that could not keep up, and the static clock
    is the one a steady load gives without them."""
    policy = make_policy(static_min_samples=20, confident_samples=20)
    for rid in range(6):  # 6 prompts of 1,500 tokens within 50 ms of the first
        policy.on_release(rid, rid * 0.01, rid * 0.01, 1500)
    now = 0.2
    assert policy._prompt_rate(now) == pytest.approx(9000 / policy.params.period_s)
    assert policy._prompt_rate(now, short=False) == pytest.approx(9000 / 5.0)
    plant = Plant(make_policy(static_min_samples=20, confident_samples=20))
    plant.run(0.05, **dict(STEADY, rate_hz=120.0, prompt=1500))  # type: ignore[arg-type]
    plant.run(10.0, **STEADY)  # type: ignore[arg-type]
    start = [v for at, v in plant.policy._fixed_tpots if at < 1.0]
    assert start and np.max(start) < 100.0  # ms: no stream charged a clock that cannot keep up
    steady = Plant(make_policy(static_min_samples=20, confident_samples=20))
    steady.run(10.0, **STEADY)  # type: ignore[arg-type]
    assert plant.policy.static_mhz == steady.policy.static_mhz
