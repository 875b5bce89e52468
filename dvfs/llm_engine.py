"""A continuously batching LLM engine, as state and pure decisions: no time, no I/O.

What vLLM and TensorRT-LLM's in-flight batching do, reduced to what costs time and energy:
requests wait; each iteration has a budget of ``max_batched_tokens`` tokens. Every sequence past
its prompt decodes one token (one of the budget each); what is left goes to prompts (*prefill*),
first to prompts already started, then to waiting requests it admits in arrival order while the
engine has a place for them. A prompt longer than what is left is cut into chunks over several
iterations (chunked prefill, as vLLM runs by default: a long prompt cannot stall every running
stream for its whole prefill, Sarathi-Serve's point, Agrawal et al., OSDI 2024); the iteration
that finishes a prompt yields its first token. A sequence leaves when it has all its output
tokens, or at once when its client goes away.

Admission follows TensorRT-LLM's ``GUARANTEED_NO_EVICT`` capacity policy: a request starts only
if the KV cache has room for its whole sequence (prompt and every output token), so nothing is
ever evicted mid-stream; and at most ``max_seqs`` sequences run at once.

The engine knows nothing of clocks or time: :meth:`ContinuousBatchingEngine.next_iteration`
says what the next iteration computes, the caller prices it with
:meth:`dvfs.llm_profiles.LlmProfile.cost` at the clock in force and calls
:meth:`ContinuousBatchingEngine.finish_iteration` when it is done. So the same engine runs in the
discrete-event simulator (virtual time) and can back an emulated decoupled model (wall time).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from dvfs.llm_profiles import IterationWork


@dataclass(frozen=True)
class EngineLimits:
    """The engine's own caps (see the module docstring)."""

    max_seqs: int = 256
    max_batched_tokens: int = 2048
    kv_capacity_tokens: int = 1 << 62

    def __post_init__(self) -> None:
        if self.max_seqs < 1 or self.kv_capacity_tokens < 1:
            raise ValueError("max_seqs and kv_capacity_tokens must be >= 1")
        if self.max_batched_tokens <= self.max_seqs:
            raise ValueError(
                f"max_batched_tokens ({self.max_batched_tokens}) must exceed max_seqs "
                f"({self.max_seqs}): every running sequence decodes one token per iteration"
            )


@dataclass
class Sequence:
    """One request inside the engine."""

    request_id: int
    prompt_tokens: int
    output_tokens: int
    generated: int = 0
    prefilled: int = 0

    @property
    def decoding(self) -> bool:
        return self.prefilled >= self.prompt_tokens

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def reserved_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True)
class Iteration:
    """What one iteration runs: a chunk of some prompts (``(request, tokens)``; the ones
    that finish their prompt here yield their first token) and one step of each decoding
    sequence."""

    prefill_chunks: tuple[tuple[int, int], ...]
    decode_ids: tuple[int, ...]
    work: IterationWork


@dataclass(frozen=True)
class Emitted:
    """A token an iteration produced: the request's ``index``-th output token (1-based)."""

    request_id: int
    index: int
    last: bool


