"""``python -m dvfs list | reset | set | delay``: see and steer GPU clocks, and time a change."""

from __future__ import annotations

import argparse
import math
import sys

from rich.console import Console
from rich.table import Table

from dvfs.errors import DeviceError, NoDeviceError
from dvfs.profiles import PROFILES

PIPE_WIDTH = 160  # rich's 80-column default truncates tables in logs and pipes


def _cmd_list(console: Console) -> int:
    from dvfs.nvml import NvmlDevice, nvml_device_count

    try:
        count = nvml_device_count()
    except NoDeviceError as err:
        console.print(f"NVML GPUs: none ({err})")
        count = 0
    else:
        if not count:
            console.print("NVML GPUs: none (NVML is loaded but sees no GPU)")
    if count:
        table = Table(title="NVML GPUs")
        for col in ("index", "name", "uuid", "clock MHz", "clocks MHz", "power W"):
            table.add_column(col)
        for i in range(count):
            dev = NvmlDevice(i)
            try:
                clocks = dev.supported_clocks_mhz()
                table.add_row(
                    str(i),
                    dev.identity.name,
                    dev.identity.uuid,
                    str(dev.clock_mhz()),
                    f"{clocks[0]}..{clocks[-1]} ({len(clocks)})",
                    f"{dev.power_w():.1f}",
                )
            finally:
                dev.close()
        console.print(table)
    sims = Table(title="Simulated GPU profiles (use as --device sim:<name>)")
    for col in (
        "name",
        "model of",
        "clocks MHz",
        "latency ms (top..bottom)",
        "std ms",
        "idle..busy W",
        "energy-optimal MHz",
    ):
        sims.add_column(col)
    for p in PROFILES.values():
        sims.add_row(
            p.name,
            p.full_name,
            f"{p.min_clock_mhz}..{p.max_clock_mhz} ({len(p.clocks_mhz)})",
            f"{p.latency_at_max_ms:g}..{p.latency_at_min_ms:g}",
            f"{p.latency_std_ms:g}",
            f"{p.idle_w:g}..{p.busy_max_w:g}",
            str(p.energy_optimal_clock_mhz()),
        )
    console.print(sims)
    return 0


def _cmd_reset(console: Console, gpu: int | None) -> int:
    from dvfs.nvml import NvmlDevice, nvml_device_count

    indices = [gpu] if gpu is not None else list(range(nvml_device_count()))
    for i in indices:
        dev = NvmlDevice(i, reset_at_exit=False)
        try:
            dev.reset()
            console.print(f"GPU {i} ({dev.identity.name}): locked clocks reset")
        finally:
            dev.close()
    if not indices:
        console.print("no NVML GPUs to reset")
    return 0


def _cmd_set(console: Console, gpu: int, clock_mhz: int) -> int:
    from dvfs.nvml import NvmlDevice

    dev = NvmlDevice(gpu, reset_at_exit=False)
    try:
        dev.set_clock_mhz(clock_mhz)
        console.print(
            f"GPU {gpu} ({dev.identity.name}) locked at {clock_mhz} MHz; "
            "`python -m dvfs reset` gives it back"
        )
    finally:
        dev.close()
    return 0


def _cmd_delay(console: Console, gpu: int, sim: str | None, changes: int) -> int:
    from dvfs.clockdelay import TIMEOUT_S, measure_changes, summary_ms
    from dvfs.factory import open_device

    device = open_device(f"sim:{sim}" if sim is not None else f"nvml:{gpu}")
    try:
        name = device.identity.name
        result = measure_changes(device, changes)
    finally:
        device.close()
    stats = summary_ms(result)
    view = Table(title=f"{name}: a locked clock, read back until it shows (ms)")
    for col in ("changes", "not landed", "min", "median", "p90", "max"):
        view.add_column(col, justify="right")
    view.add_row(
        str(stats["changes"]),
        str(stats["not_landed"]),
        *(f"{stats[k]:.1f}" for k in ("min_ms", "median_ms", "p90_ms", "max_ms")),
    )
    console.print(view)
    p90 = float(stats["p90_ms"])
    if not math.isnan(p90):  # some landed
        console.print(
            f"plan with it: --slack-change-delay-ms {math.ceil(p90)} "
            "(policy.slack.change_delay_ms); an idle GPU may read lower than it is locked at: "
            "measure it while it serves"
        )
    else:
        console.print(
            f"no change showed within {TIMEOUT_S:g} s: the GPU may be idle below its locked clock"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dvfs", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="GPUs NVML sees, and the simulated profiles")
    p_reset = sub.add_parser("reset", help="give locked clocks back (after a crash, say)")
    p_reset.add_argument("--gpu", type=int, default=None, help="one GPU index (default: all)")
    p_set = sub.add_parser("set", help="lock one GPU's graphics clock")
    p_set.add_argument("--gpu", type=int, default=0)
    p_set.add_argument("--clock-mhz", type=int, required=True)
    p_delay = sub.add_parser(
        "delay", help="time how long a locked clock takes to show (changes the GPU's clock)"
    )
    p_delay.add_argument("--gpu", type=int, default=0)
    p_delay.add_argument("--sim", default=None, help="a simulated GPU's profile instead")
    p_delay.add_argument("--changes", type=int, default=12, help="clock changes to time (12)")
    args = parser.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)
    try:
        if args.cmd == "list":
            return _cmd_list(console)
        if args.cmd == "reset":
            return _cmd_reset(console, args.gpu)
        if args.cmd == "delay":
            return _cmd_delay(console, args.gpu, args.sim, args.changes)
        return _cmd_set(console, args.gpu, args.clock_mhz)
    except (DeviceError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
