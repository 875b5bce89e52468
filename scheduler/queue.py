"""The run queue: strict priority levels, and CFS over client flows inside each level.

Order, in full:

1. The lowest level number with work goes first (level 1 is the highest priority).
2. Inside a level, the flow (one per ``client_id``) with the smallest virtual runtime goes next;
   inside a flow, requests go first-in first-out.
3. Ties in virtual runtime go to the flow whose oldest waiting request arrived first (the
   scheduler's arrival sequence number, unique, so the order is total and deterministic).

Virtual runtime: a dispatched request charges its flow ``gpu_ms × 1024 / weight(nice)`` at once
(so a flow cannot take every free slot on a stale key), ``gpu_ms`` the GPU time the request is
expected to use (:meth:`scheduler.core.Scheduler.charge_ms` says how much); when it completes,
the difference between the GPU time it used and that charge is charged the same way. A flow
that wakes up (had nothing queued) is placed at ``max(its own vruntime, the level's
min_vruntime)``: it neither jumps ahead of flows that kept working (no credit for sleeping) nor
starts behind them (no starvation). The level's ``min_vruntime`` only moves forward, as in
Linux.

On a node of several GPUs each GPU has its own queue, and the queues share one
:class:`VruntimeLedger`: a flow's virtual runtime is one number for the whole node, charged by
whichever GPU serves it, so a client that was served on one GPU waits its turn on the others
(its share is counted over every GPU, not per GPU). A flow wakes only when it has nothing
queued on any GPU: one that still waits on another GPU keeps its virtual runtime when it is
queued here too (it is not sleeping). Each queue re-reads a flow's virtual runtime from the
ledger before it trusts the flow's place in its heap. Alone, a queue has a ledger of its own and
behaves exactly as described above.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from itertools import islice
from typing import Generic

from scheduler.request import P, Request
from scheduler.weights import NICE_0_WEIGHT, NICE_MIN, SCHED_PRIO_TO_WEIGHT, weight_for_nice


class FlowAccount:
    """One flow's virtual runtime, shared by its queues on every GPU of a node."""

    __slots__ = ("holders", "vruntime", "waiting")

    def __init__(self) -> None:
        self.vruntime = 0.0
        self.holders = 0  # queues that have this flow
        self.waiting = 0  # queues where it has requests waiting


class VruntimeLedger:
    """Virtual runtime per (level, client) over the GPUs of one node.

    Give every GPU's :class:`PriorityCfsQueue` the same ledger and a flow is charged once for
    the whole node. An account lives while some queue has its flow; a queue forgets a flow
    only when nothing of it waits or runs there and it is not ahead of that queue's level
    (as a single queue forgets it), so a flow keeps its debt while any GPU remembers it.
    """

    def __init__(self) -> None:
        self._accounts: dict[tuple[int, str], FlowAccount] = {}

    def __len__(self) -> int:
        return len(self._accounts)

    def open(self, level: int, client_id: str) -> FlowAccount:
        account = self._accounts.get((level, client_id))
        if account is None:
            account = self._accounts[(level, client_id)] = FlowAccount()
        account.holders += 1
        return account

    def close(self, level: int, client_id: str) -> None:
        account = self._accounts.get((level, client_id))
        if account is not None:
            account.holders -= 1
            if account.holders <= 0:
                del self._accounts[(level, client_id)]

    def account(self, level: int, client_id: str) -> FlowAccount | None:
        """The flow's node-wide account (None: no queue has it)."""
        return self._accounts.get((level, client_id))


class _Flow(Generic[P]):
    __slots__ = (
        "account",
        "by_model",
        "client_id",
        "inflight",
        "of_model",
        "requests",
        "version",
        "weight",
    )

    def __init__(self, client_id: str, account: FlowAccount) -> None:
        self.client_id = client_id
        self.requests: deque[Request[P]] = deque()
        self.account = account
        self.version = 0
        self.inflight = 0
        self.weight = NICE_0_WEIGHT
        self.by_model: dict[str, int] = {}  # requests waiting, per model
        self.of_model: dict[str, deque[Request[P]]] = {}  # the same, first in first out

    @property
    def vruntime(self) -> float:
        return self.account.vruntime

    @vruntime.setter
    def vruntime(self, value: float) -> None:
        self.account.vruntime = value


