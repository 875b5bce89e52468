"""SIGTERM ends the sidecar within its grace period, even with Triton frozen."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx

from tests.api.process import descendants, start_sidecar, tritonserver_pids

BODY = (
    b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": '
    + str([1.0] * 16).encode()
    + b"}]}"
)


def test_sigterm_with_triton_frozen_exits_within_the_grace_period(tmp_path: Path) -> None:
    grace_s = 3.0
    proc, url = start_sidecar(tmp_path, "--shutdown-grace-s", str(grace_s))
    frozen: list[int] = []
    try:
        frozen = tritonserver_pids(proc.pid)
        assert len(frozen) == 1
        below = descendants(proc.pid)
        os.kill(frozen[0], signal.SIGSTOP)
        replies: list[int] = []

        def send() -> None:
            replies.append(httpx.post(f"http://{url}/v2/models/simnet/infer", content=BODY,
                                      timeout=120).status_code)  # fmt: skip

        senders = [threading.Thread(target=send) for _ in range(4)]  # 2 in flight, 2 queued
        for t in senders:
            t.start()
        time.sleep(1.0)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=grace_s + 30)
        took = time.monotonic() - sent
        for t in senders:
            t.join(10)
        print(f"SIGTERM with Triton frozen: exit {code} after {took:.1f} s (grace {grace_s} s)")
        assert took < grace_s + 10
        assert replies == [503] * 4
        deadline = time.monotonic() + 10
        while left := {p: c for p, c in below.items() if Path(f"/proc/{p}").exists()}:
            assert time.monotonic() < deadline, f"left running: {left}"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_sigterm_lets_accepted_work_finish_then_exits(tmp_path: Path) -> None:
    token = tmp_path / "admin-token"
    token.write_text("s3cret\n")
    proc, url = start_sidecar(
        tmp_path, "--shutdown-grace-s", "20", "--admin-token-file", str(token)
    )
    clients = [httpx.Client(base_url=f"http://{url}", timeout=60) for _ in range(6)]
    try:
        auth = {"Authorization": "Bearer s3cret"}
        r = clients[0].put("/admin/clock", json={"clock_mhz": 135}, headers=auth)
        assert r.status_code == 200  # about 100 ms a request, two at a time
        replies: list[int] = []

        def send(i: int) -> None:
            replies.append(clients[i].post("/v2/models/simnet/infer", content=BODY).status_code)

        senders = [threading.Thread(target=send, args=(i,)) for i in range(6)]
        for t in senders:
            t.start()
        time.sleep(0.15)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=40) == 0
        took = time.monotonic() - sent
        for t in senders:
            t.join(10)
        assert replies == [200] * 6  # accepted work finished inside the grace period
        assert took < 15, f"exit took {took:.1f} s, though the queue emptied at once"
    finally:
        for c in clients:
            c.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_sigkilled_sidecar_is_recovered_on_the_next_start(tmp_path: Path) -> None:
    first, _ = start_sidecar(tmp_path)
    below = descendants(first.pid)
    locks = list((tmp_path / "locks").glob("*.json"))
    assert len(locks) == 1
    record = json.loads(locks[0].read_text())
    assert record["pid"] == first.pid and Path(record["tmp_dir"]).is_dir()
    first.send_signal(signal.SIGKILL)
    first.wait()
    deadline = time.monotonic() + 30  # its embedded Triton notices and goes
    while [p for p in below if Path(f"/proc/{p}").exists()]:
        assert time.monotonic() < deadline, "the killed sidecar's Triton stayed"
        time.sleep(0.2)
    second, _ = start_sidecar(tmp_path)
    try:
        log = (tmp_path / "sidecar.log").read_text()
        assert f"a previous sidecar (pid {first.pid}" in log and "resetting its clock" in log
        assert not Path(record["tmp_dir"]).exists()
        assert json.loads(locks[0].read_text())["pid"] == second.pid
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=40) == 0
        assert not locks[0].exists()  # a clean exit gave the clock back and the record with it
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
