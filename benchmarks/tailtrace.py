"""``python -m benchmarks.tailtrace``: a policy's tail controller watched live, second by second.

The demo's load (seeded Poisson arrivals, one SLO) goes through the embedded stack under one
policy. After an unmeasured warm-up, the run records each request's latency as the client
measured it and the part of it spent outside the sidecar (before its body was written and after
the reply's headers came back), and every second the sidecar's admin state: the clock, and for
each SLO class the base clock its tail controller asks for and the controller's counts.

What it answers: whether a p99 over the SLO comes from the client's side of the path or from
the sidecar, and whether the controller keeps its own budget (the share of completions it
counted over its setpoint against ``1 − target``). Written: ``results/tailtrace.{md,json}``
(with commit and machine) and a plot (``out/tailtrace/tailtrace.png``): latency over time
against the SLO and the setpoint, and the base clock and the clock.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import secrets
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from api.config import GatewayConfig, from_options, to_flags
from api.embedded import INPUT_WIDTH, SIMNET
from benchmarks.live import (
    add_load_arguments,
    admin_state,
    check_load_arguments,
    percentile_interval_ms,
    percentile_ms,
    set_policy,
)
from benchmarks.sidecar import OWNED_FLAGS, running
from loadgen.classes import RequestClass
from loadgen.engine import Recorder, Target, build_payloads, new_session, open_loop, schedule
from loadgen.metrics import histogram_buckets
from scheduler.adaptive import slo_class
from simulator.results import DEFAULT_DIR, markdown_table, write_results

POLL_S = 1.0  # how often the admin state is read
KEPT = ("clock_mhz", "queue_length", "inflight", "arrival_rate_rps", "feedback")  # of each read
LOOP_LAG = "sidecar_event_loop_lag_seconds"  # the sidecar's event loop lag (api/looplag.py)
LATE_S = 0.01  # a probe tick this late or later is counted late (one of the histogram's bounds)


@dataclass(frozen=True)
class Trace:
    """One run: per request (start, latency, outside the sidecar; seconds from the measured
    run's start), the admin state's samples, and the controller's counts over the run."""

    requests: list[tuple[float, float, float]]
    states: list[dict[str, Any]]
    completions: int | None  # what the controller counted over the measured run
    near_misses: int | None
    # the sidecar's event loop lag over the measured run: ticks of its probe by how late (the
    # histogram's cumulative counts, by upper bound in seconds)
    loop_lag: dict[float, float] = field(default_factory=dict)


def _feedback(state: dict[str, Any], slo_ms: float) -> dict[str, Any] | None:
    """The SLO class's entry of the admin state's ``feedback`` (None: the policy has none)."""
    for entry in state.get("feedback") or []:
        # the policy keys its classes by the SLO to 0.1 ms (scheduler.adaptive.slo_class)
        if entry.get("model") == SIMNET and math.isclose(
            entry.get("slo_ms", -1.0), slo_class(SIMNET, slo_ms)[1]
        ):
            return dict(entry)
    return None


def trace(
    *,
    config: GatewayConfig,
    policy: str,
    rate_rps: float,
    slo_ms: float,
    duration_s: float,
    warmup_s: float,
    seed: int,
) -> Trace:
    """Run the embedded stack under ``policy`` and record the measured run (see the module
    docstring)."""
    token = secrets.token_urlsafe(16)
    cfg = replace(config, scheduler=replace(config.scheduler, default_slo_ms=slo_ms))
    flags = to_flags(cfg, leave_out=OWNED_FLAGS)
    sends = list(schedule(rate_rps, duration_s, "poisson", np.random.default_rng(seed)))
    warm = list(schedule(rate_rps, warmup_s, "poisson", np.random.default_rng(seed + 1)))
    data = np.ones((1, INPUT_WIDTH), dtype=np.float32)
    payloads = build_payloads(
        [RequestClass("trace", slo_ms=slo_ms)], input_name="INPUT0", datatype="FP32", data=data
    )
    held_ms = slo_ms - cfg.slo_outside_ms  # the SLO the sidecar holds its requests to
    with running(flags, state_dir=cfg.state_dir, admin_token=token, starts=3) as sc:

        async def main() -> Trace:
            target = Target(sc.url, SIMNET, payloads, [1.0])
            async with new_session() as session:
                await set_policy(session, sc.url, token, policy)
                if warm:
                    await open_loop(session, target, warm, Recorder(), np.random.default_rng(1))
                states: list[dict[str, Any]] = []
                running_run = True
                started = time.monotonic()
                before = _feedback(await admin_state(session, sc.url, token), held_ms)
                lag_before = await _loop_lag(session, sc.url)

                async def poll() -> None:
                    while running_run:
                        state = await admin_state(session, sc.url, token)
                        kept = {k: state.get(k) for k in KEPT}
                        states.append({"t_s": round(time.monotonic() - started, 3), **kept})
                        await asyncio.sleep(POLL_S)

                poller = asyncio.create_task(poll())
                rec = Recorder()
                try:
                    await open_loop(session, target, sends, rec, np.random.default_rng(seed))
                finally:
                    running_run = False
                    await poller
                after = _feedback(await admin_state(session, sc.url, token), held_ms)
                lag = await _loop_lag(session, sc.url)
                lag = {le: n - lag_before.get(le, 0.0) for le, n in lag.items()}
            requests = [
                (
                    s.start_s - started,
                    s.latency_s,
                    s.latency_s - (s.headers_s - s.sent_s)
                    if math.isfinite(s.headers_s - s.sent_s)
                    else math.nan,
                )
                for s in rec.samples
                if s.status == 200
            ]
            if before is None or after is None:
                return Trace(requests, states, None, None, lag)
            return Trace(
                requests,
                states,
                completions=after["completions"] - before["completions"],
                near_misses=after["near_misses"] - before["near_misses"],
                loop_lag=lag,
            )

        return asyncio.run(main())


async def _loop_lag(session: aiohttp.ClientSession, url: str) -> dict[float, float]:
    async with session.get(f"http://{url}/metrics") as resp:
        resp.raise_for_status()
        return histogram_buckets(await resp.text(), LOOP_LAG)


def client_setpoint_ms(slo_ms: float, outside_ms: float, setpoint: float) -> float:
    """The controller's setpoint as the client sees it: the setpoint of the SLO the sidecar
    holds (``slo_ms`` less ``outside_ms``), plus the time allowed outside the sidecar."""
    return setpoint * (slo_ms - outside_ms) + outside_ms


def summary(
    t: Trace, slo_ms: float, setpoint: float, target: float, outside_ms: float = 0.0
) -> dict[str, Any]:
    """The figures the results file gives for a trace."""
    latency_s = [r[1] for r in t.requests]
    outside_s = [r[2] for r in t.requests if math.isfinite(r[2])]
    low, high = percentile_interval_ms(latency_s, 99)
    over = None
    if t.completions:
        over = (t.near_misses or 0) / t.completions
    lat_ms = np.asarray(latency_s) * 1000.0
    return {
        "requests": len(t.requests),
        "p50_ms": percentile_ms(latency_s, 50),
        "p99_ms": percentile_ms(latency_s, 99),
        "p99_low_ms": low,
        "p99_high_ms": high,
        "within_slo": float(np.mean(lat_ms <= slo_ms)) if len(lat_ms) else math.nan,
        "over_setpoint": (
            float(np.mean(lat_ms > client_setpoint_ms(slo_ms, outside_ms, setpoint)))
            if len(lat_ms)
            else math.nan
        ),
        "outside_p50_ms": percentile_ms(outside_s, 50),
        "outside_p99_ms": percentile_ms(outside_s, 99),
        "controller_completions": t.completions,
        "controller_near_misses": t.near_misses,
        "controller_over_setpoint": over,
        "budget": 1.0 - target,
        "loop_ticks": t.loop_lag.get(math.inf),
        # ticks at least 10 ms late: all less those within the bucket up to 10 ms
        "loop_ticks_late_10ms": (
            t.loop_lag[math.inf] - t.loop_lag[LATE_S]
            if {math.inf, LATE_S} <= t.loop_lag.keys()
            else None
        ),
        # the least bucket bound every tick was within: the worst tick was at most this late
        "loop_lag_worst_bucket_s": min(
            (le for le, n in t.loop_lag.items() if n >= t.loop_lag.get(math.inf, 0.0)),
            default=None,
        ),
    }


def plot(t: Trace, slo_ms: float, setpoint: float, path: Path, outside_ms: float = 0.0) -> Path:
    """Latency over time against the SLO and the setpoint; base clock and clock under it."""
    from time2clock.plot import pyplot

    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    when = [r[0] for r in t.requests]
    lat_ms = [r[1] * 1000.0 for r in t.requests]
    top.scatter(when, lat_ms, s=4, color="C0", label="request latency (client)")
    top.axhline(slo_ms, color="red", linestyle="--", label=f"SLO {slo_ms:g} ms")
    top.axhline(
        client_setpoint_ms(slo_ms, outside_ms, setpoint),
        color="orange",
        linestyle=":",
        label="controller's setpoint (+ the time allowed outside the sidecar)",
    )
    top.set_ylabel("latency (ms)")
    top.legend(loc="upper right", fontsize="small")
    times = [s["t_s"] for s in t.states]
    bottom.step(times, [s.get("clock_mhz") for s in t.states], where="post", label="clock")
    held_ms = slo_ms - outside_ms
    bases = [(f or {}).get("base_mhz") for f in (_feedback(s, held_ms) for s in t.states)]
    if any(b is not None for b in bases):
        bottom.step(times, bases, where="post", label="base clock (tail controller)")
    bottom.set_ylabel("MHz (sampled each second)")
    bottom.set_xlabel("seconds into the measured run")
    bottom.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None or not math.isfinite(value) else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tailtrace", description=__doc__)
    parser.add_argument("--policy", default="adaptive")
    parser.add_argument("--gpu", default="v100", help="simulated GPU profile")
    add_load_arguments(parser)
    parser.add_argument("--duration-s", type=float, default=60.0, help="measured")
    parser.add_argument("--warmup-s", type=float, default=10.0, help="unmeasured, before")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--out-dir", type=Path, default=Path("out/tailtrace"))
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    check_load_arguments(parser, args)
    if args.duration_s <= 0 or args.warmup_s < 0:
        parser.error("--duration-s must be > 0, --warmup-s >= 0")
    config = from_options(
        device=f"sim:{args.gpu}", profile_models=(SIMNET,), slo_outside_ms=args.slo_outside_ms
    )
    feedback = config.policy.feedback
    print(
        f"{args.policy} on {args.rate:g} requests/s, SLO {args.slo_ms:g} ms: "
        f"{args.warmup_s:g} s unmeasured, then {args.duration_s:g} s traced",
        flush=True,
    )
    t = trace(
        config=config,
        policy=args.policy,
        rate_rps=args.rate,
        slo_ms=args.slo_ms,
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        seed=args.seed,
    )
    outside = args.slo_outside_ms
    s = summary(t, args.slo_ms, feedback.setpoint, feedback.target, outside)
    png = plot(t, args.slo_ms, feedback.setpoint, args.out_dir / "tailtrace.png", outside)
    rows = [
        ("requests", str(s["requests"])),
        ("p50 ms (client)", _fmt(s["p50_ms"], ".1f")),
        (
            "p99 ms (client), 95% interval",
            f"{_fmt(s['p99_ms'], '.1f')} ({_fmt(s['p99_low_ms'], '.1f')}–"
            f"{_fmt(s['p99_high_ms'], '.1f')})",
        ),
        ("within the SLO", _fmt(s["within_slo"], ".2%")),
        ("over the setpoint (client)", _fmt(s["over_setpoint"], ".2%")),
        (
            "over the setpoint (the controller's count) / its budget",
            f"{_fmt(s['controller_over_setpoint'], '.2%')} / {s['budget']:.0%}",
        ),
        (
            "outside the sidecar p50 / p99 ms",
            f"{_fmt(s['outside_p50_ms'], '.2f')} / {_fmt(s['outside_p99_ms'], '.2f')}",
        ),
        (
            "the sidecar's event loop: probe ticks 10 ms late or more / all; the worst, up to",
            f"{_fmt(s['loop_ticks_late_10ms'], '.0f')} / {_fmt(s['loop_ticks'], '.0f')}; "
            f"{_fmt(s['loop_lag_worst_bucket_s'] and s['loop_lag_worst_bucket_s'] * 1e3, 'g')} ms",
        ),
    ]
    for name, value in rows:
        print(f"  {name}: {value}")
    markdown = (
        f"Policy `{args.policy}`, simulated {args.gpu}, Poisson {args.rate:g} requests/s "
        f"(seed {args.seed}), SLO {args.slo_ms:g} ms at the client, {outside:g} ms of it "
        f"allowed outside the sidecar (`--slo-outside-ms`): the sidecar holds "
        f"{args.slo_ms - outside:g} ms, its controller's setpoint {feedback.setpoint:g} of that "
        f"({client_setpoint_ms(args.slo_ms, outside, feedback.setpoint):.1f} ms at the client); "
        f"{args.warmup_s:g} s unmeasured, then {args.duration_s:g} s traced. *Outside the "
        "sidecar*: a request's latency less the time from its body written to the reply's "
        "headers read (the client's own send and receive). *The controller's count*: the "
        "completions its class counted over the setpoint during the run, as the sidecar "
        f"measures them. Plot: `{png}`.\n\n" + markdown_table(["", "value"], rows)
    )
    md, _ = write_results(
        "tailtrace",
        title="A policy's tail, second by second (python -m benchmarks.tailtrace)",
        markdown=markdown,
        data={
            "settings": {
                "policy": args.policy,
                "gpu": args.gpu,
                "rate_rps": args.rate,
                "slo_ms": args.slo_ms,
                "slo_outside_ms": outside,
                "duration_s": args.duration_s,
                "warmup_s": args.warmup_s,
                "seed": args.seed,
            },
            "summary": s,
            "states": t.states,
        },
        directory=args.results_dir,
    )
    print(f"written to {md} (and .json), plot {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
