"""``scripts/gpu-check`` (``python -m gpucheck``): the whole stack on a real NVIDIA GPU, read-only.

1. NVML, read-only: identity, clock ladder, current clock, power, the energy counter and its
   refresh interval.
2. A real Triton (PyTriton) serving torchvision's ResNet-50 with random weights on the GPU:
   latency, throughput and energy per inference at the GPU's current clock, batch 1..8.
3. The sidecar in shadow mode in front of it: the clock the slack policy would choose for the
   SLO, and the sidecar's overhead against direct Triton (throughput kept, p50/p99 added), at
   each depth asked for and, with two priority levels in the requests, at its default depth.

It never changes the GPU's clocks, power limit or any other setting: before anything else every
NVML function that is not a read is replaced by one that raises (:mod:`gpucheck.guard`), in this
process and in the sidecar's; the device is a :class:`dvfs.readonly.ReadOnlyDevice`; the sidecar
runs in shadow mode only. Locking clocks to profile a real table needs root and is not done:
the table for the policy is extrapolated from the one clock the GPU runs at (see
:func:`one_clock_table`). Without an NVIDIA GPU it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucheck.measure import Measurement
    from loadgen.classes import RequestClass
    from time2clock.table import Time2ClockTable

NO_GPU_EXIT = 2
TITLE = "The whole stack on a real GPU, read-only (scripts/gpu-check)"
TABLE_TRIM = 0.2  # the trimmed mean of the one-clock table (time2clock's own default)
LEVELS_LABEL = "sidecar:levels"  # the sidecar at its default depth, two priority levels
log = logging.getLogger("gpucheck")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to check")
    parser.add_argument("--slo-ms", type=float, default=15.0, help="SLO for the policy's clock")
    parser.add_argument("--max-batch", type=int, default=8, help="batch sizes 1..N")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument(
        "--triton-batches",
        type=int,
        nargs="+",
        default=[1, 2],
        help="full batches the shadow sidecar keeps at Triton (its --triton-batches and "
        "--triton-batches-alone): one sidecar measured per value",
    )
    parser.add_argument(
        "--levels-share",
        type=float,
        default=0.1,
        help="a last sidecar, at its default depth, measured at the highest concurrency with "
        "this share of the requests at priority 1 and the rest at the default level, against "
        "direct Triton with the same two levels (0: not measured)",
    )
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--window-s", type=float, default=4.0)
    parser.add_argument("-o", "--out", type=Path, default=Path("out/gpu-check"))
    args = parser.parse_args(argv)
    if not 0.0 <= args.levels_share < 1.0:
        parser.error(f"--levels-share must be in [0, 1), got {args.levels_share}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import pynvml

    from gpucheck.guard import forbid_nvml_writes

    forbid_nvml_writes(pynvml)  # first: nothing below can change the GPU
    from dvfs.errors import NoDeviceError
    from dvfs.nvml import NvmlDevice, nvml_device_count
    from dvfs.readonly import ReadOnlyDevice

    try:
        count = nvml_device_count()
    except NoDeviceError as err:
        print(f"gpu-check: no NVIDIA GPU here, nothing was checked ({err})", file=sys.stderr)
        return NO_GPU_EXIT
    if not 0 <= args.gpu < count:
        print(f"gpu-check: no GPU {args.gpu}; NVML sees {count} GPU(s)", file=sys.stderr)
        return NO_GPU_EXIT
    args.out.mkdir(parents=True, exist_ok=True)
    device = ReadOnlyDevice(NvmlDevice(args.gpu, reset_at_exit=False))
    try:
        report = run(args, device)
    finally:
        device.close()
    from simulator.results import write_results

    md, js = write_results(
        "report", title=TITLE, markdown=report_markdown(report), data=report, directory=args.out
    )
    print_report(report)
    print(f"\nwrote {md} and {js}")
    return 0


def run(args: argparse.Namespace, device: Any) -> dict[str, Any]:
    """Everything the check measures, as one JSON-able report."""
    import numpy as np

    from api.embedded import EmbeddedTriton
    from gpucheck.measure import ONE_CLASS, calibrate, energy_counter, measure
    from gpucheck.resnet import INPUT_SHAPE, RESNET, bind_resnet

    clocks = device.supported_clocks_mhz()
    counter = energy_counter(device)
    interval_s = calibrate(counter)
    report: dict[str, Any] = {
        "gpu": {
            "index": device.identity.index,
            "name": device.identity.name,
            "uuid": device.identity.uuid,
            "clocks_mhz": clocks,
            "clock_mhz_idle": device.clock_mhz(),
            "power_w_idle": device.power_w(),
            "energy_counter_refresh_s": interval_s,
        },
        "slo_ms": args.slo_ms,
        "levels_share": args.levels_share,
    }
    log.info(
        "GPU %s: %d clocks %d..%d MHz", device.identity.name, len(clocks), clocks[0], clocks[-1]
    )
    _require_cuda()
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((args.max_batch, *INPUT_SHAPE)).astype(np.float32)
    with EmbeddedTriton(
        args.out / "triton.state",
        instances=1,
        binder=bind_resnet,
        ready_model=RESNET,
        start_timeout_s=600.0,
    ) as triton:

        def window(
            label: str,
            url: str,
            batch: int,
            concurrency: int,
            classes: tuple[RequestClass, ...] = ONE_CLASS,
        ) -> Measurement:
            log.info("%s: batch %d, concurrency %d", label, batch, concurrency)
            return measure(
                label=label,
                url=url,
                model=RESNET,
                data=inputs[:batch],
                concurrency=concurrency,
                device=device,
                counter=counter,
                warmup_s=args.warmup_s,
                window_s=args.window_s,
                classes=classes,
            )

        batches = [window("direct", triton.url, b, 1) for b in range(1, args.max_batch + 1)]
        report["batches"] = [m.to_json() for m in batches]
        table, measured_mhz = one_clock_table(batches[0], clocks, device.identity.name)
        table_path = args.out / "table.json"
        from time2clock.table import ModelTable, TableSet

        TableSet([ModelTable.single(table)]).save(table_path)
        chosen, met = table.lowest_clock_mhz(args.slo_ms, "p99")
        report["policy"] = {
            "table": str(table_path),
            "table_from_clock_mhz": measured_mhz,
            "offline_clock_mhz": chosen,
            "offline_slo_met": met,
        }
        overhead: list[Measurement] = []

        def shadow(depth: int | None) -> ShadowSidecar:
            return ShadowSidecar(
                args.out,
                triton.url,
                table_path,
                device_spec=f"nvml:{args.gpu}",
                slo_ms=args.slo_ms,
                max_inflight=max(args.concurrency),
                triton_batches=depth,
            )

        for n in args.triton_batches:
            with shadow(n) as sidecar:
                for c in args.concurrency:  # direct and sidecar paired, back to back
                    overhead.append(window("direct", triton.url, 1, c))
                    overhead.append(window(f"sidecar:{n}", sidecar.url, 1, c))
                if "shadow" not in report["policy"]:
                    report["policy"]["shadow"] = sidecar.admin("/admin/state").get("shadow")
        if args.levels_share > 0:
            levels = two_levels(args.levels_share)
            top = max(args.concurrency)
            with shadow(None) as sidecar:  # the sidecar's own depths
                overhead.append(window("direct", triton.url, 1, top, levels))
                overhead.append(window(LEVELS_LABEL, sidecar.url, 1, top, levels))
        report["overhead"] = [m.to_json() for m in overhead]
        report["overhead_summary"] = overhead_summary(overhead)
    return report


def two_levels(share: float) -> tuple[RequestClass, ...]:
    """Request classes for the two-level run: ``share`` of the requests at priority 1 (the
    highest), the rest at the default level (the model's lowest)."""
    from loadgen.classes import RequestClass

    return (RequestClass("high", share, priority=1), RequestClass("default", 1.0 - share))


def overhead_summary(runs: list[Measurement]) -> list[dict[str, Any]]:
    """Per sidecar run: the share of direct Triton's throughput it keeps, and the p50 and p99
    it adds, against the direct run of the same concurrency measured last before it."""
    out = []
    direct_at: dict[int, Measurement] = {}
    for via in runs:
        if via.label == "direct":
            direct_at[via.concurrency] = via
            continue
        direct = direct_at.get(via.concurrency)
        if direct is None:
            raise ValueError(f"no direct run before {via.label} at concurrency {via.concurrency}")
        out.append(
            {
                "path": via.label,
                "concurrency": direct.concurrency,
                "throughput_kept": via.inferences_per_s / direct.inferences_per_s,
                "p50_added_ms": via.p50_ms - direct.p50_ms,
                "p99_added_ms": via.p99_ms - direct.p99_ms,
            }
        )
    return out


def one_clock_table(
    at_clock: Measurement, clocks_mhz: list[int], gpu: str
) -> tuple[Time2ClockTable, int]:
    """A time2clock table from batch-1 latencies at the one clock the GPU ran (locking other
    clocks to profile them needs root, which this check never uses): the latencies' center is
    carried to every clock of the ladder by seed 003's law with ``b = 0`` (time ∝ 1/clock), and
    each latency keeps its own distance from that center, the spread the table takes to be the
    same at every clock (:func:`time2clock.fit.residual_quantiles`). Scaling the spread too
    would widen it at the low clocks, and the pooled tail would then put the measured clock's
    p99 above what was measured there. An assumption, not a measurement: the real table comes
    from ``python -m time2clock profile``. Energy per inference is known at the measured clock
    only. Returns the table and that clock."""
    from time2clock.fit import fit_table, trimmed_mean

    measured = min(clocks_mhz, key=lambda c: abs(c - at_clock.clock_mhz_mean))
    center_ms = trimmed_mean(at_clock.latencies_ms, TABLE_TRIM)
    samples = {
        c: [center_ms * measured / c + (ms - center_ms) for ms in at_clock.latencies_ms]
        for c in clocks_mhz
    }
    energy = (
        {}
        if at_clock.energy_per_inference_j is None
        else {measured: at_clock.energy_per_inference_j}
    )
    table = fit_table(
        samples, trim=TABLE_TRIM, gpu=gpu, model="resnet50", concurrency=1, energy_j=energy
    )
    return table, measured


def _require_cuda() -> None:
    try:
        import torch
        import torchvision  # noqa: F401
    except ImportError as err:
        raise SystemExit(f"gpu-check needs PyTorch and torchvision: {err}") from None
    if not torch.cuda.is_available():
        raise SystemExit("gpu-check: NVML sees a GPU but PyTorch has no CUDA device")


class ShadowSidecar:
    """``python -m gpucheck.sidecar`` (the sidecar, shadow mode, NVML writes forbidden) as a
    separate process, so that its cost is not hidden in the load generator's."""

    def __init__(
        self,
        out_dir: Path,
        triton_url: str,
        table: Path,
        *,
        device_spec: str,
        slo_ms: float,
        max_inflight: int,
        triton_batches: int | None = 1,
    ) -> None:
        """``triton_batches``: both depths (``--triton-batches`` and ``--triton-batches-alone``);
        None: the sidecar's defaults."""
        from api.embedded import free_port

        self.port = free_port()
        self.token = secrets.token_hex(16)
        self._tmp = tempfile.TemporaryDirectory(prefix="gpu-check-")
        self.argv = [
            sys.executable, "-m", "gpucheck.sidecar",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--triton-url", triton_url, "--device", device_spec,
            "--policy", "slack", "--table", str(table), "--slo-ms", str(slo_ms),
            "--max-inflight", str(max_inflight), "--max-queue", "10000",
            "--admin-token", self.token, "--state-dir", self._tmp.name, "--log-level", "warning",
        ]  # fmt: skip
        if triton_batches is not None:
            depth = str(triton_batches)
            self.argv += ["--triton-batches", depth, "--triton-batches-alone", depth]
        name = "default" if triton_batches is None else f"{triton_batches}b"
        self.log_path = out_dir / f"sidecar-{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def admin(self, path: str) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://{self.url}{path}", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            data: dict[str, Any] = json.load(reply)
        return data

    def __enter__(self) -> ShadowSidecar:
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"the sidecar exited ({self.proc.returncode}); see {self.log_path}"
                )
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/health/ready", timeout=2):
                    return self
            except OSError:
                time.sleep(0.2)
        self.__exit__()
        raise SystemExit(f"the sidecar was not ready in 120 s; see {self.log_path}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._tmp.cleanup()


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=int(os.environ.get("COLUMNS", "120")))
    gpu = report["gpu"]
    console.print(
        f"[bold]{gpu['name']}[/] ({gpu['uuid']}), GPU {gpu['index']}: "
        f"{len(gpu['clocks_mhz'])} clocks {gpu['clocks_mhz'][0]}..{gpu['clocks_mhz'][-1]} MHz; "
        f"idle {gpu['clock_mhz_idle']} MHz, {gpu['power_w_idle']:.1f} W; energy counter "
        f"refresh {_fmt(gpu['energy_counter_refresh_s'], 1000, 'ms')}"
    )
    for title, rows in (
        ("ResNet-50 direct to Triton, concurrency 1, GPU at its own clock", report["batches"]),
        ("Sidecar (shadow) vs direct, batch 1", report["overhead"]),
    ):
        table = Table(title=title)
        for col in (
            "path", "batch", "conc", "inf/s", "p50 ms", "p99 ms", "J/inf", "W", "MHz", "busy"
        ):  # fmt: skip
            table.add_column(col, justify="right")
        for m in rows:
            table.add_row(*_cells(m))
        console.print(table)
    for row in report["overhead_summary"]:
        what = (
            f"its default depth, {report.get('levels_share', 0):.0%} at priority 1"
            if row["path"] == LEVELS_LABEL
            else f"--triton-batches {row['path'].partition(':')[2] or 1}"
        )
        console.print(
            f"{row['path']} ({what}) at concurrency {row['concurrency']}: "
            f"{row['throughput_kept']:.1%} of direct throughput kept, "
            f"p50 {row['p50_added_ms']:+.2f} ms, p99 {row['p99_added_ms']:+.2f} ms"
        )
    policy = report["policy"]
    shadow = policy.get("shadow") or {}
    console.print(
        f"SLO {report['slo_ms']:g} ms: the slack policy would choose "
        f"{policy['offline_clock_mhz']} MHz (table extrapolated from one clock; "
        f"{'meets' if policy['offline_slo_met'] else 'cannot meet'} the SLO); the live shadow "
        f"sidecar's target: {shadow.get('clock_target_mhz')} MHz, GPU ran "
        f"{shadow.get('gpu_clock_mhz')} MHz"
    )


