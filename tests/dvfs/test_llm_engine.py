"""The continuously batching engine: iteration contents, chunked prefill, token order, KV
admission and cancellation, without time."""

from __future__ import annotations

import pytest

from dvfs.llm_engine import ContinuousBatchingEngine, EngineLimits


def run_all(engine: ContinuousBatchingEngine) -> dict[int, list[int]]:
    """Run iterations until idle: request -> iteration numbers of its tokens."""
    tokens: dict[int, list[int]] = {}
    n = 0
    while (it := engine.next_iteration()) is not None:
        assert it.work.decode_seqs + it.work.prefill_tokens <= engine.limits.max_batched_tokens
        for e in engine.finish_iteration():
            tokens.setdefault(e.request_id, []).append(n)
        n += 1
    return tokens


def test_a_prompt_gives_its_first_token_and_then_one_per_iteration() -> None:
    engine = ContinuousBatchingEngine(EngineLimits(max_seqs=4, max_batched_tokens=64))
    engine.submit(1, prompt_tokens=10, output_tokens=3)
    first = engine.next_iteration()
    assert first is not None and first.prefill_chunks == ((1, 10),) and first.decode_ids == ()
    assert [(e.index, e.last) for e in engine.finish_iteration()] == [(1, False)]
    second = engine.next_iteration()
    assert second is not None and second.decode_ids == (1,)
    assert second.work.decode_context_tokens == 11  # prompt + the one token so far
    assert [(e.index, e.last) for e in engine.finish_iteration()] == [(2, False)]
    assert engine.next_iteration() is not None
    assert [(e.index, e.last) for e in engine.finish_iteration()] == [(3, True)]
    assert engine.next_iteration() is None and not engine.busy
    assert engine.kv_reserved_tokens == 0


def test_a_long_prompt_is_prefilled_in_chunks_beside_running_streams() -> None:
    engine = ContinuousBatchingEngine(EngineLimits(max_seqs=4, max_batched_tokens=100))
    engine.submit(1, prompt_tokens=5, output_tokens=50)
    engine.next_iteration()
    engine.finish_iteration()
    engine.submit(2, prompt_tokens=250, output_tokens=2)
    chunks = []
    first_token_at = None
    for i in range(5):
        it = engine.next_iteration()
        assert it is not None
        assert 1 in it.decode_ids  # the running stream is never stalled for the whole prompt
        chunks += [c for rid, c in it.prefill_chunks if rid == 2]
        emitted = engine.finish_iteration()
        if any(e.request_id == 2 for e in emitted) and first_token_at is None:
            first_token_at = i
    assert chunks == [99, 99, 52]  # the budget less the one decode token
    assert first_token_at == 2
    # The chunks' attention adds up to the whole prompt's: 250².
    engine2 = ContinuousBatchingEngine(EngineLimits(max_seqs=2, max_batched_tokens=100))
    engine2.submit(7, prompt_tokens=250, output_tokens=1)
    total = 0.0
    while (it := engine2.next_iteration()) is not None:
        total += it.work.prefill_sq_tokens
        engine2.finish_iteration()
    assert total == 250.0**2


def test_requests_start_in_order_only_when_their_whole_sequence_fits_the_kv_cache() -> None:
    engine = ContinuousBatchingEngine(
        EngineLimits(max_seqs=8, max_batched_tokens=1000, kv_capacity_tokens=100)
    )
    engine.submit(1, prompt_tokens=40, output_tokens=20)  # 60 tokens
    engine.submit(2, prompt_tokens=40, output_tokens=20)  # would make 120 > 100: waits
    engine.submit(3, prompt_tokens=5, output_tokens=5)  # fits, but does not jump request 2
    it = engine.next_iteration()
    assert it is not None and [rid for rid, _ in it.prefill_chunks] == [1]
    engine.finish_iteration()
    tokens = run_all(engine)
    assert min(tokens[2]) <= min(tokens[3])  # 3 never started before 2 (once 1 had left)
    with pytest.raises(ValueError, match="never fit"):
        engine.submit(9, prompt_tokens=90, output_tokens=20)


def test_at_most_max_seqs_run_at_once() -> None:
    engine = ContinuousBatchingEngine(EngineLimits(max_seqs=3, max_batched_tokens=100))
    for rid in range(6):
        engine.submit(rid, prompt_tokens=4, output_tokens=10)
    peak = 0
    while engine.next_iteration() is not None:
        peak = max(peak, len(engine.running))
        engine.finish_iteration()
    assert peak == 3


def test_cancel_frees_the_place_and_emits_nothing_more() -> None:
    engine = ContinuousBatchingEngine(
        EngineLimits(max_seqs=1, max_batched_tokens=100, kv_capacity_tokens=1000)
    )
    engine.submit(1, prompt_tokens=10, output_tokens=100)
    engine.submit(2, prompt_tokens=10, output_tokens=2)
    engine.next_iteration()
    engine.finish_iteration()
    it = engine.next_iteration()  # request 1 decoding; 2 waits for the place
    assert it is not None and it.decode_ids == (1,) and it.prefill_chunks == ()
    assert engine.cancel(1)  # the client goes away mid-iteration
    assert engine.finish_iteration() == []
    assert engine.kv_reserved_tokens == 0
    tokens = run_all(engine)
    assert set(tokens) == {2} and len(tokens[2]) == 2
    assert not engine.cancel(1)


def test_limits_are_checked_at_the_edge() -> None:
    with pytest.raises(ValueError, match="max_batched_tokens"):
        EngineLimits(max_seqs=256, max_batched_tokens=128)
    engine = ContinuousBatchingEngine()
    with pytest.raises(ValueError, match=">= 1"):
        engine.submit(1, prompt_tokens=0, output_tokens=5)
    engine.submit(1, prompt_tokens=3, output_tokens=5)
    with pytest.raises(ValueError, match="already"):
        engine.submit(1, prompt_tokens=3, output_tokens=5)
    engine.next_iteration()
    with pytest.raises(RuntimeError):
        engine.next_iteration()
