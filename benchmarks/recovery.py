"""How fast a badly profiled table heals under live traffic.

``python -m benchmarks.recovery`` profiles ``simnet`` twice on the embedded stack (real Triton,
simulated V100): once on an idle machine (the clean table) and once while a busy loop runs on
every core (the CPU-loaded table); ``--wrong energy`` instead takes the clean table with only its
energy curve wrong (see :func:`wrong_energy`). It then sends ``make demo``'s load (40 req/s
Poisson to ``simnet``, SLO 40 ms, the same seeded arrivals every run) through a fresh sidecar per
run:

* ``max`` (the baseline each saving is measured against),
* the policy (``--policy``, default ``adaptive``) from the clean table, learning off,
* the policy from the wrong table, learning off,
* the policy from the wrong table, learning the times only (the energy counter not read),
* the policy from the wrong table, learning the times and the energy,

and prints, per 10 s window, the energy per inference of each run as a saving against ``max``'s
in the same window, each run's p99 against the SLO, and the learning runs' table errors (time,
energy). The results go to ``<results-dir>/recovery-<policy>-<wrong>.md`` and ``.json`` (with
the command, the git commit and the machine); ``--simulate`` runs the same in the simulator.
Live runs of the same arrivals do not heal alike (``docs/learning.md``, "Live"): ``--repeats N``
runs the last one N times, and the report says, per run, from which window on its saving stays
within ``HEALED_POINTS`` of the clean table's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import multiprocessing as mp
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from api.config import from_options
from api.embedded import INPUT_WIDTH, SIMNET
from api.learning import learned_path
from api.runtime import TABLES_VERSION
from api.server import SidecarServer
from benchmarks.energyfit import SAMPLES, write_record, write_samples
from benchmarks.live import admin_state
from dvfs.profiles import get_profile
from loadgen.classes import RequestClass
from loadgen.engine import Recorder, Target, build_payloads, new_session, open_loop, schedule
from loadgen.metrics import energy_j, scrape, scrape_values
from scheduler.registry import DEFAULT_POLICY
from simulator.results import DEFAULT_DIR, write_results
from simulator.simulate import SimConfig, profiled_tables, simulate
from time2clock.online import ExecutionSample, OnlineTables
from time2clock.table import TableSet

log = logging.getLogger(__name__)
STARTS = 3  # a run whose sidecar fails to start is started again, up to this many times
HEALED_POINTS = 3.0  # healed: the saving within this many points of the clean table's


@dataclass(frozen=True)
class Window:
    """One window of one run: from ``start_s`` (s after the load began) for ``span_s``."""

    start_s: float
    completed: int
    energy_j: float
    p99_ms: float
    table_error: float | None
    energy_error: float | None = None

    @property
    def j_per_inference(self) -> float:
        return self.energy_j / self.completed if self.completed else math.nan


@dataclass(frozen=True)
class Run:
    name: str
    windows: list[Window]
    admin_state: dict[str, object]


def _spin() -> None:  # pragma: no cover (runs in a child process)
    while True:
        pass


@contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    """A busy loop on ``processes`` cores for the duration of the block."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_spin, daemon=True) for _ in range(processes)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(5)


def profile_table(state_dir: Path, gpu: str, busy_processes: int, *, again: bool) -> Path:
    """``simnet``'s table profiled by the embedded stack at start (while ``busy_processes``
    busy loops run), cached in ``state_dir``; the cached one unless ``again``."""
    table = state_dir / "tables" / f"{gpu}-{SIMNET}-v{TABLES_VERSION}.json"
    if table.is_file() and not again:
        log.info("using the table profiled before: %s", table)
        return table
    table.unlink(missing_ok=True)
    config = from_options(
        port=0,
        grpc_port=0,
        device=f"sim:{gpu}",
        profile_models=(SIMNET,),
        state_dir=state_dir,
        learn=False,
    )
    load = cpu_load(busy_processes) if busy_processes else contextlib.nullcontext()
    with load, SidecarServer(config):
        pass
    log.info(
        "profiled %s with %d busy loops (load average now %.2f): %s",
        SIMNET,
        busy_processes,
        os.getloadavg()[0],
        table,
    )
    return table


