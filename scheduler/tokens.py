"""Scheduling by tokens: how many sequences to let into an LLM engine, and the GPU clock.

A pure core like :mod:`scheduler.core`: no I/O and no clock of its own. The caller reports what
it sees of each stream (a request released to the engine, every token, the end of a stream, a
reading of the GPU's energy counter), passing the time in; the core answers with an admission
limit (sequences allowed in the engine at once) and, every control period, the clock to set.

What it measures, per request: the time to first token (TTFT, from arrival at the sidecar) and
the time per output token (TPOT, ``(last token − first token) / (tokens − 1)``, the inter-token
latency of genai-perf and aiperf).

The model it predicts with, at clock ``f`` with ``n`` sequences running:

* **Decode step** ``s(f, n)``: learned online. The gap between two tokens of a stream is one
  engine iteration; per bucket of ``n`` (1, 2, 4, … 512) the core fits seed 003's
  ``t = 1/(m·f + b)`` over clocks to the mean gaps it measured at each clock and, at clocks not
  measured, to the prior (an offline profile of the engine) moved by the median live/prior
  ratio. Decode steps are memory-bound: the curves come out nearly flat (large ``b``).
* **Prefill**: ``c(f)``, the time per prompt token, from the prior's prefill curve (compute-
  bound, about ``1/f``); prompts take the share ``ρ(f) = λ_p · c(f)`` of the engine's time,
  ``λ_p`` the prompt tokens released per second over the last ``rate_window_s``.
* **Gap** ``g = s(f, n) / (1 − ρ(f))``: decode steps stretched by the prompts sharing the
  iterations. Sequences live in proportion to the gap, so ``n`` scales with it (a fixed point).
* **TTFT of a prompt of p tokens** ``(p · c(f) + s(f, n)) / (1 − ρ(f))``.

Each finished request's measured TTFT and TPOT are divided by the model's value under the
conditions it ran in (clock, load); the predicted p99 at a candidate clock is the p99, over the
recent requests, of ratio × the model re-evaluated at that clock, each with its own prompt. So
the prompt-length tail and the model's error both carry over to the prediction, and misses
measured at one clock are not blamed on another.

Energy per output token: the prior's decode energy per step at ``n`` over ``n``, plus the
prompts' energy each output token carries, per clock. What the GPU's energy counter measured
per clock is kept for the admin state, not used to decide: between clocks measured at
different loads it compares the loads as much as the clocks.

What it decides, every ``period_s`` (never per iteration: a clock change takes from a
millisecond to hundreds of them to land, published for NVIDIA GPUs):

* The clock with the least predicted energy per output token whose predicted p99 TTFT and TPOT
  fit the budgets: each SLO × ``headroom`` × the scale of a
  :class:`scheduler.feedback.ScaleController` fed every measured TTFT and TPOT (misses cut the
  budget fast, tails well under the SLO let it creep back), so the loop closes on the measured
  token tails, not on the model's promise. The scale lets the budget rise up to the SLO
  itself while the measured tails stay under the feedback's setpoint.
* Calibration on the measured tails: the history's p99 mixes the loads of the last
  ``history_s`` (a burst's queueing, a peak's prompts) and errs on the slow side; where the p99
  the feedback measured over its recent window sits under the history's prediction at the clock
  in force, every candidate's prediction is scaled down by that ratio (to
  ``calibration_floor`` at most, never up). A tail far under the SLO then means the clock is
  too high, and the clock comes down in a trough as soon as the recent tails show it.
* Hysteresis: while the present clock's predictions fit, a change waits ``dwell_s`` after the
  last one, needs ``min_gain`` of energy and must look best ``confirm_periods`` periods in a row
  (then the highest of the clocks that did is taken); when they do not fit, the change to the
  cheapest clock that fits is made at once.
* The admission limit: the most running sequences whose mean gap at the chosen clock stays
  within the TPOT SLO × ``headroom``. Past it every stream would miss on average, so new
  requests wait at the sidecar (their TTFT grows, running streams keep their pace). It guards
  against overload; the tails are the clock's job (a limit fed by the tails would starve the
  engine when one stalled iteration, not the batch, made the tail).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from scheduler.feedback import ScaleController, ScaleParams
from scheduler.policies import ClockPolicy
from scheduler.view import QueuedRequest, SchedulerView
from time2clock.fit import fit_inverse_linear
from time2clock.online import curve_is_sound
from time2clock.table import InverseLinearFit, TableError

FloatArray = npt.NDArray[np.float64]
SEQ_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def seq_bucket(running: float) -> int:
    """The bucket (an upper edge of :data:`SEQ_BUCKETS`) ``running`` sequences fall in."""
    i = bisect.bisect_left(SEQ_BUCKETS, max(1.0, running))
    return SEQ_BUCKETS[min(i, len(SEQ_BUCKETS) - 1)]


def _interp_buckets(values: Mapping[int, float], n: float) -> float:
    """Linear in ``n`` between the buckets around it; past the last, its slope extended."""
    known = sorted(values)
    if not known:
        return math.nan
    n = max(1.0, n)
    if n <= known[0]:
        return values[known[0]]
    for lo, hi in itertools.pairwise(known):
        if n <= hi:
            return values[lo] + (values[hi] - values[lo]) * (n - lo) / (hi - lo)
    if len(known) >= 2:
        lo, hi = known[-2], known[-1]
        return values[hi] + (values[hi] - values[lo]) * (n - hi) / (hi - lo)
    return values[known[-1]]


def _fit_or_flat(points: Mapping[int, float], clocks: Sequence[int]) -> InverseLinearFit | None:
    """Seed 003's law through ``{clock: ms}``; flat at the mean where the fit is unsound (no
    clock effect seen, or noise bigger than it)."""
    if not points:
        return None
    xs = sorted(points)
    mean_ms = float(np.mean([points[c] for c in xs]))
    if len(xs) == 1:
        return InverseLinearFit(m=0.0, b=1.0 / mean_ms, r2=1.0)
    try:
        fit = fit_inverse_linear(xs, [points[c] for c in xs])
    except TableError:
        return None
    if curve_is_sound(fit, clocks):
        return fit
    return InverseLinearFit(m=0.0, b=1.0 / mean_ms, r2=0.0)


@dataclass(frozen=True)
class TokenSlo:
    """Token-level SLOs, each held at the p99 of requests: time to first token and time per
    output token, in ms."""

    ttft_ms: float
    tpot_ms: float

    def __post_init__(self) -> None:
        for name, value in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms)):
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of ms, got {value}")


@dataclass(frozen=True)
class EnginePrior:
    """What an offline profile of the engine measured (seed 003's sweep, per bucket):
    ``step_ms[bucket][clock]`` and ``step_j[bucket][clock]``, the mean time and energy of a
    decode step of ``bucket`` sequences; ``prefill_ms[clock]`` and ``prefill_j[clock]``, those
    of an iteration prefilling one ``prefill_tokens``-token prompt."""

    clocks_mhz: tuple[int, ...]
    step_ms: Mapping[int, Mapping[int, float]]
    step_j: Mapping[int, Mapping[int, float]]
    prefill_ms: Mapping[int, float]
    prefill_j: Mapping[int, float]
    prefill_tokens: int
    context_tokens: int


@dataclass(frozen=True)
class TokenPolicyParams:
    """Knobs of :class:`TokenPolicy` (see the module docstring for each)."""

    period_s: float = 1.0
    window_s: float = 20.0  # running count, prompt rate, mean prompt and output
    rate_window_s: float = 20.0  # the prompt rate's window
    history_s: float = 120.0  # the requests whose ratios predict the tails
    history_cap: int = 4000
    dwell_s: float = 5.0
    min_gain: float = 0.03
    headroom: float = 0.9
    min_samples: int = 40
    confirm_periods: int = 2  # a lower clock must look best this many periods in a row
    down_band: float = 0.95  # a lower clock's predictions must be within this share of budget
    boost_hold_s: float = 1.0  # a boost for waiting prompts lasts at least this long
    batched_tokens: int = 2048  # the engine's tokens per iteration (its own setting)
    change_latency_s: float = 0.05  # how long a clock change takes to land (the GPU's)
    settle_s: float = 0.3  # gaps this soon after a clock request are not attributed to a clock
    gap_cap: int = 400  # gaps kept per (bucket, clock)
    min_gap_samples: int = 20
    clock_stride: int = 2  # candidate clocks: every this many ladder steps
    max_seqs: int = 256
    calibration_floor: float = 0.6  # the measured tails scale the predictions down to this
    feedback: ScaleParams = field(
        default_factory=lambda: ScaleParams(setpoint=0.85, min_samples=30, max_scale=1 / 0.9)
    )

    def __post_init__(self) -> None:
        if min(self.period_s, self.window_s, self.rate_window_s, self.history_s) <= 0:
            raise ValueError("period_s and the windows must be > 0")
        if self.dwell_s < 0:
            raise ValueError(f"dwell_s must be >= 0, got {self.dwell_s}")
        if not 0 < self.headroom <= 1:
            raise ValueError(f"headroom must be in (0, 1], got {self.headroom}")
        if min(self.clock_stride, self.max_seqs, self.min_samples, self.history_cap) < 1:
            raise ValueError("clock_stride, max_seqs, min_samples and history_cap must be >= 1")
        if self.confirm_periods < 1:
            raise ValueError(f"confirm_periods must be >= 1, got {self.confirm_periods}")
        if not 0 < self.calibration_floor <= 1:
            raise ValueError(f"calibration_floor must be in (0, 1], got {self.calibration_floor}")
        if not 0 < self.down_band <= 1:
            raise ValueError(f"down_band must be in (0, 1], got {self.down_band}")
        if self.batched_tokens < 2 or self.boost_hold_s < 0 or self.change_latency_s < 0:
            raise ValueError("batched_tokens must be >= 2, boost_hold_s and change_latency_s >= 0")


class StepTimeModel:
    """Decode step time per (clock, running sequences): the prior moved by what live gaps
    measured (see the module docstring)."""

    def __init__(self, prior: EnginePrior, params: TokenPolicyParams) -> None:
        self.params = params
        self.clocks = list(prior.clocks_mhz)
        self._prior_points = {b: dict(v) for b, v in prior.step_ms.items()}
        self._prior_fits = {
            b: fit
            for b, points in self._prior_points.items()
            if (fit := _fit_or_flat(points, self.clocks)) is not None
        }
        self._prior_at: dict[float, dict[int, float]] = {}  # clock -> the prior per bucket
        self._gaps: dict[tuple[int, int], deque[float]] = {}
        self._fits: dict[int, InverseLinearFit] = dict(self._prior_fits)
        self._dirty: set[int] = set()
        self.samples = 0

    def prior_ms(self, clock_mhz: float, running: float) -> float:
        at = self._prior_at.get(clock_mhz)
        if at is None:
            at = self._prior_at[clock_mhz] = {
                b: f.predict_ms(clock_mhz) for b, f in self._prior_fits.items()
            }
        return _interp_buckets(at, running)

    def observe(self, clock_mhz: int, running: float, step_ms: float) -> None:
        """One measured step with ``running`` sequences, moved to its bucket's edge by the
        prior's ratio (a bucket holds counts up to its edge)."""
        bucket = seq_bucket(running)
        here, edge = self.prior_ms(clock_mhz, running), self.prior_ms(clock_mhz, bucket)
        if not (here > 0 and math.isfinite(here) and math.isfinite(edge)):
            return
        key = (bucket, clock_mhz)
        cell = self._gaps.get(key)
        if cell is None:
            cell = self._gaps[key] = deque(maxlen=self.params.gap_cap)
        cell.append(step_ms * edge / here)
        self._dirty.add(bucket)
        self.samples += 1

    def live_points(self, bucket: int) -> dict[int, float]:
        """Mean step (ms) per clock measured live in ``bucket``, where enough were. A mean,
        not a trimmed one: iterations that carry a prompt chunk are part of the mixture."""
        return {
            clock: float(np.mean(cell))
            for (b, clock), cell in self._gaps.items()
            if b == bucket and len(cell) >= self.params.min_gap_samples
        }

    def fit(self, bucket: int) -> InverseLinearFit | None:
        if bucket in self._dirty:
            self._dirty.discard(bucket)
            live = self.live_points(bucket)
            prior = self._prior_fits.get(bucket)
            if not live:
                fit = prior
            elif prior is None:
                fit = _fit_or_flat(live, self.clocks)
            else:
                factor = float(np.median([ms / prior.predict_ms(c) for c, ms in live.items()]))
                points = {c: prior.predict_ms(c) * factor for c in self._prior_points[bucket]}
                points.update(live)
                fit = _fit_or_flat(points, self.clocks)
            if fit is not None:
                self._fits[bucket] = fit
        return self._fits.get(bucket)

    def predict_ms(self, clock_mhz: float, running: float) -> float:
        """Mean step time with ``running`` sequences at ``clock_mhz``."""
        values = {}
        for b in SEQ_BUCKETS:
            fit = self.fit(b)
            if fit is not None:
                values[b] = fit.predict_ms(clock_mhz)
        return _interp_buckets(values, running)


@dataclass
class _Stream:
    released_s: float
    arrival_s: float
    prompt_tokens: int
    first_s: float | None = None
    last_s: float | None = None
    tokens: int = 0
    ttft_ratio: float = math.nan
    prompts_at_first: int = 0  # prompt tokens released before its first token (a counter)


@dataclass(frozen=True)
class _Done:
    at_s: float
    prompt_tokens: int
    ttft_ratio: float
    tpot_ratio: float  # nan: a single output token
    shared_tokens: float  # prompt tokens the engine ran per gap of this stream


@dataclass(frozen=True)
class ClockPlan:
    """One candidate clock's predictions (for the admin state and the tests)."""

    clock_mhz: int
    ttft_p99_ms: float
    tpot_p99_ms: float
    running: float
    joules_per_token: float
    feasible: bool


class TokenPolicy:
    """The token-level admission and clock policy (module docstring)."""

    name = "tokens"

    def __init__(
        self,
        clocks_mhz: Sequence[int],
        slo: TokenSlo,
        prior: EnginePrior,
        params: TokenPolicyParams | None = None,
    ) -> None:
        self.clocks = sorted(clocks_mhz)
        self.slo = slo
        self.params = params or TokenPolicyParams()
        self.prior = prior
        self.steps = StepTimeModel(prior, self.params)
        self.ttft_loop = ScaleController(self.params.feedback)
        self.tpot_loop = ScaleController(self.params.feedback)
        points = dict(prior.prefill_ms)
        prefill = _fit_or_flat(points, self.clocks)
        if prefill is None:
            raise ValueError("the prior has no prefill measurements")
        self._prefill_fit = prefill
        self.clock_mhz = self.clocks[-1]  # the clock asked for last (the top until told)
        self._clock_since_s = -math.inf
        self.base_mhz = self.clocks[-1]  # the control period's clock
        self._base_since_s = -math.inf
        self._boost: tuple[int, float] = (0, -math.inf)  # (clock, held until)
        self.boosts = 0
        self._last_period_s: float | None = None
        self._started_s: float | None = None
        self._rate: tuple[float, float] | None = None  # (as of, prompt tokens/s)
        self._streams: dict[int, _Stream] = {}
        self._done: deque[_Done] = deque(maxlen=self.params.history_cap)
        self._prompts: deque[tuple[float, int]] = deque()
        self._outputs: deque[tuple[float, int]] = deque()
        self._running_samples: deque[tuple[float, int]] = deque()
        self._energy: tuple[float, float, int, int] | None = None  # (at_s, J, tokens, clock)
        self._tokens_total = 0
        self._prompt_tokens_total = 0
        self._measured: dict[int, tuple[float, int]] = {}  # clock -> (J, output tokens)
        self.admission_limit = self.params.max_seqs
        self._wanted: deque[int | None] = deque(maxlen=self.params.confirm_periods)
        self.plans: list[ClockPlan] = []
        self.calibration = (1.0, 1.0)  # the TTFT and TPOT factors of the last plans
        self.changes = 0

    # -- what the caller reports ------------------------------------------------------------

    @property
    def running(self) -> int:
        """Sequences released to the engine and not finished."""
        return len(self._streams)

    def on_release(
        self, request_id: int, now_s: float, arrival_s: float, prompt_tokens: int
    ) -> None:
        """The sidecar let a request into the engine."""
        if self._started_s is None:
            self._started_s = now_s
        self._streams[request_id] = _Stream(now_s, arrival_s, prompt_tokens)
        self._prompts.append((now_s, prompt_tokens))
        self._prompt_tokens_total += prompt_tokens
        self._running_samples.append((now_s, len(self._streams)))

    def on_token(self, request_id: int, now_s: float) -> None:
        """A token of the request's stream went by."""
        s = self._streams.get(request_id)
        if s is None:
            return
        s.tokens += 1
        self._tokens_total += 1
        if s.first_s is None:
            s.first_s = now_s
            s.prompts_at_first = self._prompt_tokens_total
            ttft_ms = (now_s - s.arrival_s) * 1000.0
            self.ttft_loop.observe(now_s, ttft_ms, self.slo.ttft_ms)
            share = self._share(self.clock_mhz)
            model = float(
                self._ttft_model(s.prompt_tokens, self.clock_mhz, self._mean_running(), share)
            )
            s.ttft_ratio = ttft_ms / model if model > 0 else math.nan
        elif s.last_s is not None and now_s >= self._clock_since_s + self.params.settle_s:
            gap_ms = (now_s - s.last_s) * 1000.0
            share = min(self._share(self.clock_mhz), 0.95)
            self.steps.observe(self.clock_mhz, len(self._streams), gap_ms * (1.0 - share))
        s.last_s = now_s

    def on_finish(self, request_id: int, now_s: float) -> None:
        """The stream ended (its last token was reported) or its client went away."""
        s = self._streams.pop(request_id, None)
        if s is None:
            return
        self._running_samples.append((now_s, len(self._streams)))
        if s.first_s is None or s.last_s is None:
            return  # went away before its first token
        tpot_ratio = math.nan
        shared = 0.0
        if s.tokens >= 2:
            tpot_ms = (s.last_s - s.first_s) * 1000.0 / (s.tokens - 1)
            self.tpot_loop.observe(now_s, tpot_ms, self.slo.tpot_ms)
            shared = (self._prompt_tokens_total - s.prompts_at_first) / (s.tokens - 1)
            model = float(self._tpot_model(shared, self.clock_mhz, self._mean_running(), 1.0))
            tpot_ratio = tpot_ms / model if model > 0 else math.nan
        self._outputs.append((now_s, s.tokens))
        self._done.append(_Done(now_s, s.prompt_tokens, s.ttft_ratio, tpot_ratio, shared))

    def on_energy(self, now_s: float, energy_j: float) -> None:
        """A reading of the GPU's energy counter (joules since any origin): joules per output
        token are summed per clock while it is in force, for :meth:`state`."""
        last = self._energy
        self._energy = (now_s, energy_j, self._tokens_total, self.clock_mhz)
        if last is None or last[3] != self.clock_mhz or last[0] < self._clock_since_s:
            return
        joules, tokens = self._measured.get(self.clock_mhz, (0.0, 0))
        self._measured[self.clock_mhz] = (
            joules + energy_j - last[1],
            tokens + self._tokens_total - last[2],
        )

    # -- what it decides ---------------------------------------------------------------------

    def wake_at_s(self) -> float | None:
        """When :meth:`decide` next wants to run (None: at the caller's first chance)."""
        if self._last_period_s is None:
            return None
        return self._last_period_s + self.params.period_s

    def decide(self, now_s: float) -> int | None:
        """The clock to set now (None: keep the present one). Call it often: the control
        period runs when due; between periods only the prompts waiting for their first token
        are checked (a boost, module docstring)."""
        if self._last_period_s is None or now_s >= self._last_period_s + self.params.period_s:
            self._period(now_s)
        need = self._urgent_clock(now_s)
        if need is not None and need > self.base_mhz:
            level = max(need, self._boost[0]) if now_s < self._boost[1] else need
            self._boost = (level, now_s + self.params.boost_hold_s)
        elif now_s >= self._boost[1]:
            self._boost = (0, now_s)
        target = max(self.base_mhz, self._boost[0])
        if target == self.clock_mhz:
            return None
        if target > self.clock_mhz and target > self.base_mhz:
            self.boosts += 1
        self.clock_mhz = target
        self._clock_since_s = now_s
        self.changes += 1
        return target

    def _period(self, now_s: float) -> None:
        """The control period: the base clock and the admission limit (module docstring)."""
        p = self.params
        self._last_period_s = now_s
        self._prune(now_s)
        ttft_n = sum(math.isfinite(d.ttft_ratio) for d in self._done)
        tpot_n = sum(math.isfinite(d.tpot_ratio) for d in self._done)
        if min(ttft_n, tpot_n) < p.min_samples:
            return  # nothing measured yet: stay where we are (the top at start)
        plans = self.predict(now_s)
        self.plans = plans
        budget_ttft, budget_tpot = self.budgets()
        here = next((pl for pl in plans if pl.clock_mhz == self.base_mhz), None)
        if here is None or not here.feasible:
            feasible = [pl for pl in plans if pl.feasible]
            self._wanted.clear()
            if feasible:
                choice = min(feasible, key=lambda pl: pl.joules_per_token).clock_mhz
            else:
                choice = self.clocks[-1]
        else:
            # Not needed for the SLOs: only a clear, lasting gain, to a clock predicted well
            # inside the budgets (``down_band``), moves it.
            band = p.down_band
            inside = [
                pl
                for pl in plans
                if pl.ttft_p99_ms <= band * budget_ttft and pl.tpot_p99_ms <= band * budget_tpot
            ]
            best = min(inside, key=lambda pl: pl.joules_per_token, default=here)
            dwelt = now_s >= self._base_since_s + p.dwell_s
            gain = 1.0 - best.joules_per_token / here.joules_per_token
            self._wanted.append(best.clock_mhz if dwelt and gain >= p.min_gain else None)
            recent = list(self._wanted)[-p.confirm_periods :]
            confirmed = len(recent) == p.confirm_periods and None not in recent
            # Of the clocks that looked best in a row, the highest: the safest of them.
            choice = max(c for c in recent if c is not None) if confirmed else self.base_mhz
        self.admission_limit = self._limit(choice, now_s)
        if choice != self.base_mhz:
            self.base_mhz = choice
            self._base_since_s = now_s
            self._wanted.clear()

    def _urgent_clock(self, now_s: float) -> int | None:
        """The lowest clock at which every prompt waiting for its first token still gets it
        within the TTFT budget, in arrival order (seed 003's check at dequeue, for prompts):
        prompt ``j`` is done after the prompt tokens up to it, ``batched_tokens − n`` of them
        per iteration, each iteration also a decode step; a change lands ``change_latency_s``
        later. None when nothing waits."""
        waiting = [s for s in self._streams.values() if s.first_s is None]
        if not waiting:
            return None
        waiting.sort(key=lambda s: s.arrival_s)
        budget_ms = self.budgets()[0]
        n = max(1, len(self._streams))
        per_iteration = max(1, self.params.batched_tokens - n)
        latency_ms = self.params.change_latency_s * 1000.0
        cums = np.cumsum([s.prompt_tokens for s in waiting], dtype=float)
        waited_ms = np.asarray([(now_s - s.arrival_s) * 1000.0 for s in waiting])
        for f in self._candidates():
            if f < self.base_mhz:
                continue
            step_ms = self.steps.predict_ms(f, n)
            token_ms = self._prefill_s_per_token(f) * 1000.0
            done_ms = cums * token_ms + (cums / per_iteration + 1.0) * step_ms
            extra = latency_ms if f != self.clock_mhz else 0.0
            if np.all(waited_ms + extra + done_ms <= budget_ms):
                return f
        return self.clocks[-1]

    def budgets(self) -> tuple[float, float]:
        """The TTFT and TPOT budgets (ms) the plan must fit: SLO × headroom × feedback scale."""
        h = self.params.headroom
        return (
            self.slo.ttft_ms * h * self.ttft_loop.scale,
            self.slo.tpot_ms * h * self.tpot_loop.scale,
        )

    def predict(self, now_s: float) -> list[ClockPlan]:
        """Every candidate clock's predicted p99 tails and energy per token (module
        docstring)."""
        f0, n0 = self.clock_mhz, self._mean_running()
        gap0 = self._gap_model(f0, n0, self._share(f0, now_s))
        done = list(self._done)
        prompts = np.asarray([d.prompt_tokens for d in done if math.isfinite(d.ttft_ratio)])
        ttft_ratios = np.asarray([d.ttft_ratio for d in done if math.isfinite(d.ttft_ratio)])
        tpot_done = [d for d in done if math.isfinite(d.tpot_ratio)]
        tpot_ratios = np.asarray([d.tpot_ratio for d in tpot_done])
        shared = np.asarray([d.shared_tokens for d in tpot_done])
        budget_ttft, budget_tpot = self.budgets()
        top = self.clocks[-1]
        span_s = max(1.0, min(self.params.history_s, now_s - done[0].at_s)) if done else 1.0
        plans = []
        for f in self._candidates():
            share = self._share(f, now_s)
            if share >= 1.0:  # prompts alone would take all of the engine's time
                plans.append(ClockPlan(f, math.inf, math.inf, math.inf, math.inf, False))
                continue
            n = n0
            for _ in range(4):  # sequences live ∝ the gap
                n = min(self.params.max_seqs, n0 * self._gap_model(f, n, share) / gap0)
            # A prompt the clock would make late is boosted (decide): it runs at the top.
            ttft_each = ttft_ratios * self._ttft_model(prompts, f, n, share)
            late = ttft_each > budget_ttft
            if self.params.boost_hold_s > 0 and late.any():
                boosted = ttft_ratios * self._ttft_model(prompts, top, n, self._share(top, now_s))
                latency_ms = self.params.change_latency_s * 1000.0
                ttft_each = np.where(late, boosted + latency_ms, ttft_each)
            ttft = float(np.percentile(ttft_each, 99))
            at_top = min(1.0, float(late.sum()) / span_s * self.params.boost_hold_s)
            joules = (1.0 - at_top) * self._joules_per_token(f, n)
            if at_top > 0:
                joules += at_top * self._joules_per_token(top, n)
            stretch = 1.0
            tpot = float(np.percentile(tpot_ratios * self._tpot_model(shared, f, n, stretch), 99))
            plans.append(
                ClockPlan(
                    clock_mhz=f,
                    ttft_p99_ms=ttft,
                    tpot_p99_ms=tpot,
                    running=n,
                    joules_per_token=joules,
                    feasible=ttft <= budget_ttft and tpot <= budget_tpot,
                )
            )
        return self._calibrated(plans, budget_ttft, budget_tpot)

    def _calibrated(
        self, plans: list[ClockPlan], budget_ttft: float, budget_tpot: float
    ) -> list[ClockPlan]:
        """The plans scaled down to the measured tails: where the p99 the feedback measured
        over its recent window sits under what the history predicts at the clock in force, every
        candidate's prediction is multiplied by their ratio (at least ``calibration_floor``;
        never above 1, so the measured tails only ever take out the model's pessimism)."""
        here = next((pl for pl in plans if pl.clock_mhz == self.clock_mhz), None)
        if here is None or self.params.calibration_floor >= 1.0:
            return plans
        factors = []
        for loop, slo_ms, predicted in (
            (self.ttft_loop, self.slo.ttft_ms, here.ttft_p99_ms),
            (self.tpot_loop, self.slo.tpot_ms, here.tpot_p99_ms),
        ):
            measured = loop.tail_ratio() * slo_ms
            ok = math.isfinite(measured) and math.isfinite(predicted) and predicted > 0
            ratio = measured / predicted if ok else 1.0
            factors.append(min(1.0, max(self.params.calibration_floor, ratio)))
        self.calibration = (factors[0], factors[1])
        if factors == [1.0, 1.0]:
            return plans
        out = []
        for pl in plans:
            ttft, tpot = pl.ttft_p99_ms * factors[0], pl.tpot_p99_ms * factors[1]
            feasible = ttft <= budget_ttft and tpot <= budget_tpot
            out.append(replace(pl, ttft_p99_ms=ttft, tpot_p99_ms=tpot, feasible=feasible))
        return out

    def state(self) -> dict[str, object]:
        """What the policy believes now, for the admin state."""
        ttft_b, tpot_b = self.budgets()
        return {
            "policy": self.name,
            "clock_mhz": self.clock_mhz,
            "admission_limit": self.admission_limit,
            "running": self.running,
            "ttft_budget_ms": round(ttft_b, 3),
            "tpot_budget_ms": round(tpot_b, 3),
            "ttft_scale": round(self.ttft_loop.scale, 4),
            "tpot_scale": round(self.tpot_loop.scale, 4),
            "base_clock_mhz": self.base_mhz,
            "clock_changes": self.changes,
            "boosts": self.boosts,
            "gap_samples": self.steps.samples,
            "measured_j_per_token": {
                clock: round(j / n, 5) for clock, (j, n) in sorted(self._measured.items()) if n
            },
        }

    # -- the model ---------------------------------------------------------------------------

    def _prefill_s_per_token(self, clock_mhz: float) -> float:
        return self._prefill_fit.predict_ms(clock_mhz) / 1000.0 / self.prior.prefill_tokens

    def _prompt_rate(self, now_s: float) -> float:
        """Prompt tokens released per second over ``rate_window_s`` (once per period)."""
        if self._rate is not None and self._rate[0] == now_s:
            return self._rate[1]
        started = now_s if self._started_s is None else self._started_s
        window = self.params.rate_window_s
        span = min(window, max(now_s - started, 1e-9))
        rate = sum(p for at, p in self._prompts if at >= now_s - window) / span
        self._rate = (now_s, rate)
        return rate

    def _share(self, clock_mhz: float, now_s: float | None = None) -> float:
        """``ρ(f)``: the prompt rate (as of ``now_s``, default: the last control period) times
        the prefill time per token at ``clock_mhz``."""
        rate = self._rate[1] if now_s is None and self._rate else 0.0
        if now_s is not None:
            rate = self._prompt_rate(now_s)
        return rate * self._prefill_s_per_token(clock_mhz)

    def _gap_model(self, clock_mhz: float, running: float, share: float) -> float:
        return self.steps.predict_ms(clock_mhz, running) / max(1.0 - share, 0.01)

    def _tpot_model(
        self, shared: float | FloatArray, clock_mhz: float, running: float, stretch: float
    ) -> FloatArray:
        """A stream's TPOT: a decode step plus the prompt tokens run per gap (``shared``, as
        measured, times ``stretch``: the gap's growth, so as many more prompts arrive)."""
        step_ms = self.steps.predict_ms(clock_mhz, running)
        per_token_ms = self._prefill_s_per_token(clock_mhz) * 1000.0
        return step_ms + np.asarray(shared, dtype=float) * stretch * per_token_ms

    def _ttft_model(
        self, prompt_tokens: float | FloatArray, clock_mhz: float, running: float, share: float
    ) -> FloatArray:
        prefill_ms = np.asarray(prompt_tokens, dtype=float) * self._prefill_s_per_token(clock_mhz)
        step_ms = self.steps.predict_ms(clock_mhz, running)
        return (prefill_ms * 1000.0 + step_ms) / max(1.0 - share, 0.01)

    def _candidates(self) -> list[int]:
        stride = self.params.clock_stride
        return sorted(set(self.clocks[::-1][::stride]) | {self.clock_mhz, self.clocks[-1]})

    def _prune(self, now_s: float) -> None:
        horizon = now_s - self.params.window_s
        for q in (self._prompts, self._outputs, self._running_samples):
            while q and q[0][0] < horizon:
                q.popleft()
        while self._done and self._done[0].at_s < now_s - self.params.history_s:
            self._done.popleft()

    def _mean_running(self) -> float:
        """Sequences running, averaged over the window's samples (at least one)."""
        values = [n for _, n in self._running_samples] or [len(self._streams)]
        return max(1.0, float(np.mean(values)))

    def _joules_per_token(self, clock: int, running: float) -> float:
        """Decode energy per token at ``running`` sequences plus the prefill energy each output
        token carries (the window's mean prompt over the prior's prompt, over its mean
        output), from the prior."""
        prior = self.prior
        near = min(prior.prefill_j, key=lambda c: abs(c - clock))
        steps = {b: v[near] for b, v in prior.step_j.items() if near in v}
        step_j = _interp_buckets(steps, running) / max(1.0, running)
        prompts = [p for _, p in self._prompts]
        outputs = [o for _, o in self._outputs]
        mean_prompt = float(np.mean(prompts)) if prompts else prior.prefill_tokens
        mean_output = float(np.mean(outputs)) if outputs else 1.0
        return step_j + prior.prefill_j[near] * mean_prompt / prior.prefill_tokens / mean_output

    def _limit(self, clock: int, now_s: float) -> int:
        """The most sequences whose mean gap at ``clock`` stays within the TPOT SLO × headroom
        (module docstring)."""
        budget = self.slo.tpot_ms * self.params.headroom
        share = self._share(clock, now_s)

        def fits(n: int) -> bool:
            return self._gap_model(clock, n, share) <= budget

        lo, hi = 1, self.params.max_seqs
        if fits(hi):
            return hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo


class TokenClockPolicy(ClockPolicy):
    """:class:`TokenPolicy` as one GPU's clock policy in the scheduler core: its admission limit
    is the release limit of the GPU's stream models, it hears every release, token and end of
    stream, and its control period runs on the core's timer. A GPU that serves an LLM engine
    runs this policy (the engine owns the GPU's clock)."""

    name = "tokens"
    DECIDE_EVERY_S = 0.01  # between periods, tokens check the waiting prompts this often

    def __init__(
        self,
        clocks_mhz: list[int],
        slo: TokenSlo,
        prior: EnginePrior,
        params: TokenPolicyParams | None = None,
    ) -> None:
        super().__init__(clocks_mhz)
        self.tokens = TokenPolicy(clocks_mhz, slo, prior, params)
        self._decided_s = -math.inf

    def initial_clock_mhz(self) -> int | None:
        return self.tokens.clock_mhz

    def release_limit(self, s: SchedulerView, model: str, now_s: float) -> int:
        depth = s.release_depth(model)
        if not s.serving(model).streams:
            return depth
        return min(depth, self.tokens.admission_limit)

    def on_dispatch(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        if s.serving(request.model).streams:
            self.tokens.on_release(request.seq, now_s, request.arrival_s, request.prompt_tokens)
        return self._decide(now_s)

    def on_token(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        self.tokens.on_token(request.seq, now_s)
        if now_s - self._decided_s < self.DECIDE_EVERY_S:
            return None  # a boost for waiting prompts need not be checked at every token
        return self._decide(now_s)

    def _decide(self, now_s: float) -> int | None:
        self._decided_s = now_s
        return self.tokens.decide(now_s)

    def on_complete(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        self.tokens.on_finish(request.seq, now_s)
        return self._decide(now_s)

    def poll(self, s: SchedulerView, now_s: float) -> int | None:
        return self._decide(now_s)

    def wake_at_s(self) -> float | None:
        return self.tokens.wake_at_s()

    def state(self) -> list[dict[str, object]] | None:
        return [self.tokens.state()]
