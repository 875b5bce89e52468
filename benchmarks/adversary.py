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

from api.embedded import free_port

VALID = (
    b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": '
    + str([1.0] * 16).encode()
    + b"}]}"
)


def descendants(pid: int) -> dict[int, bytes]:
    """Every process below ``pid`` (children, theirs, ...): pid → command line."""
    children: dict[int, list[int]] = {}
    cmds: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmds[int(entry.name)] = (entry / "cmdline").read_bytes()
                children.setdefault(ppid, []).append(int(entry.name))
    found: dict[int, bytes] = {}
    frontier = [pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found[child] = cmds.get(child, b"")
            frontier.append(child)
    return found


def tritonserver_pids(pid: int) -> list[int]:
    """The ``tritonserver`` processes below ``pid``."""
    return [
        p for p, cmd in descendants(pid).items() if cmd.split(b"\0")[0].endswith(b"/tritonserver")
    ]


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Sidecar:
    def __init__(self, tree: Path, state_dir: Path, extra: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (state_dir / f"sidecar-{self.port}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "api", "serve", "--port", str(self.port), "--policy", "max",
             "--state-dir", str(state_dir), "--profile-clocks", "6", "--profile-requests", "10",
             *extra],
            cwd=tree, stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(tree)},
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/v2/health/ready", timeout=2).status_code == 200:
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(f"the sidecar exited; see {self.log.name}")
            time.sleep(0.3)
        raise TimeoutError("the sidecar did not get ready")

    def close(self) -> None:
        pids = list(descendants(self.proc.pid))
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


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


def metrics_and_big_body(sc: Sidecar) -> None:
    url = sc.url
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


def absurd_shape(sc: Sidecar) -> None:
    url = sc.url
    shape = VALID.replace(b"[1, 16]", b"[1, 1000000000000]")
    r = httpx.post(f"{url}/v2/models/simnet/infer", content=shape, timeout=60)
    back = _served(url, 30.0)
    print(
        f"shape [1, 10^12]: answered {r.status_code}; a valid request served "
        + ("again " + f"{back:.1f} s later" if back is not None else "NOT within 30 s")
        + f"; /v2/health/live {httpx.get(f'{url}/v2/health/live').status_code}"
    )


def kill_triton(sc: Sidecar) -> None:
    for pid in tritonserver_pids(sc.proc.pid):
        os.kill(pid, signal.SIGKILL)
    back = _served(sc.url, 60.0)
    print(
        "kill -9 of Triton: "
        + (f"served again after {back:.1f} s" if back else "NOT served again within 60 s")
        + f"; /v2/health/live {httpx.get(f'{sc.url}/v2/health/live').status_code}"
    )


def frozen_sigterm(sc: Sidecar) -> None:
    for pid in tritonserver_pids(sc.proc.pid):
        os.kill(pid, signal.SIGSTOP)

    def stuck() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{sc.url}/v2/models/simnet/infer", content=VALID, timeout=400)

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
    with tempfile.TemporaryDirectory(prefix="adversary-") as tmp:
        for step in (metrics_and_big_body, absurd_shape, kill_triton, frozen_sigterm):
            sc = Sidecar(args.tree.resolve(), Path(tmp), args.serve_args)
            try:
                step(sc)
            finally:
                sc.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
