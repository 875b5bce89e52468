"""``python -m benchmarks.genai_agreement``: does loadgen's generative mode measure what an
independent client measures, on the same run?

Two clients stream chat completions into one server at the same time: loadgen's client (this
process) and the ``openai`` Python SDK timing its own chunks (:mod:`benchmarks.sdk_client`, a
process of its own, with its own HTTP stack, SSE parsing and statistics). One seeded list of
synthetic requests is shared between them. With ``--load rate`` (the default) the requests
leave on one seeded schedule (evenly spaced, or Poisson), dealt in pairs: both clients send
every request once, at consecutive times, loadgen first in even pairs and the SDK first in odd
ones, so both measure the same work and neither always follows the other. With ``--load
concurrency`` each client keeps half the streams in flight, loadgen sending the even requests
of the list and the SDK the odd ones (two clients sending the same requests in lockstep would
queue one behind the other at every step). Both start together and
stop sending after the same duration. Their time to first token (mean, median) and
throughputs (output tokens/s, requests/s) must agree within the tolerance (10%). The sidecar's
own means (its ``sidecar_time_to_first_token_seconds`` and ``sidecar_inter_token_seconds``
histograms, over both clients' streams) are shown beside them: its clock starts when a request
reaches the sidecar and stops when a token leaves it, so a client's figure above it is that
client's own overhead; a client whose inter-token latency is well above the sidecar's is
short of CPU to read its streams, and measures itself more than the server.

Then (unless ``--no-alone``) each client runs alone on its own half of the requests, at the
same times, with the sidecar's TTFT histogram read around it: the client's mean TTFT minus the
sidecar's for the same requests is what that client adds by itself (sending, receiving and its
own work per request), which tells a disagreement in the shared run that comes from a client
apart from one that comes from the measurement.

Without ``--url`` it starts the embedded default on a simulated GPU (``--gpu``, A100 by default:
its slower tokens leave the two clients CPU to read them on a small machine) serving ``simllm``
in a process of its own, at the ``max`` policy. Writes ``results/genai_agreement.{md,json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.sidecar import running
from dvfs.__main__ import PIPE_WIDTH
from loadgen.engine import new_session, schedule
from loadgen.genrun import ARRIVALS, GenRun, closed_loop, open_loop
from loadgen.metrics import histogram_totals
from loadgen.stream import OPENAI_CHAT, GenTarget, TimedStream
from loadgen.synthetic import GenRequest, LengthSpec, RequestSource
from simulator.results import DEFAULT_DIR, SOURCE_ROOT, markdown_table, write_results

TTFT_FAMILY = "sidecar_time_to_first_token_seconds"
ITL_FAMILY = "sidecar_inter_token_seconds"
LOADS = ("rate", "concurrency")
WORKLOAD_SIZE = 512  # requests for the closed loops, cycled
# (key, shown as, in the verdict)
FIGURES = (
    ("ttft_mean_ms", "TTFT mean (ms)", True),
    ("ttft_p50_ms", "TTFT p50 (ms)", True),
    ("ttft_p90_ms", "TTFT p90 (ms)", False),
    ("itl_mean_ms", "inter-token latency mean (ms)", False),
    ("output_token_throughput", "output tokens/s", True),
    ("request_throughput", "requests/s", True),
    ("request_count", "requests", False),
)


@dataclass(frozen=True)
class Settings:
    model: str = "simllm"
    load: str = "rate"
    request_rate: float = 2.0  # both clients together
    arrival: str = "constant"
    concurrency_each: int = 2
    duration_s: float = 40.0
    input_tokens_mean: int = 1000
    input_tokens_stddev: float = 200.0
    output_tokens_mean: int = 128
    output_tokens_stddev: float = 32.0
    warmup_requests: int = 4
    seed: int = 0
    tolerance: float = 0.10
    alone: bool = True  # then each client alone on its own requests: its own overhead


@dataclass(frozen=True)
class Overhead:
    """A client alone on its own requests: its mean TTFT and the sidecar's for the same
    requests (from the request's arrival at the sidecar to its first token leaving it)."""

    client_ttft_ms: float
    sidecar_ttft_ms: float | None

    @property
    def overhead_ms(self) -> float | None:
        """What the client adds to the server's TTFT: sending, receiving, its own work."""
        if self.sidecar_ttft_ms is None:
            return None
        return self.client_ttft_ms - self.sidecar_ttft_ms


@dataclass(frozen=True)
class Agreement:
    settings: Settings
    loadgen: dict[str, float]
    sdk: dict[str, float]
    sidecar_ttft_mean_ms: float | None
    sidecar_itl_mean_ms: float | None
    alone: dict[str, Overhead] = field(default_factory=dict)

    def difference(self, key: str) -> float:
        """loadgen's figure relative to the SDK's (+0.05: 5% higher)."""
        ours, theirs = self.loadgen.get(key, math.nan), self.sdk.get(key, math.nan)
        return ours / theirs - 1.0 if theirs else math.nan

    @property
    def agrees(self) -> bool:
        return all(
            abs(self.difference(key)) <= self.settings.tolerance
            for key, _, judged in FIGURES
            if judged
        )


def loadgen_figures(report: Mapping[str, Any]) -> dict[str, float]:
    """The compared figures from loadgen's aiperf-shaped report."""
    return {
        "ttft_mean_ms": report["time_to_first_token"]["avg"],
        "ttft_p50_ms": report["time_to_first_token"]["p50"],
        "ttft_p90_ms": report["time_to_first_token"]["p90"],
        "itl_mean_ms": report["inter_token_latency"]["avg"],
        "output_token_throughput": report["output_token_throughput"]["avg"],
        "request_throughput": report["request_throughput"]["avg"],
        "request_count": report["request_count"]["avg"],
    }


def workload(settings: Settings, n: int) -> list[GenRequest]:
    source = RequestSource(
        LengthSpec(settings.input_tokens_mean, settings.input_tokens_stddev),
        LengthSpec(settings.output_tokens_mean, settings.output_tokens_stddev),
        seed=settings.seed,
    )
    return source.take(n)


def arrivals(settings: Settings) -> list[float]:
    """The open loop's send times (s), both clients' together."""
    rng = np.random.default_rng(settings.seed)
    times = schedule(settings.request_rate, settings.duration_s, settings.arrival, rng)
    return [float(t) for t in times]


async def _histogram_means_ms(url: str) -> dict[str, tuple[float, float]]:
    async with new_session() as session, session.get(f"http://{url}/metrics") as resp:
        text = await resp.text()
    return {f: histogram_totals(text, f) for f in (TTFT_FAMILY, ITL_FAMILY)}


def _mean_ms(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], family: str
) -> float | None:
    total = after[family][0] - before[family][0]
    count = after[family][1] - before[family][1]
    return total / count * 1000.0 if count else None


