"""Profile an LLM engine per clock: what ``--policy tokens`` starts from (an :class:`EnginePrior`).

Seed 003's sweep, for a generative engine: lock each clock in turn and measure, through the
engine's own streaming endpoint (Triton's ``generate_stream`` or an OpenAI-compatible
``/v1/completions`` or ``/v1/chat/completions``, as :mod:`loadgen.stream` drives them):

* **a decode step of ``n`` sequences**, per bucket ``n``: ``n`` streams sent at once, each with
  the same short prompt and a fixed number of output tokens. Once the last of them has its first
  token every prompt is in and, until the first of them ends, every iteration of the engine is
  one decode step of all ``n``: a stream's mean gap between tokens in that stretch is the step's
  time, and the GPU's energy counter over the stretch, divided by the steps in it, the step's
  joules;
* **a prompt's prefill**: one prompt of ``prefill_tokens`` at a time on an idle engine, asking
  for one token; its time to first token, and the counter over that time.

The counter is read every ``poll_s`` while the sweep runs and interpolated at the stretch's ends,
since a stream's tokens are stamped by the client and the counter refreshes on its own period.
The clock is given back to the GPU's own control at the end, whatever happens. The result is
kept as a JSON file (:func:`save_engine_profile`) that the sidecar reads with
``--engine-profile`` (:func:`load_engine_profile`).

A profile is of one engine, model and GPU: the token policy learns the decode step online and
scales the prompts' time by what it measures, so a profile need not be exact, but its shape over
clocks and its joules are what the policy plans with until then (its energy floor, always).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dvfs.device import Device
from scheduler.tokens import SEQ_BUCKETS, EnginePrior
from time2clock.profile import MeasureError

if TYPE_CHECKING:
    from loadgen.stream import GenTarget

# Tries of a decode run whose streams did not all decode at once before the sweep gives up:
# on a busy host (the sidecar's start, with Triton still loading its other models) the streams
# of the first large run can start too far apart to overlap.
OVERLAP_TRIES = 3
PROFILE_KIND = "engine-profile"
PROFILE_VERSION = 1
ProgressFn = Callable[[int, int], None]


class EngineProfileError(ValueError):
    """An engine profile file that cannot be used (named, with what is wrong)."""


@dataclass(frozen=True)
class EngineSweepSettings:
    """What the sweep sends. Lengths are in the prompt's words: the embedded engine counts them
    as tokens, and the sidecar estimates a prompt's length at its edge the same way, so the
    profile's time per prompt token is in the unit the policy sees live."""

    buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)  # sequences decoding at once
    prompt_tokens: int = 256  # each decode run's prompts
    output_tokens: int = 64  # each decode run's streams' length
    prefill_tokens: int = 1024  # the lone prompts timed for the prefill
    prefill_repeats: int = 5  # lone prompts per clock
    settle_s: float = 0.5  # after each clock is locked, before measuring
    poll_s: float = 0.01  # how often the energy counter is read

    def __post_init__(self) -> None:
        if (
            not self.buckets
            or min(self.buckets) < 1
            or list(self.buckets) != sorted(set(self.buckets))
        ):
            raise ValueError(f"buckets must be increasing counts >= 1, got {list(self.buckets)}")
        if self.output_tokens < 8:
            raise ValueError(
                f"output tokens must be >= 8 (a decode stretch needs tokens), got "
                f"{self.output_tokens}"
            )
        if min(self.prompt_tokens, self.prefill_tokens, self.prefill_repeats) < 1:
            raise ValueError("prompt tokens, prefill tokens and prefill repeats must be >= 1")
        if self.settle_s < 0 or self.poll_s <= 0:
            raise ValueError("settle_s must be >= 0 and poll_s > 0")


class EnergyCounter(Protocol):
    """What the sampler reads: a GPU's energy counter (a :class:`dvfs.device.Device`)."""

    def energy_j(self) -> float: ...


