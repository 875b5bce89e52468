"""Scheduling by tokens: how many sequences to let into an LLM engine, and the GPU clock.

A pure core like :mod:`scheduler.core`: no I/O and no clock of its own. The caller reports what
it sees of each stream (a request released to the engine, every token, the end of a stream, a
reading of the GPU's energy counter), passing the time in; the core answers with an admission
limit (sequences allowed in the engine at once) and the clock to set.

What it measures, per request: the time to first token (TTFT, from arrival at the sidecar) and
the time per output token (TPOT, ``(last token − first token) / (tokens − 1)``, the inter-token
latency of genai-perf and aiperf).

**The engine model.** At clock ``f`` with ``n`` sequences running and prompt tokens arriving at
``λ`` per second:

* the decode step ``s(f, n)`` is learned online (:class:`StepTimeModel`): a gap between two
  tokens of a stream while no prompt waits for its first token is one decode-only iteration;
  per bucket of ``n`` the core fits seed 003's ``t = 1/(m·f + b)`` over clocks to those gaps and,
  at clocks not measured, to the prior (an offline profile of the engine) moved by the live/prior
  ratio. Decode steps are memory-bound: the curves come out nearly flat (large ``b``);
* a prompt token costs ``c(f)``, the prior's prefill time per token (compute-bound, about
  ``1/f``), so prompts take the share ``ρ(f) = λ·c(f)`` of the engine's time;
* the mean gap between tokens is ``g(f, n, λ) = s(f, n) / (1 − ρ(f))``: every iteration is a
  decode step, and prompts stretch them.

**The tail factor.** A stream's TPOT is the mean gap over its life, and streams differ: a short
one that lives through a long prompt's chunks has long gaps. Each finished stream's TPOT is
divided by the model's mean gap over its life (the gap under the clock and load in force,
integrated over time); the ``tail_quantile`` of these ratios is the tail factor ``K``: the p99
TPOT is ``K · g``. The ratios depend on the clock the streams ran at (at a low clock a prompt's
chunk is long against a decode step), so ``K(f)`` is taken over the ``tail_neighbours`` streams
whose mean clocks were nearest ``f``. Before ``min_samples`` streams finished, ``prior_tail``.

**What it decides.**

* Every ``period_s``, the clock the TPOT tail needs: the lowest clock whose predicted p99 TPOT,
  ``K(f) · g(f, n, λ)`` at the running sequences and the prompt rate now (the higher of its
  rates over ``window_s`` and ``short_window_s``: a rising load is seen within seconds), fits
  the budget ``SLO × tpot_share × feedback scale``. The *base clock* follows it, held: a need
  raises it at once, and it comes down only after the need has stayed lower for ``hold_s``, so
  it does not chase single iterations or a few seconds of noise (a clock change takes from a
  millisecond to hundreds of them to land on an NVIDIA GPU) -- but above the static clock a
  need is held only ``rise_s``, and not at all once the static clock is *trusted* (judged on
  ``confident_samples`` streams or more: its p99 then has streams above it, it is not the one
  worst stream of the window).
* The *static clock*: the lowest clock that, held through the lives of the streams that ended
  in the last ``static_window_s`` (and at least the last ``static_min_samples`` of them, however
  long ago they ended), would have kept their ``tail_quantile`` TPOT within the budget. Per
  stream, the TPOT it would have had at each clock is its measured TPOT times the model's mean
  gap over its life at that clock over the model's mean gap at the clocks that ran (the gap at
  every clock integrated over time, at the sequences running and the prompt rate over
  ``window_s``, counted over at least ``short_window_s``: a mean, not the guard against a rising
  load the need takes). It is the best single clock in hindsight over the recent past, as the
  model sees it. A fixed clock absorbs the short spikes of a steady load (a stream's TPOT is a
  mean over its life), and on an engine whose energy per token rises with the clock, following
  each spike up for ``hold_s`` costs more than the fixed clock does; so above the static clock
  a need is held only as long as a spike lasts.
* The *energy floor*: the clock of least energy per output token by the prior's joules, at the
  sequences each clock would hold (a decode step's joules over its sequences, plus the prompts'
  joules per output token). A lower clock is both slower and costlier, so the base never goes
  below it.
* Between periods, a *boost* for waiting prompts: when the prompts waiting for their first token
  would miss the TTFT target at the base clock (seed 003's check at dequeue, applied to prompts:
  each one is done after the prompt tokens queued before it, ``batched_tokens − n`` per
  iteration, each iteration also a decode step), the clock goes to the lowest one that meets
  them, counting the change latency (what is left of it for a change asked for and not yet
  landed), and stays there at least ``boost_hold_s``. The TTFT target
  is ``SLO × ttft_share × feedback scale``. Once the static clock is trusted, a prompt that
  even the top clock, were it in force already, would get late is left out of the plan (its
  tokens still come before the later prompts'): it is lost to the p99 at any clock, and
  planning for it ran the top clock for nothing. Before then (a slow engine, few streams a
  minute) the top clock is kept for it: there a long backlog of late prompts also stretches
  every running stream's gaps. The prompts' time is the prior's, scaled up by what lone
  prompts measured against it (``prefill_factor``, :meth:`TokenPolicy._learn_prefill`).
* The feedback closes the loop on the measured token tails: a
  :class:`scheduler.feedback.ScaleController` per SLO, fed every measured TTFT and TPOT. The TTFT
  one moves the boost target both ways (misses cut it, a tail well under the SLO lets it rise
  past ``ttft_share``); the TPOT one only tightens the budget after misses and lets it recover
  (the tail factor already plans to the SLO). The TPOT loop also keeps its miss budget over
  ``horizon_s`` (10 minutes): a run's p99 is judged over all its streams, and a loop that spends
  each minute's budget in full ends a long run with its p99 on the SLO, over it as often as
  under; misses past the budget over the horizon are a debt that shrinks each minute's
  allowance and stops the budget from easing until it is repaid.
* The admission limit: the most running sequences whose mean gap at the chosen clock stays
  within the TPOT SLO × ``headroom``. Past it every stream would miss on average, so new
  requests wait at the sidecar (their TTFT grows, running streams keep their pace). It guards
  against overload; the tails are the clock's job. So while any request waits there, the base
  goes to the lowest clock whose limit lets them all in (the top where none does): without
  this, a clock low enough for the streams already running kept the rest out while their TTFT
  grew, and the engine served fewer tokens a second than arrived.

What the GPU's energy counter measured per clock (:meth:`TokenPolicy.on_energy`, from the
scheduler core live and from the simulator) is kept for the admin state, not used to decide:
between clocks measured at different loads it compares the loads as much as the clocks (the
energy floor uses the offline profile's joules instead).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scheduler.feedback import ScaleController, ScaleParams
from scheduler.policies import ClockPolicy
from scheduler.view import QueuedRequest, SchedulerView
from time2clock.fit import fit_inverse_linear
from time2clock.online import curve_is_sound
from time2clock.table import InverseLinearFit, TableError

FloatArray = npt.NDArray[np.float64]
GAP_CAP_MS = 1e6
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

    period_s: float = 0.25
    hold_s: float = 5.0  # the base clock is the highest need over this long
    rise_s: float = 1.0  # above the static clock, only a need held this long raises the base
    static_window_s: float = 60.0  # the static clock is judged on the streams that ended here
    static_min_samples: int = 100  # and on at least this many (before, no static clock)
    confident_samples: int = 200  # a static clock judged on this many streams is trusted
    window_s: float = 20.0  # the prompt rate's window
    short_window_s: float = 5.0  # and its short one: a rising load is seen within it
    tail_quantile: float = 0.99  # the SLOs hold at the p99 of requests
    tail_samples: int = 2000  # streams whose TPOT ratio to the model is kept
    tail_neighbours: int = 200  # K(f) is over the streams whose clocks were nearest f
    min_samples: int = 50  # before this many ratios, the tail factor is prior_tail
    prior_tail: float = 1.8  # p99 TPOT over the model's mean gap, assumed until measured
    tpot_share: float = 0.96  # the TPOT budget: SLO × this × feedback scale
    ttft_share: float = 0.95  # the waiting prompts' TTFT target: SLO × this × feedback scale
    boost_hold_s: float = 0.0  # a boost for waiting prompts lasts at least this long
    max_share: float = 0.97  # prompts cannot take more of the engine's time than this
    headroom: float = 0.9  # the admission limit keeps the mean gap within SLO × this
    batched_tokens: int = 2048  # the engine's tokens per iteration (its own setting)
    change_latency_s: float = 0.05  # how long a clock change takes to land (the GPU's)
    prefill_samples: int = 100  # lone prompts' measured/predicted times kept for the factor
    min_prefill_samples: int = 20  # before this many, the prompts' times are the prior's
    settle_s: float = 0.3  # gaps this soon after a clock request are not learned from
    gap_cap: int = 400  # gaps kept per (bucket, clock)
    min_gap_samples: int = 20
    max_seqs: int = 256
    ttft_feedback: ScaleParams = field(
        default_factory=lambda: ScaleParams(
            setpoint=0.9, window_s=60.0, max_samples=1000, min_samples=100, max_step=0.05,
            backoff=0.9, backoff_gap_s=2.0, settle_s=5.0, min_scale=0.8, max_scale=1 / 0.95,
        )
    )  # fmt: skip
    tpot_feedback: ScaleParams = field(
        default_factory=lambda: ScaleParams(
            setpoint=0.97, window_s=60.0, max_samples=1000, min_samples=100, max_step=0.05,
            backoff=0.95, backoff_gap_s=2.0, settle_s=5.0, min_scale=0.7, max_scale=1.0,
            horizon_s=600.0,
        )
    )  # fmt: skip

    def __post_init__(self) -> None:
        windows = (self.period_s, self.window_s, self.short_window_s)
        if min(windows) <= 0 or self.hold_s < 0:
            raise ValueError("period_s and the windows must be > 0, hold_s >= 0")
        if not 0.5 <= self.tail_quantile < 1:
            raise ValueError(f"tail_quantile must be in [0.5, 1), got {self.tail_quantile}")
        if self.confident_samples < self.static_min_samples:
            raise ValueError("confident_samples must be >= static_min_samples")
        if min(self.tail_samples, self.tail_neighbours, self.min_samples, self.max_seqs) < 1:
            raise ValueError("tail_samples, tail_neighbours, min_samples and max_seqs must be >= 1")
        if self.prior_tail < 1:
            raise ValueError(f"prior_tail must be >= 1 (a p99 over a mean), got {self.prior_tail}")
        for name in ("tpot_share", "ttft_share", "headroom"):
            value = getattr(self, name)
            if not 0 < value <= 1.5:
                raise ValueError(f"{name} must be in (0, 1.5], got {value}")
        if self.headroom > 1:
            raise ValueError(f"headroom must be in (0, 1], got {self.headroom}")
        if not 0 < self.max_share < 1:
            raise ValueError(f"max_share must be in (0, 1), got {self.max_share}")
        if self.batched_tokens < 2 or self.boost_hold_s < 0 or self.change_latency_s < 0:
            raise ValueError("batched_tokens must be >= 2, boost_hold_s and change_latency_s >= 0")
        if not 1 <= self.min_prefill_samples <= self.prefill_samples:
            raise ValueError("need 1 <= min_prefill_samples <= prefill_samples")


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
    gap_at_first: float = 0.0  # the model's gap integral (ms·s) at its first token
    clock_at_first: float = 0.0  # the clock integral (MHz·s) at its first token
    fixed_at_first: FloatArray | None = None  # the per-clock gap integrals at its first token
    predicted_ms: float | None = None  # a lone prompt's first token after release, predicted


@dataclass(frozen=True)
class ClockPlan:
    """One candidate clock's prediction (for the admin state and the tests)."""

    clock_mhz: int
    tail_factor: float
    gap_ms: float
    tpot_p99_ms: float
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
        self.ttft_loop = ScaleController(self.params.ttft_feedback)
        self.tpot_loop = ScaleController(self.params.tpot_feedback)
        prefill = _fit_or_flat(dict(prior.prefill_ms), self.clocks)
        if prefill is None:
            raise ValueError("the prior has no prefill measurements")
        self._prefill_fit = prefill
        self._prefill_at: dict[int, float] = {}  # clock -> ms per prompt token
        # A lone prompt's measured time to its first token over the model's prediction
        self._prefill_ratios: deque[float] = deque(maxlen=self.params.prefill_samples)
        self._prefill_median: float | None = None  # of those ratios
        self.clock_mhz = self.clocks[-1]  # the clock asked for last (the top until told)
        self._clock_since_s = -math.inf
        self.base_mhz = self.clocks[-1]  # the clock the TPOT tail needs, held
        self.need_mhz = self.clocks[-1]  # this period's need
        self._needs: deque[tuple[float, int]] = deque()
        self.static_mhz: int | None = None  # the static clock the recent tails allow
        self._fixed_tpots: deque[tuple[float, FloatArray]] = deque()
        self._static_samples = 0  # the streams the static clock was judged on
        self._gap_vec = np.zeros(len(self.clocks))  # the model's gap at every clock (ms)
        self._clock_index = {f: i for i, f in enumerate(self.clocks)}
        self._energy_clocks = sorted(
            set(prior.prefill_j).intersection(*(js.keys() for js in prior.step_j.values()))
            & set(self.clocks)
        )
        self.floor_mhz = self.clocks[0]  # below it, lower clocks cost more energy (and time)
        self._fixed_integral = np.zeros(len(self.clocks))
        self._boost: tuple[int, float] = (0, -math.inf)  # (clock, held until)
        self.boosts = 0
        self.changes = 0
        self._last_period_s: float | None = None
        self._started_s: float | None = None
        self._streams: dict[int, _Stream] = {}
        self._waiting = 0  # released streams without their first token
        self._prefill_free_since_s = -math.inf  # since when none has been waiting
        self._prompts: deque[tuple[float, int]] = deque()
        self._rate = 0.0  # prompt tokens/s as of the last period
        # Integrals over time of the model's gap at the clock in force (ms·s) and of the clock
        # (MHz·s): a stream's mean of each over its life is a difference of two readings.
        self._integral_s = 0.0
        self._gap_integral = 0.0
        self._clock_integral = 0.0
        self._gap_now_ms = 0.0
        self._ratios: deque[tuple[float, float]] = deque(maxlen=self.params.tail_samples)
        self._tail_cache: dict[int, float] = {}
        self._energy: tuple[float, float, int, int] | None = None  # (at_s, J, tokens, clock)
        self._tokens_total = 0
        self._measured: dict[int, tuple[float, int]] = {}  # clock -> (J, output tokens)
        self.admission_limit = self.params.max_seqs
        self.held = 0  # requests waiting at the sidecar for a place in the engine

    # -- what the caller reports ------------------------------------------------------------

    def on_held(self, count: int) -> None:
        """How many requests wait at the sidecar for a place in the engine (held by the
        admission limit); told before each decision."""
        self.held = max(0, count)

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
        self._advance(now_s)
        stream = _Stream(now_s, arrival_s, prompt_tokens)
        if self._waiting <= 0 and self._landed(now_s):
            # Alone in the prefill, at a clock that has landed: its time to a first token is
            # the model's for its own tokens, to learn the engine's speed from.
            lone = self._prefill_model(np.asarray([prompt_tokens], float))
            stream.predicted_ms = float(lone(self.clock_mhz)[0])
        self._streams[request_id] = stream
        self._prompts.append((now_s, prompt_tokens))
        self._waiting += 1
        self._prefill_free_since_s = math.inf

    def on_token(self, request_id: int, now_s: float) -> None:
        """A token of the request's stream went by."""
        s = self._streams.get(request_id)
        if s is None:
            return
        s.tokens += 1
        self._tokens_total += 1
        if s.first_s is None:
            self._advance(now_s)
            s.first_s = now_s
            s.gap_at_first = self._gap_integral
            s.clock_at_first = self._clock_integral
            s.fixed_at_first = self._fixed_integral.copy()
            self.ttft_loop.observe(now_s, (now_s - s.arrival_s) * 1000.0, self.slo.ttft_ms)
            self._prefill_done(now_s)
            if s.predicted_ms is not None and self._clock_since_s <= s.released_s:
                self._learn_prefill((now_s - s.released_s) * 1000.0 / s.predicted_ms)
        elif (
            s.last_s is not None
            and self._prefill_free_since_s <= s.last_s
            and s.last_s >= self._clock_since_s + self.params.settle_s
        ):
            # No prompt was in the engine over this gap: one decode-only iteration.
            self.steps.observe(self.clock_mhz, len(self._streams), (now_s - s.last_s) * 1000.0)
        s.last_s = now_s

    def on_finish(self, request_id: int, now_s: float) -> None:
        """The stream ended (its last token was reported) or its client went away."""
        s = self._streams.pop(request_id, None)
        if s is None:
            return
        self._advance(now_s)
        if s.first_s is None:
            self._prefill_done(now_s)  # went away before its first token
            return
        if s.last_s is None or s.tokens < 2 or s.last_s <= s.first_s:
            return
        life_s = s.last_s - s.first_s
        tpot_ms = life_s * 1000.0 / (s.tokens - 1)
        self.tpot_loop.observe(now_s, tpot_ms, self.slo.tpot_ms)
        # The integrals run to now; the stream's life ended at its last token (now, for the
        # streams the engine ends; earlier only for one whose end is reported late).
        mean_gap_ms = (self._gap_integral - s.gap_at_first) / max(now_s - s.first_s, 1e-9)
        mean_clock = (self._clock_integral - s.clock_at_first) / max(now_s - s.first_s, 1e-9)
        if mean_gap_ms > 0 and math.isfinite(mean_gap_ms):
            self._ratios.append((mean_clock, tpot_ms / mean_gap_ms))
            if s.fixed_at_first is not None:
                life = max(now_s - s.first_s, 1e-9)
                fixed = (self._fixed_integral - s.fixed_at_first) / life
                if np.all(np.isfinite(fixed)):
                    self._fixed_tpots.append((now_s, fixed * (tpot_ms / mean_gap_ms)))

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
        self._advance(now_s)
        self.clock_mhz = target
        self._clock_since_s = now_s
        self._gap_now_ms = self._gap_model(target, len(self._streams), self._rate, learned=False)
        self.changes += 1
        return target

    def _period(self, now_s: float) -> None:
        """The control period: the base clock and the admission limit (module docstring)."""
        p = self.params
        self._last_period_s = now_s
        self._advance(now_s)
        self._rate = self._prompt_rate(now_s)
        running = len(self._streams)
        self._gap_now_ms = self._gap_model(self.clock_mhz, running, self._rate, learned=False)
        gaps, counts = self._gap_vector(running, self._rate)
        self.floor_mhz = self._energy_floor(gaps, counts, self._rate) if running else self.clocks[0]
        # The static clock's gaps: at the sequences running now (see _gap_vector) and the prompt
        # rate over the long window. The need's higher of two rates guards against a rising
        # load; integrated over a stream's life it would count every short burst as lasting.
        self._gap_vec = self._gap_vector(
            running, self._prompt_rate(now_s, short=False), littles=False
        )[0]
        self._tail_cache.clear()
        self.need_mhz = self._tpot_clock(running, self._rate)
        self.static_mhz = self._static_clock(now_s)
        self._needs.append((now_s, self.need_mhz))
        while self._needs[0][0] < now_s - max(p.hold_s, p.rise_s):
            self._needs.popleft()
        held = max(need for at, need in self._needs if at >= now_s - p.hold_s)
        if self.static_mhz is None or held <= self.static_mhz:
            self.base_mhz = held
        else:
            # Above the static clock the need is held only rise_s (not at all once the static
            # clock is trusted): a static clock would have absorbed a spike's streams too, so
            # the base falls back to it soon.
            rise_s = 0.0 if self._confident() else p.rise_s
            recent = max(need for at, need in self._needs if at >= now_s - rise_s)
            self.base_mhz = max(self.static_mhz, recent)
        self.base_mhz = max(self.base_mhz, self.floor_mhz)
        if self.held:
            # The engine is full at this clock and requests wait for it at the sidecar, their
            # TTFT growing: a faster clock admits more (the mean gap stays within the SLO with
            # more sequences), so the base goes to the lowest one that admits them all.
            self.base_mhz = self._admitting_clock(running + self.held)
        self.admission_limit = self._limit(self.base_mhz)

    def _confident(self) -> bool:
        """Whether the static clock is judged on ``confident_samples`` streams or more (a p99
        with at least two streams above it, not a single worst one)."""
        return self.static_mhz is not None and self._static_samples >= self.params.confident_samples

    def _static_clock(self, now_s: float) -> int | None:
        """The lowest clock that, held through the lives of the streams that ended in the last
        ``static_window_s``, would have kept their ``tail_quantile`` TPOT within the budget
        (module docstring); None before ``static_min_samples`` of them."""
        p = self.params
        # The window keeps at least static_min_samples streams: on a slow engine (an A100 at a
        # third of its capacity ends fewer than 100 streams a minute) a window in time alone
        # would never hold enough, and the static clock would never be known.
        while (
            len(self._fixed_tpots) > p.static_min_samples
            and self._fixed_tpots[0][0] < now_s - p.static_window_s
        ):
            self._fixed_tpots.popleft()
        self._static_samples = len(self._fixed_tpots)
        if len(self._fixed_tpots) < p.static_min_samples:
            return None
        tails = np.quantile(np.stack([v for _, v in self._fixed_tpots]), p.tail_quantile, axis=0)
        fits = np.flatnonzero(tails <= self.budgets()[1])
        return self.clocks[int(fits[0])] if fits.size else self.clocks[-1]

    def _gap_vector(
        self, running: int, rate: float, *, littles: bool = True
    ) -> tuple[FloatArray, FloatArray]:
        """The model's mean gap (ms, the prior's step) at every clock of the ladder, each with
        the sequences that clock would hold: by Little's law the running count grows as the
        gap does, from ``running`` at the clock in force (``littles=False``: ``running`` at
        every clock). Returns the gaps and the counts.

        The energy floor needs the counts (a slower clock amortises each step's weights over
        more sequences). The static clock's counterfactual TPOTs do not take them: a stream's
        tail TPOT is mostly the prompt chunks it lived through, which more sequences do not
        lengthen, and the count's growth iterated to its fixed point makes a clock a little
        under the one that ran look far slower than a clock held there measures, which put
        the static clock above the best fixed one.
        """
        here = self._gap_model(self.clock_mhz, running, rate, learned=False)
        out = np.empty(len(self.clocks))
        counts = np.empty(len(self.clocks))
        for i, f in enumerate(self.clocks):
            n = float(max(1, running))
            gap = self._gap_model(f, n, rate, learned=False)
            if littles and running > 0 and math.isfinite(here) and here > 0:
                for _ in range(3):
                    if not math.isfinite(gap):
                        break
                    n = max(1.0, running * gap / here)
                    gap = self._gap_model(f, n, rate, learned=False)
            out[i] = min(gap, GAP_CAP_MS)  # a clock that cannot keep up: finite, far past any SLO
            counts[i] = n
        return out, counts

    def _energy_floor(self, gaps: FloatArray, counts: FloatArray, rate: float) -> int:
        """The clock below which every clock costs more energy per output token and is slower
        (module docstring): the least of the prior's energy per output token, a decode step's
        joules over its sequences plus the prompts' joules per output token, at the sequences
        each clock would hold; the bottom clock when nothing runs."""
        best, best_j = self.clocks[0], math.inf
        for f in self._energy_clocks:
            i = self._clock_index[f]
            gap_ms, n = float(gaps[i]), float(counts[i])
            if not (gap_ms < GAP_CAP_MS and n > 0):
                continue
            step_j = _interp_buckets({b: js[f] for b, js in self.prior.step_j.items()}, n)
            per_prompt_token_j = self.prior.prefill_j[f] / self.prior.prefill_tokens
            prompt_j = rate * gap_ms / 1000.0 / n * per_prompt_token_j
            joules = step_j / n + prompt_j
            if joules < best_j:
                best, best_j = f, joules
        return best

    def _tpot_clock(self, running: int, rate: float) -> int:
        """The lowest clock whose predicted p99 TPOT fits the budget (the top if none does)."""
        budget = self.budgets()[1]
        for f in self.clocks:
            if self.tail_factor(f) * self._gap_model(f, running, rate, learned=False) <= budget:
                return f
        return self.clocks[-1]

    def _urgent_clock(self, now_s: float) -> int | None:
        """The lowest clock, from the base up, at which every prompt waiting for its first token
        still gets it within the TTFT target, in arrival order (seed 003's check at dequeue, for
        prompts): prompt ``j`` is done after the prompt tokens up to it, ``batched_tokens − n``
        of them per iteration, each iteration also a decode step; a change lands
        ``change_latency_s`` later. None when nothing waits; the top when no clock makes it."""
        if self._waiting <= 0:
            return None
        waiting = sorted(
            (s for s in self._streams.values() if s.first_s is None), key=lambda s: s.arrival_s
        )
        if not waiting:
            return None
        target_ms = self.budgets()[0]
        latency_ms = self.params.change_latency_s * 1000.0
        cums = np.cumsum([s.prompt_tokens for s in waiting], dtype=float)
        waited_ms = np.asarray([(now_s - s.arrival_s) * 1000.0 for s in waiting])
        # The clock asked for last may not have landed yet: only the rest of its latency counts.
        landing_ms = max(0.0, (self._clock_since_s - now_s) * 1000.0 + latency_ms)
        model_ms, factor = self._prefill_model(cums), self.prefill_factor

        def finish_ms(f: int, *, landed: bool = False) -> FloatArray:
            done_ms = model_ms(f) * factor
            extra = 0.0 if landed else landing_ms if f == self.clock_mhz else latency_ms
            return np.asarray(waited_ms + extra + done_ms)

        savable = np.ones(len(waiting), dtype=bool)
        if self._confident():
            # A prompt that even the top clock, already landed, gets late is lost to the p99
            # whatever the clock: plan for the others (its tokens still come before theirs).
            # Landed: one late only for the change's latency is not given up (where changes
            # are slow, that would give up a good share of the prompts).
            savable = finish_ms(self.clocks[-1], landed=True) <= target_ms
            if not np.any(savable):
                return None
        start = bisect.bisect_left(self.clocks, self.base_mhz)
        for f in self.clocks[start:]:
            if np.all(finish_ms(f)[savable] <= target_ms):
                return f
        return self.clocks[-1]

    def budgets(self) -> tuple[float, float]:
        """The TTFT target for waiting prompts and the TPOT budget of the p99 (ms)."""
        p = self.params
        return (
            self.slo.ttft_ms * p.ttft_share * self.ttft_loop.scale,
            self.slo.tpot_ms * p.tpot_share * self.tpot_loop.scale,
        )

    def tail_factor(self, clock_mhz: float) -> float:
        """``K(f)``: the ``tail_quantile`` of the finished streams' TPOT over the model's mean
        gap, over the ``tail_neighbours`` whose mean clocks were nearest ``clock_mhz``
        (``prior_tail`` before ``min_samples``). Cached per control period on a 60-MHz grid."""
        p = self.params
        if len(self._ratios) < p.min_samples:
            return p.prior_tail
        cell = int(clock_mhz // 60)
        cached = self._tail_cache.get(cell)
        if cached is not None:
            return cached
        data = np.asarray(self._ratios, dtype=float)
        ratios = data[:, 1]
        if len(data) > p.tail_neighbours:
            distance = np.abs(data[:, 0] - (cell * 60 + 30))
            ratios = ratios[np.argpartition(distance, p.tail_neighbours)[: p.tail_neighbours]]
        value = max(1.0, float(np.quantile(ratios, p.tail_quantile)))
        self._tail_cache[cell] = value
        return value

    def predict(self, now_s: float) -> list[ClockPlan]:
        """Every clock's predicted p99 TPOT at the running sequences and prompt rate now."""
        rate = self._prompt_rate(now_s)
        running = len(self._streams)
        budget = self.budgets()[1]
        plans = []
        for f in self.clocks:
            k, gap = self.tail_factor(f), self._gap_model(f, running, rate, learned=False)
            plans.append(ClockPlan(f, k, gap, k * gap, k * gap <= budget))
        return plans

    def state(self) -> dict[str, object]:
        """What the policy believes now, for the admin state."""
        ttft_b, tpot_b = self.budgets()
        return {
            "policy": self.name,
            "clock_mhz": self.clock_mhz,
            "base_clock_mhz": self.base_mhz,
            "need_clock_mhz": self.need_mhz,
            "static_clock_mhz": self.static_mhz,
            "static_samples": self._static_samples,
            "static_trusted": self._confident(),
            "energy_floor_mhz": self.floor_mhz,
            "admission_limit": self.admission_limit,
            "held": self.held,
            "running": self.running,
            "waiting_prompts": self._waiting,
            "prompt_tokens_per_s": round(self._rate, 1),
            "prefill_factor": round(self.prefill_factor, 4),
            "prefill_ratio": (
                None if self._prefill_median is None else round(self._prefill_median, 4)
            ),
            "prefill_samples": len(self._prefill_ratios),
            "tail_factor": round(self.tail_factor(self.clock_mhz), 4),
            "tail_samples": len(self._ratios),
            "ttft_target_ms": round(ttft_b, 3),
            "tpot_budget_ms": round(tpot_b, 3),
            "ttft_scale": round(self.ttft_loop.scale, 4),
            "tpot_scale": round(self.tpot_loop.scale, 4),
            "tpot_debt": round(self.tpot_loop.debt, 2),
            "clock_changes": self.changes,
            "boosts": self.boosts,
            "gap_samples": self.steps.samples,
            "measured_j_per_token": {
                clock: round(j / n, 5) for clock, (j, n) in sorted(self._measured.items()) if n
            },
        }

    # -- the model ---------------------------------------------------------------------------

    def _advance(self, now_s: float) -> None:
        """Run the gap and clock integrals up to ``now_s``."""
        dt = now_s - self._integral_s
        if dt > 0:
            self._gap_integral += self._gap_now_ms * dt
            self._clock_integral += self.clock_mhz * dt
            self._fixed_integral += self._gap_vec * dt
            self._integral_s = now_s

    def _prefill_done(self, now_s: float) -> None:
        self._waiting -= 1
        if self._waiting <= 0:
            self._waiting = 0
            self._prefill_free_since_s = now_s

    def _prefill_ms_per_token(self, clock_mhz: int) -> float:
        value = self._prefill_at.get(clock_mhz)
        if value is None:
            value = self._prefill_fit.predict_ms(clock_mhz) / self.prior.prefill_tokens
            self._prefill_at[clock_mhz] = value
        return value

    def _prefill_model(self, cum_tokens: FloatArray) -> Callable[[int], FloatArray]:
        """The model's time (ms), per clock, until prompts whose tokens, with those queued before
        them in the engine, add up to ``cum_tokens`` get their first token: the prompt tokens at
        the prior's time per token, ``batched_tokens − n`` of them per iteration, and each
        iteration also a decode step of the running sequences. What does not depend on the
        clock is computed once, for a search over the ladder."""
        n = max(1, len(self._streams))
        iterations = cum_tokens / max(1, self.params.batched_tokens - n) + 1.0

        def at(clock_mhz: int) -> FloatArray:
            step_ms = self.steps.predict_ms(clock_mhz, n)
            return np.asarray(
                cum_tokens * self._prefill_ms_per_token(clock_mhz) + iterations * step_ms
            )

        return at

    @property
    def prefill_factor(self) -> float:
        """What the prompts' time model is scaled by (:meth:`_learn_prefill`)."""
        if (
            self._prefill_median is None
            or len(self._prefill_ratios) < self.params.min_prefill_samples
        ):
            return 1.0
        return max(1.0, self._prefill_median)

    def _landed(self, now_s: float) -> bool:
        """Whether the clock asked for last has had the change latency to land."""
        return now_s >= self._clock_since_s + self.params.change_latency_s

    def _learn_prefill(self, ratio: float) -> None:
        """A lone prompt's measured time to its first token over the model's: once
        ``min_prefill_samples`` are in, the prompts' time model is scaled up by the median of
        the last ``prefill_samples`` where that is over 1 (an engine slower than its offline
        profile: another host, model or engine version). Never down: the model adds a
        prompt's time and a decode step's, each profiled alone with its own fixed costs (the
        host's work, reading the weights), where an iteration doing both pays them once, so it
        over-predicts a little, and that margin is the boost's against the prompts it does not
        see yet."""
        if not (ratio > 0 and math.isfinite(ratio)):
            return
        self._prefill_ratios.append(ratio)
        self._prefill_median = float(np.median(self._prefill_ratios))

    def _prompt_rate(self, now_s: float, *, short: bool = True) -> float:
        """Prompt tokens released per second: the higher of the rates over ``window_s`` and
        over ``short_window_s`` (each over the time since the first release, if shorter); the
        rate over ``window_s`` alone where ``short`` is False."""
        p = self.params
        while self._prompts and self._prompts[0][0] < now_s - p.window_s:
            self._prompts.popleft()
        if self._started_s is None:
            return 0.0
        elapsed = max(now_s - self._started_s, p.period_s)
        long_tokens = sum(tokens for _, tokens in self._prompts)
        short_from = now_s - p.short_window_s
        short_tokens = sum(tokens for at, tokens in self._prompts if at >= short_from)
        # The long rate counts at least short_window_s: at the start a few arrivals over a
        # fraction of a second are not a rate, and the static clock's integrals (which take
        # the long rate alone) would charge every early stream a clock that cannot keep up at
        # all but the top ones for its whole life (the short rate still sees them at once).
        long_rate = long_tokens / min(p.window_s, max(elapsed, p.short_window_s))
        if not short:
            return long_rate
        return max(long_rate, short_tokens / min(p.short_window_s, elapsed))

    def _gap_model(
        self, clock_mhz: int, running: float, rate: float, *, learned: bool = True
    ) -> float:
        """``g(f, n, λ)``: the mean gap between tokens (ms), with the learned decode step or,
        ``learned=False``, the prior's (the fixed reference the tail factor is measured
        against); inf where prompts would take more than ``max_share`` of the engine's time."""
        share = rate * self._prefill_ms_per_token(clock_mhz) / 1000.0
        if share >= self.params.max_share:
            return math.inf
        n = max(1.0, running)
        step_ms = (
            self.steps.predict_ms(clock_mhz, n) if learned else self.steps.prior_ms(clock_mhz, n)
        )
        return step_ms / (1.0 - share)

    def _admitting_clock(self, sequences: int) -> int:
        """The lowest clock from the base up whose admission limit lets ``sequences`` run (the
        top where none does)."""
        start = bisect.bisect_left(self.clocks, self.base_mhz)
        for f in self.clocks[start:]:
            if self._limit(f) >= sequences:
                return f
        return self.clocks[-1]

    def _limit(self, clock: int) -> int:
        """The most sequences whose mean gap at ``clock`` stays within the TPOT SLO × headroom
        (module docstring)."""
        budget = self.slo.tpot_ms * self.params.headroom

        def fits(n: int) -> bool:
            return self._gap_model(clock, n, self._rate) <= budget

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
        return self._decide(s, now_s)

    def on_token(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        self.tokens.on_token(request.seq, now_s)
        if now_s - self._decided_s < self.DECIDE_EVERY_S:
            return None  # a boost for waiting prompts need not be checked at every token
        return self._decide(s, now_s)

    def _decide(self, s: SchedulerView, now_s: float) -> int | None:
        self._decided_s = now_s
        # Requests the admission limit holds: a model whose own release depth is full would
        # hold them at any clock.
        held = sum(
            n
            for m, n in s.queued_by_model().items()
            if s.serving(m).streams and s.inflight_count(m) < s.release_depth(m)
        )
        self.tokens.on_held(held)
        return self.tokens.decide(now_s)

    def on_complete(self, s: SchedulerView, request: QueuedRequest, now_s: float) -> int | None:
        self.tokens.on_finish(request.seq, now_s)
        return self._decide(s, now_s)

    def poll(self, s: SchedulerView, now_s: float) -> int | None:
        return self._decide(s, now_s)

    def on_energy(self, now_s: float, energy_j: float) -> None:
        self.tokens.on_energy(now_s, energy_j)

    def wake_at_s(self) -> float | None:
        return self.tokens.wake_at_s()

    def state(self) -> list[dict[str, object]] | None:
        return [self.tokens.state()]