def _sdk_entry(request: GenRequest, at_s: float | None = None) -> dict[str, object]:
    entry: dict[str, object] = {"prompt": request.prompt, "max_tokens": request.output_tokens}
    if at_s is not None:
        entry["at_s"] = at_s
    return entry


def deal(
    times: list[float], settings: Settings
) -> tuple[list[GenRequest], list[GenRequest], list[float], list[float]]:
    """The open loop's requests and times, dealt between loadgen and the SDK in pairs: both
    clients send each request of the workload once (so their throughputs are over the same
    work), in consecutive send times, loadgen first in even pairs and the SDK first in odd
    ones (so neither always follows its twin). Returns loadgen's requests, the SDK's, and their
    send times. An odd number of pairs is used (the last time or two dropped): the last pair
    then has loadgen first too, so each client's span from its first send to its last is the
    same, one send time apart, and their throughputs are over equal spans."""
    pairs = len(times) // 2
    pairs -= 1 if pairs % 2 == 0 else 0
    base = workload(settings, pairs)
    ours: list[GenRequest] = []
    theirs: list[GenRequest] = []
    our_times: list[float] = []
    their_times: list[float] = []
    for k, request in enumerate(base):
        for j, at in enumerate(times[2 * k : 2 * k + 2]):
            if (j == 0) == (k % 2 == 0):
                ours.append(request)
                our_times.append(at)
            else:
                theirs.append(request)
                their_times.append(at)
    return ours, theirs, our_times, their_times


