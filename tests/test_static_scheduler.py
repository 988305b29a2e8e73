"""Static-batching baseline scheduler: batch formation, full-length reservations, failures,
prefill-then-decode, finished members holding blocks until the batch ends (pure Python)."""

import pytest

from fakes import FakeRunner
from helpers import run_until_idle
from jaxinfer.core.kv_cache.block_manager import BlockManager
from jaxinfer.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from jaxinfer.engine.llm_engine import LLMEngine
from jaxinfer.core.request import FinishReason, Request
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.core.sched.static import StaticScheduler

T0 = 1000.0  # arrival time used by every request (monotonic seconds)


def make(num_blocks=11, budget=64, max_seqs=4, max_len=64, timeout=0.5):
    bm = BlockManager(num_blocks, 16)
    cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=max_len,
                          scheduler="static", batch_timeout_s=timeout)
    return StaticScheduler(cfg, CacheConfig(), bm), bm


def req(rid, n_prompt, max_tokens=4, arrival=T0, **kw):
    return Request(str(rid), list(range(3, 3 + n_prompt)), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   seed=0, max_tokens=max_tokens, arrival_time=arrival, **kw)


def step(s, now, token=7):
    out = s.schedule(now)
    s.update(out, [token] * len(out.scheduled))
    return out


def ids(out):
    return [(r.request_id, n) for r, n in out.scheduled]


def test_waits_for_timeout_then_reserves_max_model_len():
    s, bm = make(timeout=0.5, max_len=64)
    a, b = req("a", 5), req("b", 5)
    s.add_request(a)
    s.add_request(b)
    assert s.batch_deadline == T0 + 0.5
    assert step(s, T0 + 0.49).scheduled == [] and bm.num_free_blocks == 10
    out = step(s, T0 + 0.5)
    assert ids(out) == [("a", 5), ("b", 5)]
    assert a.block_ids == [1, 2, 3, 4] and b.block_ids == [5, 6, 7, 8]  # 64 tokens = 4 blocks each
    assert s.batch_deadline is None and a.first_scheduled_time == T0 + 0.5


def test_full_batch_forms_without_waiting():
    s, bm = make(max_seqs=2, num_blocks=20)
    for i in range(3):
        s.add_request(req(i, 3))
    out = step(s, T0)
    assert ids(out) == [("0", 3), ("1", 3)] and [r.request_id for r in s.waiting] == ["2"]


def test_member_without_room_fails_with_error():
    s, bm = make(num_blocks=11, max_seqs=4, max_len=64)  # 10 usable blocks: two reservations of 4
    rs = [req(i, 3) for i in range(4)]
    for r in rs:
        s.add_request(r)
    out = step(s, T0)
    assert ids(out) == [("0", 3), ("1", 3)]
    assert out.finished == [rs[2], rs[3]]
    assert all(r.finish_reason == FinishReason.ERROR and r.block_ids == [] for r in rs[2:])
    assert s.num_failed == 2 and bm.num_free_blocks == 2 and s.num_unfinished == 2


def test_prefill_all_members_before_any_decode():
    s, _ = make(budget=32, num_blocks=20)
    a, b = req("a", 20), req("b", 20)
    s.add_request(a)
    s.add_request(b)
    assert ids(step(s, T0 + 1)) == [("a", 20), ("b", 12)]
    assert a.output_token_ids == [7] and b.output_token_ids == []
    assert ids(step(s, T0 + 1)) == [("b", 8)]  # a does not decode while b still prefills
    assert ids(step(s, T0 + 1)) == [("a", 1), ("b", 1)]


def test_finished_members_hold_blocks_until_batch_ends():
    s, bm = make(num_blocks=20, max_len=64)
    a, b = req("a", 4, max_tokens=1), req("b", 4, max_tokens=3)
    s.add_request(a)
    s.add_request(b)
    step(s, T0 + 1)  # prefill: a gets its only token and finishes
    assert a.is_finished and a.finish_reason == FinishReason.LENGTH
    assert a.block_ids == [1, 2, 3, 4] and bm.num_free_blocks == 19 - 8
    assert s.kv_holders == [a, b] and s.running == [b]
    late = req("late", 2, arrival=T0)
    s.add_request(late)  # arrives mid-batch: must wait for the batch to end
    assert ids(step(s, T0 + 9)) == [("b", 1)]
    assert ids(step(s, T0 + 9)) == [("b", 1)]
    assert b.is_finished and bm.num_free_blocks == 19 and s.kv_holders == [] and a.block_ids == []
    assert ids(step(s, T0 + 9)) == [("late", 2)]


