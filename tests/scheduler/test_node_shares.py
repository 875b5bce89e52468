"""Shares counted over the node: the GPUs' queues share one ledger of virtual runtimes."""

from __future__ import annotations

from collections import Counter

import pytest

from scheduler.queue import PriorityCfsQueue, VruntimeLedger
from scheduler.request import Request
from tests.scheduler.helpers import make_request

_seq = iter(range(1_000_000))


def push(q: PriorityCfsQueue[None], client: str, nice: int = 0) -> Request[None]:
    r = make_request(client_id=client, nice=nice)
    r.seq = next(_seq)
    r.level = 2
    q.push(r)
    return r


def serve(
    queues: list[PriorityCfsQueue[None]], rounds: int, refill: dict[int, list[str]]
) -> Counter[str]:
    """Each GPU in turn runs one request (10 ms, as expected); its flows stay backlogged."""
    served: Counter[str] = Counter()
    for _ in range(rounds):
        for i, q in enumerate(queues):
            r = q.pop(10.0)
            assert r is not None
            q.settle(r, 10.0)
            served[r.client_id] += 1
            if r.client_id in refill[i]:
                push(q, r.client_id, r.nice)
    return served


def pinned(ledger: VruntimeLedger | None) -> Counter[str]:
    """Three equal flows, two GPUs: a only on GPU 0, c only on GPU 1, b on both."""
    queues: list[PriorityCfsQueue[None]] = [PriorityCfsQueue(ledger), PriorityCfsQueue(ledger)]
    placement = {0: ["a", "b"], 1: ["b", "c"]}
    for i, clients in placement.items():
        for client in clients:
            for _ in range(5):
                push(queues[i], client)
    return serve(queues, 3000, placement)


def test_a_shared_ledger_shares_the_node_where_per_gpu_queues_cannot() -> None:
    per_gpu = pinned(None)
    node = pinned(VruntimeLedger())
    # Per GPU, b gets half of both GPUs: twice a's or c's share.
    assert per_gpu["b"] / per_gpu["a"] == pytest.approx(2.0, rel=0.01)
    # Counted over the node, the three equal flows get a third of the node each.
    total = sum(node.values())
    for client in "abc":
        assert node[client] / total == pytest.approx(1 / 3, rel=0.02)


def test_weights_hold_over_two_gpus_with_one_ledger() -> None:
    ledger = VruntimeLedger()
    queues: list[PriorityCfsQueue[None]] = [PriorityCfsQueue(ledger), PriorityCfsQueue(ledger)]
    both = {0: ["heavy", "light"], 1: ["heavy", "light"]}
    for q in queues:
        for _ in range(5):
            push(q, "heavy", -5)
            push(q, "light", 0)
    served = serve(queues, 4000, both)
    assert served["heavy"] / served["light"] == pytest.approx(3121 / 1024, rel=0.03)


def test_a_flow_waiting_on_one_gpu_is_not_woken_on_another() -> None:
    """Queued on GPU 1 while it still waits on GPU 0, a flow keeps its virtual runtime: it is
    not sleeping, so it is not moved up to GPU 1's minimum (which would charge it for service
    it never had)."""
    ledger = VruntimeLedger()
    gpu0: PriorityCfsQueue[None] = PriorityCfsQueue(ledger)
    gpu1: PriorityCfsQueue[None] = PriorityCfsQueue(ledger)
    for _ in range(20):
        push(gpu1, "busy")
    for _ in range(10):
        r = gpu1.pop(10.0)
        assert r is not None
        gpu1.settle(r, 10.0)
    assert gpu1.min_vruntime(2) > 0
    push(gpu0, "x")  # x waits on GPU 0 (at GPU 0's minimum, 0)
    assert gpu0.start_vruntime(2, "x") == 0.0
    push(gpu1, "x")
    assert gpu1.flow_vruntimes(2)["x"] == 0.0 < gpu1.min_vruntime(2)
    # Once x waits nowhere, a new request of it wakes at the GPU's minimum, as on one GPU.
    for q in (gpu0, gpu1):
        while (r := q.pop(10.0)) is not None and r.client_id != "x":
            q.settle(r, 10.0)
        assert r is not None
        q.settle(r, 10.0)
    assert gpu1.start_vruntime(2, "x") == gpu1.min_vruntime(2)


def test_accounts_are_forgotten_with_their_flows() -> None:
    """A flow with nothing waiting or running and no lead over its level is forgotten by each
    queue (as on one GPU); its account goes with the last. One with a lead is remembered."""
    ledger = VruntimeLedger()
    queues: list[PriorityCfsQueue[None]] = [PriorityCfsQueue(ledger), PriorityCfsQueue(ledger)]
    for q in queues:
        r = push(q, "once")
        taken = q.pop(5.0)
        assert taken is r
        assert len(ledger) == 1
        q.settle(r, 0.0)  # it took no time: no lead left
    assert len(ledger) == 0
    r = push(queues[0], "ahead")
    assert queues[0].pop(5.0) is r
    queues[0].settle(r, 5.0)
    assert len(ledger) == 1 and queues[1].start_vruntime(2, "ahead") == 5.0