class _Clients:
    """The two clients of one comparison, each with its half of the requests."""

    def __init__(self, url: str, settings: Settings, work_dir: Path) -> None:
        if settings.load not in LOADS:
            raise ValueError(f"load must be one of {', '.join(LOADS)}, got {settings.load!r}")
        self.url = url
        self.settings = settings
        self.our_times: list[float] = []
        if settings.load == "rate":
            self.ours, theirs, self.our_times, their_times = deal(arrivals(settings), settings)
            sdk_work = [_sdk_entry(r, t) for r, t in zip(theirs, their_times, strict=True)]
        else:
            requests = workload(settings, WORKLOAD_SIZE)
            self.ours, theirs = requests[0::2], requests[1::2]
            sdk_work = [_sdk_entry(r) for r in theirs]
        self.workload_path = work_dir / "workload.json"
        self.workload_path.write_text(json.dumps(sdk_work))
        self.sdk_out = work_dir / "sdk.json"
        self.target = GenTarget(
            f"http://{url}", OPENAI_CHAT, settings.model, {"client_id": "loadgen"}
        )
        self._index = 0

    def _next(self) -> GenRequest:
        self._index += 1
        return self.ours[(self._index - 1) % len(self.ours)]

    async def warm(self, session: aiohttp.ClientSession) -> None:
        n = self.settings.warmup_requests
        if n:
            await closed_loop(session, self.target, self._next, concurrency=min(n, 4),
                              request_count=n, duration_s=None)  # fmt: skip

    async def loadgen(self, session: aiohttp.ClientSession) -> list[TimedStream]:
        self._index = 0
        if self.our_times:
            return await open_loop(session, self.target, self.ours, self.our_times)
        return await closed_loop(
            session, self.target, self._next, concurrency=self.settings.concurrency_each,
            request_count=None, duration_s=self.settings.duration_s,
        )  # fmt: skip

    async def start_sdk(self) -> asyncio.subprocess.Process:
        """The SDK client's process, warm and waiting for "go"."""
        s = self.settings
        closed = [] if self.our_times else ["--concurrency", str(s.concurrency_each),
                                        "--duration-s", str(s.duration_s)]  # fmt: skip
        sdk = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.sdk_client",
            "--base-url", f"http://{self.url}/v1", "-m", s.model,
            "--workload", str(self.workload_path), "--warmup", str(s.warmup_requests),
            "-o", str(self.sdk_out), *closed,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=SOURCE_ROOT,
        )  # fmt: skip
        assert sdk.stdout is not None
        try:
            ready = await asyncio.wait_for(sdk.stdout.readline(), 300.0)
        except BaseException:
            await _stop(sdk)
            raise
        if ready.strip() != b"ready":
            await _stop(sdk)
            raise RuntimeError(f"the SDK client did not start: {ready!r}")
        return sdk

    async def sdk_done(self, sdk: asyncio.subprocess.Process) -> dict[str, float]:
        if await sdk.wait() != 0:
            raise RuntimeError(f"the SDK client failed (exit {sdk.returncode})")
        summary: dict[str, float] = json.loads(self.sdk_out.read_text())["summary"]
        return summary


async def _stop(sdk: asyncio.subprocess.Process) -> None:
    if sdk.returncode is None:
        sdk.kill()
        await sdk.wait()


async def _go(sdk: asyncio.subprocess.Process) -> None:
    assert sdk.stdin is not None
    sdk.stdin.write(b"go\n")
    await sdk.stdin.drain()


