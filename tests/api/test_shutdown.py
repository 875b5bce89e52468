"""SIGTERM ends the sidecar within its grace period, even with Triton frozen; ``kill -9`` leaves
no process of its tree running for more than 10 s, and the next start recovers what it held."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import httpx

from benchmarks.sidecar import (
    SidecarProcess,
    descendants,
    processes,
    running,
    start,
    tritonserver_pids,
)

QUICK = ("--profile-clocks", "6", "--profile-requests", "10", "--policy", "max")
ORPHAN_BOUND_S = 10.0

BODY = (
    b'{"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": '
    + str([1.0] * 16).encode()
    + b"}]}"
)


def test_sigterm_with_triton_frozen_exits_within_the_grace_period(tmp_path: Path) -> None:
    grace_s = 3.0
    with running([*QUICK, "--shutdown-grace-s", str(grace_s)], state_dir=tmp_path) as sc:
        proc, url = sc.proc, sc.url
        frozen = tritonserver_pids(proc.pid)
        assert len(frozen) == 1
        below = descendants(proc.pid)
        os.kill(frozen[0], signal.SIGSTOP)  # the helper's stop kills it, stopped or not
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


def test_sigterm_lets_accepted_work_finish_then_exits(tmp_path: Path) -> None:
    token = tmp_path / "admin-token"
    token.write_text("s3cret\n")
    flags = [*QUICK, "--shutdown-grace-s", "20", "--admin-token-file", str(token)]
    with running(flags, state_dir=tmp_path) as sc:
        proc = sc.proc
        clients = [httpx.Client(base_url=f"http://{sc.url}", timeout=60) for _ in range(6)]
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


def kill_9(sc: SidecarProcess, bound_s: float = ORPHAN_BOUND_S) -> tuple[int, float]:
    """``kill -9`` the sidecar; how many processes were below it, and the seconds until none of
    them (nor any other of its tree's sessions) is left. Fails past ``bound_s``, naming what is
    still there."""
    tree = sc.remember_tree()
    sc.proc.send_signal(signal.SIGKILL)
    sc.proc.wait()
    killed = time.monotonic()
    while True:
        alive = processes()
        left = {p: c for p, c in tree.items() if p in alive}
        left.update({p: i.cmdline for p, i in alive.items() if i.sid in sc.sessions})
        took = time.monotonic() - killed
        if not left:
            return len(tree), took
        names = sorted({c.split(b"\0")[0].rsplit(b"/", 1)[-1].decode() for c in left.values()})
        assert took < bound_s, f"{len(left)} processes still running {took:.1f} s after: {names}"
        time.sleep(0.1)


def test_a_sigkilled_sidecar_leaves_nothing_running_and_is_recovered_on_the_next_start(
    tmp_path: Path,
) -> None:
    first = start(QUICK, state_dir=tmp_path)
    try:
        tree = first.remember_tree()
        kinds = b"\n".join(tree.values())
        assert b"tritonserver" in kinds and b"triton_python_backend_stub" in kinds
        assert b"resource_tracker" in kinds  # the kinds that outlived a killed sidecar before
        locks = list((tmp_path / "locks").glob("*.json"))
        assert len(locks) == 1
        record = json.loads(locks[0].read_text())
        assert record["pid"] == first.pid and Path(record["tmp_dir"]).is_dir()
        below, took = kill_9(first)
        print(f"kill -9: the {below} processes below the sidecar were gone after {took:.1f} s")
    finally:
        first.kill_tree()
    with running(QUICK, state_dir=tmp_path) as second:
        log = second.log()
        assert f"a previous sidecar (pid {first.pid}" in log and "resetting its clock" in log
        assert not Path(record["tmp_dir"]).exists()
        assert json.loads(locks[0].read_text())["pid"] == second.pid
        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(timeout=40) == 0
        assert not locks[0].exists()  # a clean exit gave the clock back and the record with it


def test_a_sidecar_killed_while_triton_starts_leaves_nothing_running(tmp_path: Path) -> None:
    sc = start(QUICK, state_dir=tmp_path, wait_ready=False)
    try:
        deadline = time.monotonic() + 120
        while not tritonserver_pids(sc.pid):  # Triton is loading its models: no orderly stop
            assert sc.proc.poll() is None and time.monotonic() < deadline, sc.log()
            time.sleep(0.05)
        below, took = kill_9(sc)
        print(f"kill -9 while Triton starts: {below} processes gone after {took:.1f} s")
    finally:
        sc.kill_tree()
        # what the next start would remove (the test above shows it does): none comes here
        for lock in (tmp_path / "locks").glob("*.json"):
            shutil.rmtree(json.loads(lock.read_text())["tmp_dir"], ignore_errors=True)
