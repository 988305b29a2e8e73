"""Speculation with a draft model (issue 17) on tiny random models sharing a vocabulary.

Draft = the target itself: every greedy draft must be accepted, which holds only if the
draft's own KV pool, addressed through the target's block tables, mirrors the target's
exactly (prefill chunks, prefix-cache hits, roll-back, preemption and recompute
included). A different draft: outputs still token-identical to the engine without
speculation (greedy, batch of 16, preemption; seeded sampling), and nothing compiles
after warm-up.
"""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest

from helpers import run_requests, tiny_config
from jaxinfer import LLM, SamplingParams
from jaxinfer.engine.llm_engine import LLMEngine
from jaxinfer.runner.model_runner import CompileCounter
from jaxinfer.models.params import init_params

CFG = tiny_config(vocab=64, tied=False)
DRAFT_CFG = tiny_config(vocab=64, hidden=32, layers=1, heads=2, kv_heads=1, inter=64)
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def spec(**kw):
    return {"method": "draft_model", "model": "tiny-draft", "num_speculative_tokens": 3, "min_acceptance_rate": 0.0,
            **kw}


def make(draft_cfg, draft_params, warmup=False):
    params = init_params(CFG, scale=5.0, seed=1)
    return LLM("tiny", max_model_len=64, max_num_seqs=32, max_num_batched_tokens=32, num_blocks=160,
               model_config=CFG, params=params, tokenizer=None, speculative_config=spec(), use_tqdm=False,
               warmup=warmup, draft_model_config=draft_cfg,
               draft_params=params if draft_params == "target" else draft_params)


@pytest.fixture(scope="module")
def self_draft():
    return make(CFG, "target")


@pytest.fixture(scope="module")
def other_draft():
    return make(DRAFT_CFG, init_params(DRAFT_CFG, scale=5.0, seed=2), warmup=True)


@contextlib.contextmanager
def small_pool(llm, num_blocks):
    """An engine over ``llm``'s runners (target and draft) with a smaller block pool."""
    e = llm.engine
    other = LLMEngine(e.config, e.model_config, e.runner, num_blocks,
                      proposer_factory=lambda layout: e.speculator.proposer)
    try:
        yield other
    finally:
        assert other.reset_prefix_cache() and e.reset_prefix_cache()


run = run_requests


def plain(llm, prompts, params):
    e = llm.engine
    ref = LLMEngine(dataclasses.replace(e.config, speculative=None), e.model_config, e.runner,
                    e.block_manager.num_blocks)
    try:
        return run(ref, prompts, params)
    finally:
        assert ref.reset_prefix_cache() and e.reset_prefix_cache()


def prompts(n, seed):
    rs = np.random.RandomState(seed)
    return [rs.randint(3, CFG.vocab_size, rs.randint(3, 38)).tolist() for _ in range(n)]


def test_self_draft_accepts_every_greedy_draft(self_draft):
    e = self_draft.engine
    ps = prompts(16, seed=1)
    shared = [ps[0] + p for p in prompts(3, seed=9)]  # prefix-cache hits on ps[0]'s blocks
    out = run(e, ps, GREEDY) + run(e, [p[:38] for p in shared], GREEDY)
    st = e.speculator.stats
    assert st.num_draft_tokens > 100 and st.num_accepted_tokens == st.num_draft_tokens
    with small_pool(self_draft, 20) as small:
        again = run(small, ps, GREEDY)
        assert small.scheduler.num_preemptions > 0
        assert small.speculator.stats.num_accepted_tokens == small.speculator.stats.num_draft_tokens > 0
    assert again == out[:16]


def test_other_draft_identical_outputs_and_no_compilation(other_draft):
    e = other_draft.engine
    compiles = CompileCounter.count
    ps = prompts(16, seed=2)
    sampled = [SamplingParams(temperature=0.8, seed=i, max_tokens=24, ignore_eos=True) for i in range(16)]
    got_greedy, got_sampled = run(e, ps, GREEDY), run(e, ps, sampled)
    assert CompileCounter.count == compiles
    assert e.speculator.stats.num_accepted_tokens > 0
    assert got_greedy == plain(other_draft, ps, GREEDY)
    assert got_sampled == plain(other_draft, ps, sampled)
    with small_pool(other_draft, 20) as small:
        assert run(small, ps, GREEDY) == got_greedy and small.scheduler.num_preemptions > 0


def test_draft_vocabulary_must_match():
    bad = tiny_config(vocab=32, hidden=32, layers=1, heads=2, kv_heads=1)
    with pytest.raises(ValueError, match="vocabulary"):
        make(bad, None)