async def measure(url: str, settings: Settings, work_dir: Path) -> Agreement:
    """Both clients on the sidecar (or OpenAI-compatible server) at ``url`` (``host:port``);
    then, with ``settings.alone``, each client alone on its own requests."""
    clients = _Clients(url, settings, work_dir)
    overheads: dict[str, Overhead] = {}
    async with new_session(timeout_s=600.0) as session:
        await clients.warm(session)
        sdk = await clients.start_sdk()
        try:
            before = await _histogram_means_ms(url)
            await _go(sdk)
            streams = await clients.loadgen(session)
            theirs = await clients.sdk_done(sdk)
        finally:
            await _stop(sdk)
        after = await _histogram_means_ms(url)
        if settings.alone:
            sdk = await clients.start_sdk()
            try:
                start = await _histogram_means_ms(url)
                await _go(sdk)
                alone = await clients.sdk_done(sdk)
            finally:
                await _stop(sdk)
            end = await _histogram_means_ms(url)
            overheads["openai SDK"] = Overhead(alone["ttft_mean_ms"],
                                               _mean_ms(start, end, TTFT_FAMILY))  # fmt: skip
            start = await _histogram_means_ms(url)
            ours_alone = loadgen_figures(GenRun(await clients.loadgen(session)).report())
            end = await _histogram_means_ms(url)
            overheads["loadgen"] = Overhead(ours_alone["ttft_mean_ms"],
                                            _mean_ms(start, end, TTFT_FAMILY))  # fmt: skip
    return Agreement(
        settings,
        loadgen_figures(GenRun(streams).report()),
        theirs,
        _mean_ms(before, after, TTFT_FAMILY),
        _mean_ms(before, after, ITL_FAMILY),
        overheads,
    )


def run_embedded(settings: Settings, state_dir: Path, gpu: str = "a100") -> Agreement:
    """Start the embedded default on a simulated GPU (``max`` policy) and measure."""
    flags = ["--device", f"sim:{gpu}", "--profile-models", "", "--policy", "max", "--max-queue",
             "1024"]  # fmt: skip
    with running(flags, state_dir=state_dir, starts=3) as sc:
        return asyncio.run(measure(sc.url, settings, state_dir))


def _num(value: float | None, digits: int = 1) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


def rows(result: Agreement) -> list[list[str]]:
    out = []
    for key, name, judged in FIGURES:
        diff = result.difference(key)
        within = abs(diff) <= result.settings.tolerance
        verdict = ("yes" if within else "NO") if judged else "(shown)"
        server = {
            "ttft_mean_ms": _num(result.sidecar_ttft_mean_ms, 2),
            "itl_mean_ms": _num(result.sidecar_itl_mean_ms, 2),
        }.get(key, "")
        out.append(
            [
                name,
                _num(result.loadgen.get(key), 2),
                _num(result.sdk.get(key), 2),
                f"{diff:+.1%}" if math.isfinite(diff) else "—",
                verdict,
                server,
            ]
        )
    return out


HEAD = ["figure", "loadgen", "openai SDK", "loadgen vs SDK", "within 10%", "sidecar"]
ALONE_HEAD = ["client alone", "its TTFT mean (ms)", "sidecar's, same requests (ms)",
              "client's own overhead (ms)"]  # fmt: skip


def alone_rows(result: Agreement) -> list[list[str]]:
    return [
        [name, _num(o.client_ttft_ms, 2), _num(o.sidecar_ttft_ms, 2), _num(o.overhead_ms, 2)]
        for name, o in result.alone.items()
    ]


def describe(s: Settings) -> str:
    load = (
        f"{s.request_rate:g} requests/s ({s.arrival}), dealt in pairs"
        if s.load == "rate"
        else f"{s.concurrency_each} streams each"
    )
    return (
        f"{load}, {s.duration_s:g} s, prompts {s.input_tokens_mean}±{s.input_tokens_stddev:g} "
        f"words, {s.output_tokens_mean}±{s.output_tokens_stddev:g} output tokens"
    )