async def _load(
    url: str,
    token: str,
    send_times: Sequence[float],
    slo_ms: float,
    seed: int,
    window_s: float,
) -> tuple[list[Window], dict[str, object]]:
    classes = [RequestClass("recovery", slo_ms=slo_ms)]
    data = np.ones((1, INPUT_WIDTH), dtype=np.float32)
    payloads = build_payloads(classes, input_name="INPUT0", datatype="FP32", data=data)
    target = Target(url, SIMNET, payloads, [1.0])
    metrics_url = f"http://{url}/metrics"
    windows = math.ceil(max(send_times) / window_s)
    async with new_session() as session:
        await asyncio.sleep(0.5)  # let the clock settle
        rec = Recorder()
        start = time.monotonic()
        marks: list[tuple[float, dict[str, float]]] = []

        async def scraper() -> None:
            for k in range(windows + 1):
                await asyncio.sleep(max(0.0, start + k * window_s - time.monotonic()))
                async with session.get(metrics_url) as resp:
                    marks.append((time.monotonic(), scrape_values(await resp.text())))

        task = asyncio.create_task(scraper())
        await open_loop(session, target, send_times, rec, np.random.default_rng(seed))
        await task
        state = await admin_state(session, url, token)
        await scrape(session, metrics_url)
    out = []
    for k in range(windows):
        (t0, before), (t1, after) = marks[k], marks[k + 1]
        done = [s for s in rec.samples if s.status == 200 and t0 <= s.end_s < t1]
        sent = [
            s.latency_s * 1000.0 for s in rec.samples if s.status == 200 and t0 <= s.start_s < t1
        ]
        out.append(
            Window(
                start_s=k * window_s,
                completed=len(done),
                energy_j=(energy_j(after) or 0.0) - (energy_j(before) or 0.0),
                p99_ms=float(np.percentile(sent, 99)) if sent else math.nan,
                table_error=after.get("sidecar_table_error_ratio"),
                energy_error=after.get("sidecar_table_energy_error_ratio"),
            )
        )
    return out, state


def run_once(
    name: str,
    *,
    policy: str,
    table: Path,
    learn: bool,
    gpu: str,
    send_times: Sequence[float],
    slo_ms: float,
    seed: int,
    window_s: float,
    record: Path | None = None,
    learn_energy: bool = True,
    record_fit: Path | None = None,
) -> Run:
    """One fresh sidecar (its own empty state dir: nothing learned before) under the load;
    with ``learn`` but not ``learn_energy``, only the times learn; with ``record_fit``, the
    energy fit's windows and fits, and the isolated executions the times learned from, are
    written there (:mod:`benchmarks.energyfit`)."""
    token = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix="recovery-") as tmp:
        shutil.copy(table, Path(tmp) / "table.json")
        config = from_options(
            port=0,
            grpc_port=0,
            device=f"sim:{gpu}",
            policy=policy,
            table=(Path(tmp) / "table.json",),
            state_dir=Path(tmp),
            slo_ms=slo_ms,
            admin_token=token,
            learn=learn,
        )
        with SidecarServer(config) as sc:
            journal: list[ExecutionSample] = []
            if sc.runtime.learner is not None and (record is not None or record_fit is not None):
                sc.runtime.learner.journal = journal
            learner = sc.runtime.learner
            if learner is not None and not learn_energy:
                learner.energy = None  # before any request: the counter is ignored
            recorded = learner.energy if learner is not None and record_fit is not None else None
            if recorded is not None:
                recorded.fit_log = []
            windows, state = asyncio.run(_load(sc.url, token, send_times, slo_ms, seed, window_s))
            if recorded is not None and learner is not None and record_fit is not None:
                write_record(record_fit, recorded, learner.latest)
                log.info("%s: the energy fit's windows and fits are in %s", name, record_fit)
        if record is not None and journal:
            write_samples(journal, record)
        if record_fit is not None and journal:
            write_samples(journal, record_fit / SAMPLES)
        saved = learned_path(Path(tmp), gpu, TABLES_VERSION)
        if learn and saved.is_file():
            log.info("%s: the learned table was saved (%d bytes)", name, saved.stat().st_size)
    log.info("%s: done, load average %.2f", name, os.getloadavg()[0])
    return Run(name, windows, state)