class _Level(Generic[P]):
    __slots__ = ("by_model", "flows", "heap", "min_vruntime", "size")

    def __init__(self) -> None:
        self.flows: dict[str, _Flow[P]] = {}
        # (vruntime, head seq, version, flow); stale entries (old version) are skipped on pop,
        # and an entry whose flow was charged since (on another GPU) is put back at its new key.
        self.heap: list[tuple[float, int, int, _Flow[P]]] = []
        self.min_vruntime = 0.0
        self.size = 0
        self.by_model: dict[str, int] = {}  # requests waiting, per model

    def push_key(self, flow: _Flow[P]) -> None:
        flow.version += 1
        heapq.heappush(self.heap, (flow.vruntime, flow.requests[0].seq, flow.version, flow))

    def leftmost(self) -> _Flow[P] | None:
        heap = self.heap
        while heap:
            key, _, version, flow = heap[0]
            if version == flow.version and flow.requests:
                if key == flow.vruntime:
                    return flow
                heapq.heappop(heap)
                self.push_key(flow)  # charged elsewhere since it was keyed
                continue
            heapq.heappop(heap)
        return None

    def advance_min(self) -> None:
        flow = self.leftmost()
        if flow is not None and flow.vruntime > self.min_vruntime:
            self.min_vruntime = flow.vruntime


SERVICE_EWMA = 0.05  # weight of the latest request in the mean GPU time charged per model
_CHARGE_PER_MS = tuple(NICE_0_WEIGHT / w for w in SCHED_PRIO_TO_WEIGHT)


def vruntime_charge(service_ms: float, nice: int) -> float:
    """Virtual runtime for ``service_ms`` of GPU time at ``nice``."""
    return service_ms * NICE_0_WEIGHT / weight_for_nice(nice)


def _count(counts: dict[str, int], model: str, delta: int) -> None:
    left = counts.get(model, 0) + delta
    if left:
        counts[model] = left
    else:
        del counts[model]