def console_table(title: str, head: list[str], body: list[list[str]]) -> Table:
    table = Table(title=title)
    for col in head:
        table.add_column(col, justify="right")
    for row in body:
        table.add_row(*row)
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.genai_agreement", description=__doc__)
    p.add_argument("--url", default=None, help="host:port of a running server (default: start one)")
    p.add_argument("-m", "--model", default=Settings.model)
    p.add_argument("--load", choices=LOADS, default=Settings.load, help="(rate)")
    p.add_argument("--request-rate", type=float, default=Settings.request_rate,
                   help="--load rate: requests/s of both clients together")  # fmt: skip
    p.add_argument("--arrival-pattern", choices=ARRIVALS, default=Settings.arrival,
                   help="--load rate: how the requests are spaced (constant)")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=2 * Settings.concurrency_each,
                   help="--load concurrency: streams in flight, half each")  # fmt: skip
    p.add_argument("--gpu", default="a100", help="without --url: the simulated GPU (a100)")
    p.add_argument("--duration-s", type=float, default=Settings.duration_s)
    p.add_argument("--input-tokens-mean", type=int, default=Settings.input_tokens_mean)
    p.add_argument("--input-tokens-stddev", type=float, default=Settings.input_tokens_stddev)
    p.add_argument("--output-tokens-mean", type=int, default=Settings.output_tokens_mean)
    p.add_argument("--output-tokens-stddev", type=float, default=Settings.output_tokens_stddev)
    p.add_argument("--seed", type=int, default=Settings.seed)
    p.add_argument("--no-alone", action="store_true",
                   help="skip the runs of each client alone (its own overhead)")  # fmt: skip
    p.add_argument("--results-dir", type=Path, default=DEFAULT_DIR)
    args = p.parse_args(argv)
    if args.concurrency < 2 or args.concurrency % 2:
        print(
            f"error: --concurrency must be even and >= 2, got {args.concurrency}", file=sys.stderr
        )
        return 2
    settings = Settings(
        model=args.model,
        load=args.load,
        request_rate=args.request_rate,
        arrival=args.arrival_pattern,
        concurrency_each=args.concurrency // 2,
        duration_s=args.duration_s,
        input_tokens_mean=args.input_tokens_mean,
        input_tokens_stddev=args.input_tokens_stddev,
        output_tokens_mean=args.output_tokens_mean,
        output_tokens_stddev=args.output_tokens_stddev,
        seed=args.seed,
        alone=not args.no_alone,
    )
    console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)
    with tempfile.TemporaryDirectory(prefix="genai-agreement-") as tmp:
        if args.url is None:
            console.print(f"starting the embedded default (simulated {args.gpu}, simllm) …")
            result = run_embedded(settings, Path(tmp), args.gpu)
        else:
            result = asyncio.run(measure(args.url, settings, Path(tmp)))
    console.print(console_table(f"same run, two clients: {describe(settings)}", HEAD,
                                rows(result)))  # fmt: skip
    verdict = "agree" if result.agrees else "DO NOT agree"
    console.print(f"loadgen and the openai SDK {verdict} within {settings.tolerance:.0%}")
    markdown = f"Same run, two clients: {describe(settings)}.\n\n" + markdown_table(
        HEAD, rows(result)
    )
    markdown += f"\n\nVerdict: {verdict}.\n"
    if result.alone:
        title = "then each client alone on its own requests (the same arrivals)"
        console.print(console_table(title, ALONE_HEAD, alone_rows(result)))
        markdown += f"\n{title[0].upper()}{title[1:]}:\n\n"
        markdown += markdown_table(ALONE_HEAD, alone_rows(result)) + "\n"
    md, _ = write_results(
        "genai_agreement",
        title="loadgen's generative mode against the openai SDK, same run",
        markdown=markdown,
        data={**asdict(result), "agrees": result.agrees},
        directory=args.results_dir,
    )
    console.print(f"wrote {md}")
    return 0 if result.agrees else 1


if __name__ == "__main__":
    sys.exit(main())