def report(runs: Sequence[Run], slo_ms: float, window_s: float) -> str:
    """Per window: each run's saving against ``max`` (first run) and its p99; then the learning
    runs' table errors (time · energy) per window."""
    base, others = runs[0], runs[1:]
    head = ["window"] + [f"{r.name}: saving / p99 ms" for r in others]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for k, ref in enumerate(base.windows):
        cells = [f"{ref.start_s:.0f}-{ref.start_s + window_s:.0f} s"]
        for r in others:
            w = r.windows[k]
            flag = "" if w.p99_ms <= slo_ms else " (over SLO)"
            cells.append(f"{-saving(r, base, k):+.1%} / {w.p99_ms:.1f}{flag}")
        lines.append(" | ".join(cells))
    per_window = ", ".join(f"{w.j_per_inference:.3f}" for w in base.windows)
    lines.append(f"(max's J/inference per window: {per_window}; SLO {slo_ms:g} ms)")
    learning = [r for r in others if any(w.table_error is not None for w in r.windows)]
    if learning:
        lines += ["", "table error at the end of each window (time · energy):", ""]
        head = ["window"] + [r.name for r in learning]
        lines += [" | ".join(head), " | ".join("---" for _ in head)]
        for k, ref in enumerate(base.windows):
            cells = [f"{ref.start_s:.0f}-{ref.start_s + window_s:.0f} s"]
            cells += [
                f"{_ratio(r.windows[k].table_error)} · {_ratio(r.windows[k].energy_error)}"
                for r in learning
            ]
            lines.append(" | ".join(cells))
    return "\n".join(lines)


def saving(run: Run, base: Run, k: int) -> float:
    """``run``'s saving against ``base`` (``max``) in window ``k`` (0.25: a quarter less
    energy per inference)."""
    return 1.0 - run.windows[k].j_per_inference / base.windows[k].j_per_inference


def healed_from(run: Run, clean: Run, base: Run, points: float = HEALED_POINTS) -> float | None:
    """The start (s) of the first window from which ``run``'s saving against ``base`` stays
    within ``points`` of ``clean``'s to the end; None if the last window is not."""
    start = None
    for k in reversed(range(len(base.windows))):
        gap = 100.0 * (saving(clean, base, k) - saving(run, base, k))
        if not gap <= points:  # a NaN (an empty window) is not within
            break
        start = base.windows[k].start_s
    return start


def healing(runs: Sequence[Run], starts: Sequence[float | None]) -> str:
    """One line per run: from which window on it is within ``HEALED_POINTS`` of the clean
    table (``starts``, as :func:`healed_from` gives them)."""
    lines = [f"within {HEALED_POINTS:g} points of the clean table's saving:"]
    for r, start in zip(runs, starts, strict=True):
        when = "not by the last window" if start is None else f"from {start:.0f} s on"
        lines.append(f"- {r.name}: {when}")
    return "\n".join(lines)


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def wrong_energy(tables: TableSet) -> TableSet:
    """``tables`` with each curve's energy per inference scaled by top clock / clock: times
    right, energy lowest at (or, with the profile's noise, near) the top clock: a table that puts
    every energy floor there."""
    out = []
    for table in tables:
        top = max(table.clocks_mhz)
        curves = {
            b: replace(
                c,
                points=tuple(
                    replace(p, energy_per_inference_j=p.energy_per_inference_j * top / p.clock_mhz)
                    if p.energy_per_inference_j is not None
                    else p
                    for p in c.points
                ),
            )
            for b, c in table.curves.items()
        }
        out.append(replace(table, curves=curves))
    return TableSet(out)