@dataclass
class ContinuousBatchingEngine:
    """The engine's state; see the module docstring for the rules."""

    limits: EngineLimits = field(default_factory=EngineLimits)
    waiting: OrderedDict[int, Sequence] = field(default_factory=OrderedDict)
    running: OrderedDict[int, Sequence] = field(default_factory=OrderedDict)
    kv_reserved_tokens: int = 0
    _in_flight: Iteration | None = None

    def submit(self, request_id: int, prompt_tokens: int, output_tokens: int) -> None:
        """A request arrives at the engine; it waits for the next iteration that admits it."""
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError(
                f"a request needs >= 1 prompt and output token, got {prompt_tokens}, "
                f"{output_tokens}"
            )
        if prompt_tokens + output_tokens > self.limits.kv_capacity_tokens:
            raise ValueError(
                f"request {request_id}: {prompt_tokens + output_tokens} tokens never fit the "
                f"KV cache ({self.limits.kv_capacity_tokens} tokens)"
            )
        if request_id in self.waiting or request_id in self.running:
            raise ValueError(f"request {request_id} is already in the engine")
        self.waiting[request_id] = Sequence(request_id, prompt_tokens, output_tokens)

    def cancel(self, request_id: int) -> bool:
        """The client went away: drop the request and free its place (False: not here).

        A sequence in the iteration now running stops there; that iteration's work is not
        taken back (the GPU already does it), its token for this request is just not emitted.
        """
        if self.waiting.pop(request_id, None) is not None:
            return True
        seq = self.running.pop(request_id, None)
        if seq is None:
            return False
        self.kv_reserved_tokens -= seq.reserved_tokens
        return True

    @property
    def busy(self) -> bool:
        """Whether there is anything to run."""
        return bool(self.waiting or self.running)

    @property
    def in_flight(self) -> Iteration | None:
        return self._in_flight

    def _admit(self, budget: int) -> list[Sequence]:
        """Waiting requests the engine starts now (in order; a later, smaller one never jumps
        one that does not fit)."""
        admitted: list[Sequence] = []
        lim = self.limits
        for seq in self.waiting.values():
            if budget <= 0 or len(self.running) + len(admitted) >= lim.max_seqs:
                break
            if self.kv_reserved_tokens + seq.reserved_tokens > lim.kv_capacity_tokens:
                break
            admitted.append(seq)
            budget -= seq.prompt_tokens
            self.kv_reserved_tokens += seq.reserved_tokens
        for seq in admitted:
            del self.waiting[seq.request_id]
            self.running[seq.request_id] = seq
        return admitted

    def next_iteration(self) -> Iteration | None:
        """Start the next iteration (None: nothing to run). Only one runs at a time."""
        if self._in_flight is not None:
            raise RuntimeError("finish the iteration in flight first")
        decoding = [s for s in self.running.values() if s.decoding]
        budget = self.limits.max_batched_tokens - len(decoding)
        started = [s for s in self.running.values() if not s.decoding]
        started_left = sum(s.prompt_tokens - s.prefilled for s in started)
        self._admit(budget - started_left)
        chunks: list[tuple[Sequence, int]] = []
        for seq in self.running.values():
            if seq.decoding or budget <= 0:
                continue
            take = min(seq.prompt_tokens - seq.prefilled, budget)
            chunks.append((seq, take))
            budget -= take
        if not chunks and not decoding:
            return None
        work = IterationWork(
            prefill_tokens=sum(c for _, c in chunks),
            prefill_sq_tokens=float(sum(c * c + 2 * c * s.prefilled for s, c in chunks)),
            decode_seqs=len(decoding),
            decode_context_tokens=sum(s.context_tokens for s in decoding),
            prefill_prefix_tokens=sum(s.prefilled for s, _ in chunks),
        )
        self._in_flight = Iteration(
            tuple((s.request_id, c) for s, c in chunks),
            tuple(s.request_id for s in decoding),
            work,
        )
        return self._in_flight

    def finish_iteration(self) -> list[Emitted]:
        """The iteration in flight is done: the first token of each prompt it finished and one
        token of each sequence it decoded, for those still here."""
        it = self._in_flight
        if it is None:
            raise RuntimeError("no iteration in flight")
        self._in_flight = None
        out: list[Emitted] = []
        for rid, tokens in it.prefill_chunks:
            seq = self.running.get(rid)
            if seq is None:
                continue  # cancelled while the iteration ran
            seq.prefilled += tokens
            if seq.decoding:
                self._emit(seq, out)
        for rid in it.decode_ids:
            seq = self.running.get(rid)
            if seq is not None:
                self._emit(seq, out)
        return out

    def _emit(self, seq: Sequence, out: list[Emitted]) -> None:
        seq.generated += 1
        last = seq.generated >= seq.output_tokens
        out.append(Emitted(seq.request_id, seq.generated, last))
        if last:
            del self.running[seq.request_id]
            self.kv_reserved_tokens -= seq.reserved_tokens