def test_abort_and_timeout_keep_reservation_no_preemption():
    s, bm = make(num_blocks=20, max_len=32)
    a = req("a", 4, max_tokens=10, deadline=T0 + 5)
    b = req("b", 4, max_tokens=10)
    w = req("w", 4)
    for r in (a, b):
        s.add_request(r)
    step(s, T0 + 1)
    s.add_request(w)
    s.finish(w, FinishReason.ABORT)
    assert list(s.waiting) == [] and w.finish_reason == FinishReason.ABORT
    out = step(s, T0 + 5)
    assert out.finished == [a] and a.finish_reason == FinishReason.TIMEOUT and ids(out) == [("b", 1)]
    assert bm.num_free_blocks == 19 - 4  # two reservations of 2 blocks, a's still held
    s.finish(b, FinishReason.ABORT)
    assert bm.num_free_blocks == 19 and s.num_preemptions == 0 and s.num_unfinished == 0


def test_queue_wait_expiry_rejects_waiting_request():
    """Beyond the batch's slots the queue-wait limit rejects; within them a request only waits
    for its batch to form (``batch_timeout_s``) and is not turned away (issue 50)."""
    s, _ = make(max_seqs=1, timeout=10.0)
    held, r = req("held", 3, max_queue_wait_deadline=T0 + 2), req("r", 3, max_queue_wait_deadline=T0 + 2)
    s.add_request(held)
    s.add_request(r)
    out = step(s, T0 + 2)
    assert out.finished == [r] and r.finish_reason == FinishReason.REJECTED and ids(out) == [("held", 3)]


def test_unknown_scheduler_name_rejected():
    with pytest.raises(ValueError, match="scheduler"):
        SchedulerConfig(scheduler="fifo")


def test_no_jax_import():
    from helpers import assert_imports_no_jax

    assert_imports_no_jax("import jaxinfer.core.sched.static")


# ----- through the engine, with the fake runner (next token = last + 1) --------------------------
TINY = ModelConfig(vocab_size=100, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1,
                   num_key_value_heads=1, head_dim=8, eos_token_ids=(2,))


def engine(kind, num_blocks=33, max_len=64, max_seqs=4):
    sc = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=64, max_model_len=max_len, scheduler=kind,
                         batch_timeout_s=0.0)
    cfg = EngineConfig(model_path="tiny", cache=CacheConfig(watermark=0.0), scheduler=sc, warmup=False)
    return LLMEngine(cfg, TINY, FakeRunner(TINY.vocab_size), num_blocks)


def run(e, lengths):
    for i, n in enumerate(lengths):
        e.add_request(f"r{i}", [10] * 8, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    return {rid: out.outputs[0] for rid, out in run_until_idle(e).items()}


def test_engine_static_same_tokens_more_fragmentation():
    lengths = [2, 20, 5, 40]
    results = {}
    for kind in ("continuous", "static"):
        e = engine(kind)
        done = run(e, lengths)
        assert [len(done[f"r{i}"].token_ids) for i in range(4)] == lengths
        assert done["r1"].token_ids[:3] == [11, 12, 13]  # fake runner: last token + 1
        assert e.num_free_blocks == e.num_total_blocks
        results[kind] = e.stats.fragmentation_sum / e.stats.fragmentation_samples
    # static reserves 4 blocks (64 slots) per member; continuous holds ceil(tokens / 16)
    assert results["static"] > 0.5 > results["continuous"]


def test_engine_static_failure_is_reported_as_error():
    e = engine("static", num_blocks=9, max_len=64)  # 8 usable blocks: 2 reservations of 4
    done = run(e, [3, 3, 3])
    assert [done[f"r{i}"].finish_reason for i in range(3)] == ["length", "length", "error"]
    assert done["r2"].token_ids == []


def test_async_engine_wakes_at_batch_timeout():
    """A lone request in a half-empty static batch starts once ``batch_timeout_s`` has
    passed, not before, even if nothing else arrives to wake the engine thread."""
    import asyncio
    import time

    from jaxinfer.engine.async_engine import AsyncEngine, RequestSpec

    sc = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64, scheduler="static",
                         batch_timeout_s=0.3)
    cfg = EngineConfig(model_path="tiny", cache=CacheConfig(watermark=0.0), scheduler=sc, warmup=False)
    ae = AsyncEngine(LLMEngine(cfg, TINY, FakeRunner(TINY.vocab_size), 33)).start()
    assert ae.ready_event.wait(10)

    async def one():
        t0 = time.monotonic()
        outs = [o async for o in ae.generate(RequestSpec("x", [10] * 4, SamplingParams(max_tokens=3, ignore_eos=True)))]
        return time.monotonic() - t0, outs[-1]

    try:
        waited, last = asyncio.run(asyncio.wait_for(one(), 10))
    finally:
        ae.shutdown()
    assert last.finished and last.outputs[0].token_ids == [11, 12, 13]
    assert 0.3 <= waited < 2.0