def summary(path: Path) -> str:
    """Batch 1 at the top clock, and the pooled p99 residual, of the table at ``path``."""
    table = next(iter(TableSet.load(path)))
    curve = table.curve(1)
    top = curve.clocks_mhz[-1]
    p99 = curve.residual_quantiles_ms.get("p99", math.nan)
    return f"{curve.predict_ms(top):.1f} ms at {top} MHz, p99 residual {p99:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recovery", description=__doc__)
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="the policy under test")
    parser.add_argument("--gpu", default="v100", help="simulated GPU profile")
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second (Poisson)")
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--slo-ms", type=float, default=40.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path("out/recovery"),
        help="where the clean and CPU-loaded tables are profiled and cached",
    )
    parser.add_argument(
        "--record",
        type=Path,
        help="write the learning run's measurements here (the last one's, with --repeats)",
    )
    parser.add_argument(
        "--record-fit",
        type=Path,
        help="write the energy-learning run's windows, fits and last tables to this directory "
        "(read them with python -m benchmarks.energyfit)",
    )
    parser.add_argument(
        "--busy-processes",
        type=int,
        default=os.cpu_count() or 1,
        help="busy loops while the CPU-loaded table is profiled (default: one per core)",
    )
    parser.add_argument(
        "--reprofile", action="store_true", help="profile both tables again (else: cached)"
    )
    parser.add_argument(
        "--wrong",
        choices=("cpu-load", "energy"),
        default="cpu-load",
        help="the wrong table: profiled under CPU load, or the clean one with its energy curve "
        "wrong (times right)",
    )
    parser.add_argument(
        "--no-times-only", action="store_true", help="skip the run that learns only the times"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of the one that learns the times and the energy (live runs do not heal alike)",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=DEFAULT_DIR,
        help="where recovery-<policy>-<wrong>[-simulated].md and .json are written "
        "(default: results)",
    )
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="the same runs in the simulator (virtual time, the simulator's profiled table; "
        "--wrong energy only), totals over the run",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.simulate:
        if args.wrong != "energy":
            parser.error("--simulate needs --wrong energy (the simulator profiles no CPU load)")
        text, rows = simulated(
            args.policy, args.gpu, args.rate, args.slo_ms, args.duration_s, args.seed
        )
        print(text)
        md, _ = write_results(
            f"recovery-{args.policy}-energy-simulated",
            title="A wrong energy curve heals, in the simulator (python -m benchmarks.recovery)",
            markdown=text,
            data={"settings": vars(args), "runs": rows},
            directory=args.results_dir,
        )
        log.info("written to %s (and .json)", md)
        return 0
    clean = profile_table(args.state_dir / "clean", args.gpu, 0, again=args.reprofile)
    if args.wrong == "cpu-load":
        wrong = profile_table(
            args.state_dir / "loaded", args.gpu, args.busy_processes, again=args.reprofile
        )
        label = "CPU-loaded table"
    else:
        wrong = args.state_dir / "wrong-energy" / "table.json"
        wrong.parent.mkdir(parents=True, exist_ok=True)
        wrong_energy(TableSet.load(clean)).save(wrong)
        label = "wrong-energy table"
    log.info("tables: clean %s; %s %s", summary(clean), label, summary(wrong))
    send_times = list(
        schedule(args.rate, args.duration_s, "poisson", np.random.default_rng(args.seed))
    )
    p = args.policy
    # (name, policy, table, learn, learn_energy, where its energy fit is recorded)
    plan: list[tuple[str, str, Path, bool, bool, Path | None]] = [
        ("max", "max", clean, False, True, None),
        (f"{p}, clean table", p, clean, False, True, None),
        (f"{p}, {label}, no learning", p, wrong, False, True, None),
        (f"{p}, {label}, learning times", p, wrong, True, False, None),
    ]
    learning_name = f"{p}, {label}, learning times and energy"
    plan += [
        (
            learning_name + (f" ({k})" if args.repeats > 1 else ""),
            p,
            wrong,
            True,
            True,
            _fit_dir(args.record_fit, k, args.repeats),
        )
        for k in range(1, args.repeats + 1)
    ]
    if args.no_times_only:
        del plan[3]
    load_before = os.getloadavg()[0]
    runs = []
    for name, policy, table, learn, learn_energy, record_fit in plan:
        log.info("run: %s", name)
        for attempt in range(1, STARTS + 1):
            try:
                run = run_once(
                    name,
                    policy=policy,
                    table=table,
                    learn=learn,
                    learn_energy=learn_energy,
                    record=args.record if learn and learn_energy else None,
                    record_fit=record_fit,
                    gpu=args.gpu,
                    send_times=send_times,
                    slo_ms=args.slo_ms,
                    seed=args.seed,
                    window_s=args.window_s,
                )
            except RuntimeError as err:  # the sidecar did not start (a loaded machine)
                if attempt == STARTS:
                    raise
                log.warning("%s: %s; starting it again", name, err)
                continue
            runs.append(run)
            break
    learners = runs[len(runs) - args.repeats :]
    healed = [healed_from(r, runs[1], runs[0]) for r in learners]
    text = report(runs, args.slo_ms, args.window_s) + "\n\n" + healing(learners, healed)
    print(text)
    learning = runs[-1].admin_state.get("models", {})
    print("admin state of the last learning run, at the end:", learning)
    floors = [_floors(r.admin_state) for r in learners]
    md, _ = write_results(
        f"recovery-{args.policy}-{args.wrong}",
        title="How fast a wrong table heals, live (python -m benchmarks.recovery)",
        markdown=(
            f"tables: clean {summary(clean)}; {label} {summary(wrong)}\n\n"
            f"load average {load_before:.2f} before the runs, {os.getloadavg()[0]:.2f} after\n\n"
            f"{text}\n\nenergy-optimal clocks of each learning run's table at the end, per "
            f"batch: {'; '.join(str(f) for f in floors)}\n"
        ),
        data={
            "settings": vars(args),
            "runs": [{"name": r.name, "windows": [asdict(w) for w in r.windows]} for r in runs],
            "final_floors": floors,
            "healed_from_s": healed,
        },
        directory=args.results_dir,
    )
    log.info("written to %s (and .json)", md)
    return 0