class PriorityCfsQueue(Generic[P]):
    """Priority levels, CFS flows inside each; see the module docstring for the exact order.

    ``ledger``: the node-wide virtual runtimes to share with the other GPUs' queues (default:
    one of its own)."""

    def __init__(self, ledger: VruntimeLedger | None = None) -> None:
        self.ledger = ledger if ledger is not None else VruntimeLedger()
        self._levels: dict[int, _Level[P]] = {}
        self._order: list[int] = []
        self.size = 0  # requests waiting (read-only outside)
        self._deadlines: list[tuple[float, int]] = []
        self._queued: set[int] = set()
        self._backlogged_weight = 0  # sum of the weights of flows with requests queued
        self._service_ms: dict[str, float] = {}  # per model: a request's GPU time charged, EWMA

    def __len__(self) -> int:
        return self.size

    def level_sizes(self) -> dict[int, int]:
        return {n: lvl.size for n, lvl in sorted(self._levels.items()) if lvl.size}

    def push(self, request: Request[P]) -> None:
        level = self._levels.get(request.level)
        if level is None:
            level = self._levels[request.level] = _Level()
            self._order = sorted(self._levels)
        flow = level.flows.get(request.client_id)
        if flow is None:
            flow = _Flow(request.client_id, self.ledger.open(request.level, request.client_id))
            level.flows[request.client_id] = flow
        was_idle = not flow.requests
        weight = weight_for_nice(request.nice)
        if was_idle:
            self._backlogged_weight += weight
        else:
            self._backlogged_weight += weight - flow.weight
        flow.weight = weight
        flow.requests.append(request)
        same = flow.of_model.get(request.model)
        if same is None:
            same = flow.of_model[request.model] = deque()
        same.append(request)
        _count(flow.by_model, request.model, 1)
        _count(level.by_model, request.model, 1)
        if was_idle:
            account = flow.account
            if not account.waiting:  # it wakes (a flow waiting on another GPU is awake)
                account.vruntime = max(account.vruntime, level.min_vruntime)
            account.waiting += 1
            level.push_key(flow)
        level.size += 1
        self.size += 1
        heapq.heappush(self._deadlines, (request.deadline_s, request.seq))
        self._queued.add(request.seq)

    def peek(self) -> Request[P] | None:
        """The request :meth:`pop` would take next, left in place."""
        for n in self._order:
            level = self._levels[n]
            if level.size:
                flow = level.leftmost()
                assert flow is not None, "a non-empty level has a runnable flow"
                return flow.requests[0]
        return None

    def pop(self, expected_ms: float) -> Request[P] | None:
        """Take the next request in order and charge its flow the GPU time it is expected to use."""
        head = self.peek()
        if head is not None:
            self.take(head, expected_ms)
        return head

    def take(self, request: Request[P], expected_ms: float) -> None:
        """Take ``request`` (waiting, in any position) and charge its flow as :meth:`pop` does."""
        removed = self.remove(request)
        assert removed, "only a waiting request is taken"
        level = self._levels[request.level]
        flow = level.flows[request.client_id]
        request.charged_ms = expected_ms
        flow.vruntime += vruntime_charge(request.charged_ms, request.nice)
        flow.inflight += 1
        if flow.requests:
            level.push_key(flow)  # re-keyed on the vruntime just charged
        level.advance_min()

    def remove(self, request: Request[P]) -> bool:
        """Take a waiting ``request`` out (its client gave up, its timeout expired; or to send
        it out of turn); nothing is charged. False when it is not waiting (already dispatched,
        or never queued)."""
        if request.seq not in self._queued:
            return False
        level = self._levels[request.level]
        flow = level.flows[request.client_id]
        was_head = flow.requests[0] is request
        flow.requests.remove(request)
        same = flow.of_model[request.model]
        if same[0] is request:
            same.popleft()
        else:
            same.remove(request)
        if not same:
            del flow.of_model[request.model]
        _count(flow.by_model, request.model, -1)
        _count(level.by_model, request.model, -1)
        self._queued.discard(request.seq)
        level.size -= 1
        self.size -= 1
        if not flow.requests:
            self._backlogged_weight -= flow.weight
            flow.account.waiting -= 1
            flow.version += 1  # its heap entry goes stale
        elif was_head:
            level.push_key(flow)  # keyed by the new head's arrival
        return True

    def settle(self, request: Request[P], used_ms: float, *, record: bool = True) -> None:
        """``request`` is back, having used ``used_ms`` of GPU time in all: charge the
        difference from what it was charged when sent. ``record``: that time joins its model's
        moving mean (not for a request that was never sent)."""
        level = self._levels[request.level]
        flow = level.flows.get(request.client_id)
        if flow is None:
            return
        flow.inflight -= 1
        flow.vruntime += vruntime_charge(used_ms - request.charged_ms, request.nice)
        if record:
            mean = self._service_ms.get(request.model)
            self._service_ms[request.model] = (
                used_ms if mean is None else mean + SERVICE_EWMA * (used_ms - mean)
            )
        if flow.requests:
            level.push_key(flow)
            level.advance_min()
        elif not flow.inflight and flow.vruntime <= level.min_vruntime:
            del level.flows[flow.client_id]  # it would be placed at min_vruntime anyway
            self.ledger.close(request.level, flow.client_id)

    def queued_for(self, level: int, client_id: str) -> int:
        """How many requests of this flow are waiting."""
        lvl = self._levels.get(level)
        flow = None if lvl is None else lvl.flows.get(client_id)
        return 0 if flow is None else len(flow.requests)

    def backlogged_weight(self) -> int:
        """Sum of the CFS weights of the flows that have requests waiting."""
        return self._backlogged_weight

    def earliest_deadline_s(self) -> float | None:
        """The earliest deadline among queued requests (None when empty)."""
        heap = self._deadlines
        while heap and heap[0][1] not in self._queued:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def first_sendable(self, sendable: Callable[[str, int], bool]) -> Request[P] | None:
        """The next request in order among those whose (model, level) ``sendable`` allows:
        the highest level with one; in it, the flow with the smallest virtual runtime (ties:
        its oldest waiting request first) that has one; its oldest such request. A model held
        back does not block the others behind it, however many of its requests are ahead."""
        head = self.peek()
        if head is None or sendable(head.model, head.level):
            return head
        for n in self._order:
            level = self._levels[n]
            if not level.size:
                continue
            models = [m for m in level.by_model if sendable(m, n)]
            if not models:
                continue
            best: Request[P] | None = None
            best_key = (0.0, 0)
            for flow in level.flows.values():
                if not flow.requests:
                    continue
                key = (flow.vruntime, flow.requests[0].seq)
                if best is not None and key >= best_key:
                    continue
                first = None
                for m in models:
                    same = flow.of_model.get(m)
                    if same and (first is None or same[0].seq < first.seq):
                        first = same[0]
                if first is not None:
                    best, best_key = first, key
            if best is not None:
                return best
        return None

    def iter_order(self, limit: int, expected_ms: float) -> list[Request[P]]:
        """The first ``limit`` requests in the order :meth:`pop` would give them, read-only:
        each flow charged ``expected_ms`` per request as it goes (ties as in the queue)."""
        out: list[Request[P]] = []
        for n in self._order:
            left = limit - len(out)
            level = self._levels[n]
            if not level.size or left <= 0:
                continue
            runnable = [f for f in level.flows.values() if f.requests]
            if len(runnable) == 1:
                out.extend(islice(runnable[0].requests, left))
                continue
            sim = [(f.vruntime, f.requests[0].seq, i, 0) for i, f in enumerate(runnable)]
            heapq.heapify(sim)
            while sim and left > 0:
                vruntime, _, i, pos = sim[0]
                requests = runnable[i].requests
                request = requests[pos]
                out.append(request)
                left -= 1
                if pos + 1 < len(requests):
                    vruntime += _CHARGE_PER_MS[request.nice - NICE_MIN] * expected_ms
                    heapq.heapreplace(sim, (vruntime, requests[pos + 1].seq, i, pos + 1))
                else:
                    heapq.heappop(sim)
        return out

    def flow_vruntimes(self, level: int) -> dict[str, float]:
        """Virtual runtime per flow of a level (for tests and the admin view)."""
        lvl = self._levels.get(level)
        return {} if lvl is None else {c: f.vruntime for c, f in lvl.flows.items()}

    def min_vruntime(self, level: int) -> float:
        lvl = self._levels.get(level)
        return 0.0 if lvl is None else lvl.min_vruntime

    # -- what placement reads (scheduler.placement) ---------------------------------------

    def levels(self) -> list[int]:
        """The levels that have requests waiting, highest priority first."""
        return [n for n in self._order if self._levels[n].size]

    def waiting_by_model(self, level: int) -> Mapping[str, int]:
        """Requests waiting at ``level``, per model."""
        lvl = self._levels.get(level)
        return {} if lvl is None else lvl.by_model

    def waiting_flows(self, level: int) -> Iterator[tuple[str, float, int, Mapping[str, int]]]:
        """Each flow with requests waiting at ``level``: (client, virtual runtime, weight,
        requests waiting per model)."""
        lvl = self._levels.get(level)
        if lvl is None:
            return
        for flow in lvl.flows.values():
            if flow.requests:
                yield flow.client_id, flow.vruntime, flow.weight, flow.by_model

    def service_ms(self, model: str) -> float | None:
        """What a request of ``model`` has been charged lately in all (the GPU time it used, a
        moving mean; None before the first): the unit in which virtual runtime grows, per
        request."""
        return self._service_ms.get(model)

    def start_vruntime(self, level: int, client_id: str) -> float:
        """The virtual runtime a new request of this flow would queue at here: the flow's own
        (node-wide) while it has requests waiting on some GPU, else where waking places it."""
        lvl = self._levels.get(level)
        floor = 0.0 if lvl is None else lvl.min_vruntime
        account = self.ledger.account(level, client_id)
        if account is None:
            return floor
        return account.vruntime if account.waiting else max(account.vruntime, floor)