def report_markdown(report: dict[str, Any]) -> str:
    """The report as the Markdown of a results file (what :func:`print_report` prints)."""
    from simulator.results import markdown_table

    gpu = report["gpu"]
    head = ["path", "batch", "concurrency", "inferences/s", "p50 ms", "p99 ms", "J/inference",
            "W", "clock MHz", "GPU busy"]  # fmt: skip

    def rows(runs: list[dict[str, Any]]) -> list[list[str]]:
        return [_cells(m) for m in runs]

    summary = [
        [row["path"], str(row["concurrency"]), f"{row['throughput_kept']:.1%}",
         f"{row['p50_added_ms']:+.2f}", f"{row['p99_added_ms']:+.2f}"]
        for row in report["overhead_summary"]
    ]  # fmt: skip
    policy = report["policy"]
    shadow = policy.get("shadow") or {}
    return "\n\n".join(
        [
            f"{gpu['name']} (GPU {gpu['index']}): {len(gpu['clocks_mhz'])} clocks "
            f"{gpu['clocks_mhz'][0]}..{gpu['clocks_mhz'][-1]} MHz; idle "
            f"{gpu['clock_mhz_idle']} MHz, {gpu['power_w_idle']:.1f} W; energy counter refresh "
            f"{_fmt(gpu['energy_counter_refresh_s'], 1000, 'ms')}. Nothing on the GPU was "
            "changed: every figure is at the clock the GPU chose itself.",
            "ResNet-50 (torchvision, random weights, FP32, PyTorch eager) in a real Triton "
            "(PyTriton), straight to Triton, one client:",
            markdown_table(head, rows(report["batches"])),
            "The sidecar in shadow mode (`sidecar:N`: N full batches at Triton, "
            "`--triton-batches N --triton-batches-alone N`"
            + (
                f"; `sidecar:levels`: the sidecar's default depth, {share:.0%} of the requests "
                "at priority 1 and the rest at the default level, the model's batcher having "
                "two priority levels"
                if (share := report.get("levels_share", 0))
                else ""
            )
            + ") against the direct run measured just before it with the same requests, batch 1:",
            markdown_table(head, rows(report["overhead"])),
            markdown_table(
                ["path", "concurrency", "throughput kept", "p50 added ms", "p99 added ms"],
                summary,
            ),
            f"SLO {report['slo_ms']:g} ms: the slack policy would choose "
            f"{policy['offline_clock_mhz']} MHz from a table extrapolated from the one clock "
            f"measured ({'meets' if policy['offline_slo_met'] else 'cannot meet'} the SLO); the "
            f"first shadow sidecar's target after its load: {shadow.get('clock_target_mhz')} "
            f"MHz, the GPU ran {shadow.get('gpu_clock_mhz')} MHz.",
        ]
    )


def _cells(m: dict[str, Any]) -> list[str]:
    """One measurement's row, as both the console and the Markdown report show it."""
    return [
        m["label"], str(m["batch"]), str(m["concurrency"]), f"{m['inferences_per_s']:.1f}",
        f"{m['p50_ms']:.2f}", f"{m['p99_ms']:.2f}", _fmt(m["energy_per_inference_j"], 1, ""),
        _fmt(m["power_w"], 1, ""), f"{m['clock_mhz_min']}..{m['clock_mhz_max']}",
        _share(m.get("gpu_busy_share")),
    ]  # fmt: skip


def _share(value: float | None) -> str:
    """The GPU's busy share of a window (its utilization samples), or n/a."""
    return "n/a" if value is None else f"{value:.0%}"


def _fmt(value: float | None, scale: float, unit: str) -> str:
    return "n/a" if value is None else f"{value * scale:.3g}{(' ' + unit) if unit else ''}"


if __name__ == "__main__":
    sys.exit(main())
