"""``python -m benchmarks.adversary``: the hardening figures, measured against a real sidecar.

Starts ``python -m api serve`` (the embedded default) from a source tree (``--tree``, default
this one, so an older checkout can be measured with the same command), attacks it as an
adversarial operator would and prints one line per figure: a 10^12-element shape, 2,000 requests
to made-up model names (metric series), a 200 MB body (the sidecar's peak RSS and another
client's latency meanwhile), ``kill -9`` of Triton (time until served again), and SIGTERM with
Triton frozen by SIGSTOP (time until the process exits).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import httpx

from benchmarks.sidecar import SidecarProcess, running, tritonserver_pids

VALID = (
    b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": '
    + str([1.0] * 16).encode()
    + b"}]}"
)


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _base(sc: SidecarProcess) -> str:
    return f"http://{sc.url}"


def _series(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def _served(url: str, within_s: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < within_s:
        with contextlib.suppress(httpx.HTTPError):
            if (
                httpx.post(f"{url}/v2/models/simnet/infer", content=VALID, timeout=5).status_code
                == 200
            ):
                return time.monotonic() - start
        time.sleep(0.1)
    return None


def metrics_and_big_body(sc: SidecarProcess) -> None:
    url = _base(sc)
    before = _series(url)
    with httpx.Client(timeout=30) as client:
        for i in range(2000):
            name = "x" * 10_000 if i == 0 else ("nul\0" if i == 1 else f"made-up-{i}")
            client.post(f"{url}/v2/models/{quote(name)}/infer", content=VALID)
    print(f"metric series: {before} before, {_series(url)} after 2,000 made-up model names")

    rss = _rss_mb(sc.proc.pid)
    big = (
        b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": ['
        + (b"1.0, " * 40_000_000)
        + b"1.0]}]}"
    )
    waits: list[float] = []
    status: list[object] = []

    def send_big() -> None:
        try:
            status.append(
                httpx.post(f"{url}/v2/models/simnet/infer", content=big, timeout=120).status_code
            )
        except httpx.HTTPError as err:
            status.append(type(err).__name__)

    sender = threading.Thread(target=send_big)
    sender.start()
    with httpx.Client(timeout=60) as client:
        while sender.is_alive():
            t0 = time.monotonic()
            client.get(f"{url}/v2/health/live")
            waits.append(time.monotonic() - t0)
            time.sleep(0.05)
    sender.join()
    print(
        f"200 MB body: answered {status[0]}; sidecar RSS {rss:.0f} MB before, peak "
        f"{_rss_mb(sc.proc.pid, 'VmHWM'):.0f} MB; another client's longest wait "
        f"{max(waits, default=0.0) * 1000:.0f} ms"
    )


def absurd_shape(sc: SidecarProcess) -> None:
    url = _base(sc)
    shape = VALID.replace(b"[1, 16]", b"[1, 1000000000000]")
    r = httpx.post(f"{url}/v2/models/simnet/infer", content=shape, timeout=60)
    back = _served(url, 30.0)
    print(
        f"shape [1, 10^12]: answered {r.status_code}; a valid request served "
        + ("again " + f"{back:.1f} s later" if back is not None else "NOT within 30 s")
        + f"; /v2/health/live {httpx.get(f'{url}/v2/health/live').status_code}"
    )


def kill_triton(sc: SidecarProcess) -> None:
    for pid in tritonserver_pids(sc.proc.pid):
        os.kill(pid, signal.SIGKILL)
    back = _served(_base(sc), 60.0)
    print(
        "kill -9 of Triton: "
        + (f"served again after {back:.1f} s" if back else "NOT served again within 60 s")
        + f"; /v2/health/live {httpx.get(f'{_base(sc)}/v2/health/live').status_code}"
    )


def frozen_sigterm(sc: SidecarProcess) -> None:
    for pid in tritonserver_pids(sc.proc.pid):
        os.kill(pid, signal.SIGSTOP)

    def stuck() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{_base(sc)}/v2/models/simnet/infer", content=VALID, timeout=400)

    threading.Thread(target=stuck, daemon=True).start()
    time.sleep(1.0)
    start = time.monotonic()
    sc.proc.send_signal(signal.SIGTERM)
    try:
        sc.proc.wait(timeout=120)
        print(f"SIGTERM with Triton frozen: exited after {time.monotonic() - start:.1f} s")
    except subprocess.TimeoutExpired:
        print("SIGTERM with Triton frozen: still running after 120 s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adversary", description=__doc__)
    parser.add_argument("--tree", type=Path, default=Path.cwd(), help="source tree to run")
    parser.add_argument("serve_args", nargs="*", help="extra flags for python -m api serve")
    args = parser.parse_args(argv)
    tree = args.tree.resolve()
    flags = ["--policy", "max", "--profile-clocks", "6", "--profile-requests", "10"]
    with tempfile.TemporaryDirectory(prefix="adversary-") as tmp:
        for step in (metrics_and_big_body, absurd_shape, kill_triton, frozen_sigterm):
            with running(
                [*flags, *args.serve_args],
                state_dir=Path(tmp),
                log_path=Path(tmp) / f"sidecar-{step.__name__}.log",
                cwd=tree,
                env={"PYTHONPATH": str(tree)},
                start_timeout_s=300.0,
            ) as sc:
                step(sc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