def simulated(
    policy: str, gpu: str, rate_rps: float, slo_ms: float, duration_s: float, seed: int
) -> tuple[str, list[dict[str, object]]]:
    """The runs of :func:`main` in the simulator, from its profiled table (clean) and that
    table with its energy curve wrong: energy per inference, saving against ``max``, p99, and
    the energy-optimal clocks the table has at the end, per batch."""
    clean = profiled_tables(gpu)
    wrong = wrong_energy(clean)
    base = SimConfig(
        gpu=gpu,
        slo_ms=slo_ms,
        duration_s=duration_s,
        seed=seed,
        load=None,
        rate_rps=rate_rps,
        with_oracle=False,
    )
    plan = [
        ("max", "max", clean, None),
        (f"{policy}, clean table", policy, clean, None),
        (f"{policy}, wrong-energy table, no learning", policy, wrong, None),
        (f"{policy}, wrong-energy table, learning times", policy, wrong, False),
        (f"{policy}, wrong-energy table, learning times and energy", policy, wrong, True),
    ]
    lines = [
        f"simulated {gpu}, {rate_rps:g} req/s Poisson, SLO {slo_ms:g} ms, {duration_s:g} s, "
        f"seed {seed}",
        "",
        "run | J/inference | vs max | p99 ms | energy-optimal clock per batch at the end",
        "--- | --- | --- | --- | ---",
    ]
    at_max = math.nan
    rows: list[dict[str, object]] = []
    for name, pol, tables, energy in plan:
        learner = None
        if energy is not None:
            clocks = get_profile(gpu).clocks_mhz
            learner = OnlineTables(list(clocks), gpu=gpu, learn_energy=energy, base=tables)
        cfg = replace(base, policy=pol, learn=learner is not None)
        result = simulate(cfg, tables, learner=learner).to_json()
        j = float(result["energy_per_inference_j"])
        at_max = j if pol == "max" else at_max
        final = learner.latest if learner is not None and learner.latest is not None else tables
        floors = {b: t.energy_optimal_clock_mhz(b) for t in final for b in t.batches}
        lines.append(
            f"{name} | {j:.4f} | {j / at_max - 1:+.1%} | {result['p99_ms']:.1f} | {floors}"
        )
        rows.append(
            {
                "name": name,
                "energy_per_inference_j": j,
                "vs_max": j / at_max - 1,
                "p99_ms": result["p99_ms"],
                "energy_optimal_clock_mhz": floors,
            }
        )
    return "\n".join(lines), rows


def _fit_dir(directory: Path | None, k: int, repeats: int) -> Path | None:
    """Where the ``k``-th learning run records its energy fit: ``directory``, in a folder per
    run when the learning run repeats."""
    if directory is None or repeats == 1:
        return directory
    return directory / str(k)


def _floors(state: dict[str, object]) -> dict[str, object]:
    """Per model, the energy-optimal clock per batch of its table at the end (admin state)."""
    models = state.get("models")
    out: dict[str, object] = {}
    if isinstance(models, dict):
        for name, entry in models.items():
            learning = entry.get("learning") if isinstance(entry, dict) else None
            energy = learning.get("energy") if isinstance(learning, dict) else None
            if isinstance(energy, dict):
                out[name] = energy.get("optimal_clock_mhz")
    return out


if __name__ == "__main__":
    sys.exit(main())
