"""Automatic prefix caching: block manager bookkeeping with exact ids, and engine outputs
with caching on token-identical to caching off (float32, greedy)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers import run_until_idle, tiny_config
from jaxinfer import LLM, SamplingParams
from jaxinfer.core.kv_cache.block_manager import BlockManager, chain_hashes
from jaxinfer.engine.llm_engine import LLMEngine
from jaxinfer.models.params import init_params

BS = 16


def test_chain_hashes_depend_on_parent_and_salt():
    a = chain_hashes(list(range(40)), BS)
    assert len(a) == 2  # partial third block not hashed
    b = chain_hashes([99] + list(range(1, 40)), BS)
    assert a[0] != b[0] and a[1] != b[1]  # same tokens in block 1, different parent
    assert chain_hashes(list(range(40)), BS, salt=b"other")[0] != a[0]
    assert chain_hashes(list(range(48)), BS, known=a) == chain_hashes(list(range(48)), BS)


def test_hits_refcounts_and_lru_eviction_exact_ids():
    bm = BlockManager(6, BS)  # usable blocks 1..5
    h = chain_hashes(list(range(64)), BS)
    a = bm.allocate(3)
    assert a == [1, 2, 3]
    for blk, hh in zip(a, h):
        bm.register(blk, hh)
    assert bm.lookup(h) == [1, 2, 3]
    bm.touch([1, 2])  # a second request shares the first two blocks
    assert [bm.ref_count(b) for b in (1, 2, 3)] == [2, 2, 1]
    bm.free(a)  # first request ends: 1, 2 still held, 3 evictable (contents kept)
    assert bm.num_free_blocks == 3 and bm.lookup(h) == [1, 2, 3]
    bm.free([1, 2])  # second request ends: freed in reverse -> LRU order 3, 2, 1
    assert bm.num_free_blocks == 5 and bm.num_cached_blocks == 3
    assert bm.allocate(2) == [4, 5]  # plain free blocks first
    assert bm.lookup(h) == [1, 2, 3]
    assert bm.allocate(1) == [3]  # then the least recently freed cached block
    assert bm.lookup(h) == [1, 2] and bm.num_evictions == 1
    bm.touch([1])  # a hit on an evictable block takes it out of the pool
    assert bm.num_free_blocks == 1 and bm.allocate(1) == [2]
    assert bm.lookup(h) == [1]
    with pytest.raises(MemoryError):
        bm.allocate(1)
    bm.free([1, 2, 3, 4, 5])
    with pytest.raises(ValueError):
        bm.free([3])  # no block freed twice
    assert bm.num_free_blocks == 5


def test_first_holder_wins_and_disabled_cache():
    bm = BlockManager(4, BS)
    h = chain_hashes(list(range(16)), BS)
    x, y = bm.allocate(2)
    bm.register(x, h[0])
    bm.register(y, h[0])  # duplicate content computed concurrently: y stays uncached
    bm.free([x, y])
    assert bm.lookup(h) == [x]
    off = BlockManager(4, BS, enable_prefix_caching=False)
    b = off.allocate(1)
    off.register(b[0], h[0])
    off.free(b)
    assert off.lookup(h) == [] and off.num_cached_blocks == 0


CFG = tiny_config(vocab=256)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64, num_blocks=96,
               model_config=CFG, params=init_params(CFG, scale=5.0, seed=2), tokenizer=None)


def engine(llm, caching: bool, num_blocks: int = 96) -> LLMEngine:
    """A fresh engine over the shared runner. Engines created here run one after another,
    never interleaved: they share one KV memory."""
    e = llm.engine
    cfg = dataclasses.replace(e.config, cache=dataclasses.replace(e.config.cache, enable_prefix_caching=caching))
    return LLMEngine(cfg, e.model_config, e.runner, num_blocks, e.tokenizer)


def run(e: LLMEngine, waves, sp=GREEDY):
    """Submit each wave of prompts after the previous wave finished or after `gap` steps."""
    outs, cached = {}, {}
    k = 0
    for wave, gap in waves:
        for p in wave:
            e.add_request(str(k), p, sp)
            k += 1
        for _ in range(gap if gap is not None else 10**6):
            if not e.has_unfinished_requests():
                break
            for o in e.step():
                if o.finished:
                    outs[o.request_id], cached[o.request_id] = o.outputs[0].token_ids, o.num_cached_tokens
    for rid, o in run_until_idle(e).items():
        outs[rid], cached[rid] = o.outputs[0].token_ids, o.num_cached_tokens
    assert e.num_free_blocks == e.num_total_blocks
    return [outs[str(i)] for i in range(k)], [cached[str(i)] for i in range(k)]


def rand(n, seed):
    return np.random.RandomState(seed).randint(3, 256, n).tolist()


def test_shared_system_prompt_same_and_different_steps(llm):
    system = rand(70, 1)  # ends mid-block (70 = 4 full blocks + 6)
    prompts = [system + rand(5 + 3 * i, 10 + i) for i in range(6)]
    waves = [(prompts[:3], 0), (prompts[3:], None)]  # 3 together, 3 after they finished prefilling
    off, _ = run(engine(llm, False), [(prompts, None)])
    on_same, _ = run(engine(llm, True), [(prompts, None)])
    on_diff, cached = run(engine(llm, True), [(prompts[:3], None), (prompts[3:], None)])
    assert on_same == off and on_diff == off
    assert all(c == 64 for c in cached[3:])  # the 4 full system blocks came from the cache
    e = engine(llm, True)
    on_gap, _ = run(e, waves)
    assert on_gap == off and e.scheduler.prefix_hits > 0


def test_prefix_evicted_and_recomputed(llm):
    shared = rand(80, 3)
    prompts = [shared + rand(10, 20 + i) for i in range(3)]
    fillers = [rand(60, 40 + i) for i in range(4)]
    e = engine(llm, True, num_blocks=20)  # small pool: the fillers evict the shared blocks
    first, _ = run(e, [([prompts[0]], None), (fillers, None)])
    assert e.block_manager.num_evictions > 0
    assert e.snapshot().prefix_cache_evictions == e.block_manager.num_evictions  # jaxinfer_prefix_cache_evictions_total
    again, cached = run(e, [(prompts, None)])
    ref, _ = run(engine(llm, False), [(prompts, None)])
    assert again == ref and first[0] == ref[0]


def test_multi_turn_chat_extends_last_turn(llm):
    e_off = engine(llm, False)  # caching off first: the whole conversation, turn by turn
    convs, outs = [rand(30, 5)], []
    for turn in range(4):
        (off,), _ = run(e_off, [([convs[-1]], None)])
        outs.append(off)
        convs.append(convs[-1] + off + rand(7, 100 + turn))  # the next user turn extends the history
    e_on, computed_before = engine(llm, True), 0
    for conv, off in zip(convs, outs):
        (on,), (c,) = run(e_on, [([conv], None)])
        assert on == off
        # Every full block the previous turn computed (its last sampled token never was) is a hit.
        assert c == 16 * min(computed_before // 16, (len(conv) - 1) // 16)
        computed_before = len(conv) + len(on) - 1


def test_preemption_with_caching(llm):
    prompts = [rand(40, 7)[:20] + rand(30 + 5 * i, 60 + i) for i in range(6)]
    ref, _ = run(engine(llm, False), [(prompts, None)])
    e = engine(llm, True, num_blocks=14)
    got, _ = run(e, [(prompts, None)])
    assert e.scheduler.num_preemptions > 0 and got == ref


def test_reset_prefix_cache_only_when_idle():
    bm = BlockManager(4, BS)
    h = chain_hashes(list(range(16)), BS)
    b = bm.allocate(1)
    bm.register(b[0], h[0])
    assert not bm.reset_prefix_cache() and bm.lookup(h) == b  # in use: refused, unchanged
    bm.free(b)
    assert bm.reset_prefix_cache()
    assert bm.lookup(h) == [] and bm.num_free_blocks == 3 and bm.allocate(3) == [1, 2, 3]