class EnergySampler:
    """Reads ``device``'s energy counter every ``poll_s`` on the running event loop, stamped
    with ``clock``; :meth:`between` interpolates it at any two moments of the sweep."""

    def __init__(
        self,
        device: EnergyCounter,
        poll_s: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.device = device
        self.poll_s = poll_s
        self.clock = clock
        self.times_s: list[float] = []
        self.joules: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def read(self) -> None:
        self.times_s.append(self.clock())
        self.joules.append(self.device.energy_j())

    async def _run(self) -> None:
        while True:
            self.read()
            await asyncio.sleep(self.poll_s)

    async def __aenter__(self) -> EnergySampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def between(self, t0_s: float, t1_s: float) -> float:
        """Joules the counter counted from ``t0_s`` to ``t1_s`` (linear between readings)."""
        self.read()  # a reading at or after t1 (the sweep asks once the stretch is over)
        at = np.interp([t0_s, t1_s], self.times_s, self.joules)
        return float(at[1] - at[0])


@dataclass(frozen=True)
class DecodeStretch:
    """Where every stream of a decode run was decoding: ``t0_s``..``t1_s`` (the client's
    clock), the mean gap between two tokens of a stream in it (one decode step), and how many
    steps it held."""

    t0_s: float
    t1_s: float
    step_ms: float
    steps: float


def decode_stretch(token_times_s: Sequence[Sequence[float]]) -> DecodeStretch | None:
    """The stretch of a decode run from the last stream's first token to the first stream's
    last one (None: there is none, as when the engine did not run the streams at once). A
    stream's gap is its mean over the stretch (first to last of its tokens in it), so tokens
    that reach the client bunched together do not bias it."""
    if not token_times_s or any(len(times) < 2 for times in token_times_s):
        return None
    t0 = max(times[0] for times in token_times_s)
    t1 = min(times[-1] for times in token_times_s)
    gaps = []
    for times in token_times_s:
        inside = [t for t in times if t0 <= t <= t1]
        if len(inside) >= 3:
            gaps.append((inside[-1] - inside[0]) / (len(inside) - 1))
    if len(gaps) < len(token_times_s) or t1 <= t0:
        return None
    gap_s = float(np.mean(gaps))
    if not gap_s > 0:
        return None
    return DecodeStretch(t0, t1, gap_s * 1000.0, (t1 - t0) / gap_s)


@dataclass
class EngineSweep:
    """What a sweep measured, per clock: each bucket's decode step (ms, J) and the stretch's
    steps; the lone prompts' times to first token (ms) and joules."""

    settings: EngineSweepSettings
    step_ms: dict[int, dict[int, float]] = field(default_factory=dict)
    step_j: dict[int, dict[int, float]] = field(default_factory=dict)
    steps: dict[int, dict[int, float]] = field(default_factory=dict)
    prefill_ms: dict[int, list[float]] = field(default_factory=dict)
    prefill_j: dict[int, list[float]] = field(default_factory=dict)

    def prior(self, ladder_mhz: Sequence[int]) -> EnginePrior:
        """The token policy's prior: the median of the lone prompts' times (one slow start
        does not move it), the mean of their joules; ``ladder_mhz`` is every clock of the
        GPU."""
        s = self.settings
        return EnginePrior(
            clocks_mhz=tuple(sorted(ladder_mhz)),
            step_ms=self.step_ms,
            step_j=self.step_j,
            prefill_ms={f: float(np.median(v)) for f, v in self.prefill_ms.items()},
            prefill_j={f: float(np.mean(v)) for f, v in self.prefill_j.items()},
            prefill_tokens=s.prefill_tokens,
            context_tokens=s.prompt_tokens + s.output_tokens // 2,
        )


async def sweep_engine(
    device: Device,
    target: GenTarget,
    clocks_mhz: Sequence[int],
    settings: EngineSweepSettings,
    *,
    progress: ProgressFn | None = None,
    seed: int = 0,
) -> EngineSweep:
    """Measure the engine ``target`` at each clock of ``clocks_mhz`` locked on ``device`` in
    turn; ``progress(done, total)`` counts the runs (every bucket's decode run and each clock's
    prompts). MeasureError names a run that failed or that the engine did not run at once."""
    import aiohttp

    from loadgen.stream import stream_once
    from loadgen.synthetic import GenRequest, prompt_of

    rng = np.random.default_rng(seed)
    prompt = GenRequest(
        prompt_of(settings.prompt_tokens, rng), settings.prompt_tokens, settings.output_tokens
    )
    lone = GenRequest(prompt_of(settings.prefill_tokens, rng), settings.prefill_tokens, 1)
    result = EngineSweep(settings)
    total = len(clocks_mhz) * (len(settings.buckets) + 1)
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    async def streams(request: GenRequest, n: int) -> list[list[float]]:
        runs = await asyncio.gather(*(stream_once(session, target, request) for _ in range(n)))
        for run in runs:
            if not run.ok:
                raise MeasureError(f"a stream from {target.url} failed: {run.error}")
        return [[run.start_s, *run.token_times_s] for run in runs]

    connector = aiohttp.TCPConnector(limit=max(settings.buckets))
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120.0)
    try:
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
            EnergySampler(device, settings.poll_s) as energy,
        ):
            for clock in clocks_mhz:
                device.set_clock_mhz(clock)
                await asyncio.sleep(settings.settle_s)
                for n in settings.buckets:
                    for _ in range(OVERLAP_TRIES):
                        runs = await streams(prompt, n)
                        stretch = decode_stretch([times[1:] for times in runs])
                        if stretch is not None:
                            break
                        await asyncio.sleep(settings.settle_s)  # a busy host: try it again
                    if stretch is None:
                        raise MeasureError(
                            f"{target.url} did not run {n} sequences at once at {clock} MHz "
                            f"in {OVERLAP_TRIES} tries "
                            "(its own limit on running sequences, or its KV cache, may be "
                            "lower: profile fewer with --buckets)"
                        )
                    joules = energy.between(stretch.t0_s, stretch.t1_s) / stretch.steps
                    result.step_ms.setdefault(n, {})[clock] = stretch.step_ms
                    result.step_j.setdefault(n, {})[clock] = joules
                    result.steps.setdefault(n, {})[clock] = stretch.steps
                    step()
                for _ in range(settings.prefill_repeats):
                    ((start, first),) = await streams(lone, 1)
                    result.prefill_ms.setdefault(clock, []).append((first - start) * 1000.0)
                    result.prefill_j.setdefault(clock, []).append(energy.between(start, first))
                step()
    finally:
        device.reset()
    return result


async def measure_engine_profile(
    path: Path,
    device: Device,
    target: GenTarget,
    clocks_mhz: Sequence[int],
    settings: EngineSweepSettings,
    *,
    gpu: str,
    progress: ProgressFn | None = None,
    seed: int = 0,
    by: str | None = None,
) -> EnginePrior:
    """Sweep ``target``'s engine on ``device`` (:func:`sweep_engine`) and write its profile to
    ``path`` with where it was made (the ``gpu``, the engine, when, and ``by`` whom if given)."""
    sweep = await sweep_engine(device, target, clocks_mhz, settings, progress=progress, seed=seed)
    about: dict[str, Any] = {
        "gpu": gpu,
        "engine": {"url": target.base_url, "endpoint": target.endpoint, "model": target.model},
        "made": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    if by is not None:
        about["by"] = by
    return save_engine_profile(path, sweep, device.supported_clocks_mhz(), about)


def save_engine_profile(
    path: Path, sweep: EngineSweep, ladder_mhz: Sequence[int], about: Mapping[str, Any]
) -> EnginePrior:
    """Write the sweep's prior to ``path`` (JSON, with ``about``: the GPU, the engine, when),
    and return it."""
    prior = sweep.prior(ladder_mhz)
    data = {
        "kind": PROFILE_KIND,
        "version": PROFILE_VERSION,
        **about,
        "settings": asdict(sweep.settings),
        "clocks_mhz": list(prior.clocks_mhz),
        "prefill_tokens": prior.prefill_tokens,
        "context_tokens": prior.context_tokens,
        "step_ms": _keyed(prior.step_ms),
        "step_j": _keyed(prior.step_j),
        "prefill_ms": {str(f): v for f, v in prior.prefill_ms.items()},
        "prefill_j": {str(f): v for f, v in prior.prefill_j.items()},
        "decode_steps_measured": _keyed(sweep.steps),
        "prefill_ms_measured": {str(f): v for f, v in sweep.prefill_ms.items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return prior


def _keyed(table: Mapping[int, Mapping[int, float]]) -> dict[str, dict[str, float]]:
    return {str(b): {str(f): v for f, v in row.items()} for b, row in table.items()}


def load_engine_profile(path: Path) -> EnginePrior:
    """The prior in ``path``; EngineProfileError says what makes it unusable."""

    def bad(why: str) -> EngineProfileError:
        return EngineProfileError(f"engine profile {path}: {why}")

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise bad(str(err)) from None
    if not isinstance(data, dict) or data.get("kind") != PROFILE_KIND:
        raise bad("not an engine profile (python -m time2clock profile-engine writes them)")
    if data.get("version") != PROFILE_VERSION:
        raise bad(f"version {data.get('version')!r}, this sidecar reads {PROFILE_VERSION}")

    def numbers(value: Any, what: str) -> dict[int, float]:
        if not isinstance(value, dict) or not value:
            raise bad(f"{what} must be a non-empty object of clock: value")
        out: dict[int, float] = {}
        for key, v in value.items():
            number = isinstance(v, int | float) and not isinstance(v, bool)
            if not (str(key).isdigit() and number and math.isfinite(v)):
                raise bad(f"{what}: {key!r}: {v!r} is not a clock and a number")
            if v <= 0:
                raise bad(f"{what} at {key} MHz must be > 0, got {v}")
            out[int(key)] = float(v)
        return out

    def per_bucket(value: Any, what: str) -> dict[int, dict[int, float]]:
        if not isinstance(value, dict) or not value:
            raise bad(f"{what} must be a non-empty object of bucket: {{clock: value}}")
        out = {}
        for key, row in value.items():
            if not (str(key).isdigit() and int(key) >= 1):
                raise bad(f"{what}: bucket {key!r} is not a count of sequences")
            out[int(key)] = numbers(row, f"{what}[{key}]")
        return out

    try:
        ladder = tuple(sorted(int(f) for f in data["clocks_mhz"]))
        step_ms = per_bucket(data["step_ms"], "step_ms")
        step_j = per_bucket(data["step_j"], "step_j")
        prefill_ms = numbers(data["prefill_ms"], "prefill_ms")
        prefill_j = numbers(data["prefill_j"], "prefill_j")
        prefill_tokens, context_tokens = int(data["prefill_tokens"]), int(data["context_tokens"])
    except KeyError as err:
        raise bad(f"missing {err.args[0]!r}") from None
    except (TypeError, ValueError) as err:
        raise bad(str(err)) from None
    if max(step_ms) > SEQ_BUCKETS[-1]:
        raise bad(f"a bucket over {SEQ_BUCKETS[-1]} sequences")
    measured = set(prefill_ms)
    for name, table in (("step_ms", step_ms), ("step_j", step_j)):
        for bucket, row in table.items():
            if set(row) != measured:
                raise bad(f"{name}[{bucket}] is not measured at the prefill's clocks")
    if set(step_ms) != set(step_j) or set(prefill_j) != measured:
        raise bad("times and joules are not measured at the same buckets and clocks")
    if not measured <= set(ladder):
        raise bad("clocks measured that are not in its clocks_mhz")
    return EnginePrior(
        clocks_mhz=ladder,
        step_ms=step_ms,
        step_j=step_j,
        prefill_ms=prefill_ms,
        prefill_j=prefill_j,
        prefill_tokens=prefill_tokens,
        context_tokens=context_tokens,
    )


def check_clocks(prior: EnginePrior, device_clocks_mhz: Sequence[int], where: str) -> None:
    """EngineProfileError unless the profile's clocks are ``device_clocks_mhz`` (a profile is
    of one kind of GPU: its clocks and their times are that GPU's)."""
    if tuple(sorted(device_clocks_mhz)) != prior.clocks_mhz:
        raise EngineProfileError(
            f"engine profile {where}: made on a GPU with other clocks "
            f"({prior.clocks_mhz[0]}-{prior.clocks_mhz[-1]} MHz, {len(prior.clocks_mhz)} of them) "
            f"than this one ({min(device_clocks_mhz)}-{max(device_clocks_mhz)} MHz, "
            f"{len(device_clocks_mhz)}); profile this GPU"
        )
