"""Speculative sampling keeps the target's distribution (issue 17): at temperature 0.8, a
tiny model with a 32-token vocabulary, 20,000 seeded samples with speculation (n-gram,
one-hot drafts) against 20,000 without, with different seeds; chi-square tests of
homogeneity of the token histograms at output positions 1-3 (the ones verified against
drafts; position 0 comes from the prefill) and of the joint (1, 2) histogram, p > 0.01.

Speed: one engine call per configuration; the KV pool caps running requests near 100 so
that each step has spare rows for their drafts; the prompt's full blocks are shared
through the prefix cache, so each request prefills a few tokens. The prompt is the
model's own greedy continuation and the LM head is scaled up, so that drafts are often
accepted (the test exercises acceptance and rejection both).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from helpers import run_until_idle, tiny_config
from jaxinfer import LLM, SamplingParams
from jaxinfer.engine.llm_engine import LLMEngine
from jaxinfer.engine.protocol import RequestSpec
from jaxinfer.models.params import init_params

V = 32  # small, and at least the top-20 logprobs the step always computes
CFG = tiny_config(vocab=V, hidden=32, layers=1, heads=2, kv_heads=1, inter=64, tied=False, max_pos=64)
N = 20_000
MAX_TOKENS = 4
HEAD_SCALE = 15.0  # sharper logits: the most likely token has roughly half the mass


def make_params():
    params = init_params(CFG, scale=1.0, seed=3)
    params["lm_head"]["kernel"] = params["lm_head"]["kernel"] * HEAD_SCALE
    return params


def engines():
    """(speculating engine, plain engine over the same compiled runner), and the prompt:
    the model's own greedy continuation of a seed, so that n-gram drafts are often right."""
    llm = LLM("tiny-stats", max_model_len=64, max_num_seqs=384, max_num_batched_tokens=384, num_blocks=120,
              model_config=CFG, params=make_params(), tokenizer=None, warmup=False, use_tqdm=False,
              speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
                                  "prompt_lookup_max": 2, "min_acceptance_rate": 0.0})
    greedy = llm.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=37, ignore_eos=True), use_tqdm=False)
    e = llm.engine
    plain = LLMEngine(dataclasses.replace(e.config, speculative=None), e.model_config, e.runner, e.block_manager.num_blocks)
    return e, plain, [3, 4, 5] + greedy[0].outputs[0].token_ids


def samples(engine, prompt, seed0):
    """Output tokens [N, MAX_TOKENS] of N requests seeded seed0, seed0 + 1, ..."""
    engine.add_requests([RequestSpec(str(i), prompt, SamplingParams(temperature=0.8, seed=seed0 + i,
                                                                    max_tokens=MAX_TOKENS, ignore_eos=True))
                         for i in range(N)])
    done = run_until_idle(engine)
    assert engine.reset_prefix_cache()  # the other engine writes the same KV memory next
    return np.array([done[str(i)].outputs[0].token_ids for i in range(N)])


def homogeneity_p(a, b, cells):
    """Chi-square p of two samples' histograms over ``cells``, rare cells pooled (expected >= 5)."""
    ha, hb = np.bincount(a, minlength=cells), np.bincount(b, minlength=cells)
    order = np.argsort(ha + hb)
    small = np.cumsum((ha + hb)[order]) < 10  # pool the rarest cells until they expect >= 5 each side
    keep = order[~small]
    table = np.array([np.append(ha[keep], ha[order[small]].sum()), np.append(hb[keep], hb[order[small]].sum())])
    table = table[:, table.sum(0) > 0]
    return chi2_contingency(table)[1]


@pytest.mark.slow
def test_sampled_distribution_equals_target():
    engine, plain_engine, prompt = engines()
    spec = samples(engine, prompt, seed0=0)
    st = engine.speculator.stats
    assert st.num_draft_tokens > N and st.num_accepted_tokens > 0.3 * st.num_draft_tokens  # drafts were verified
    plain = samples(plain_engine, prompt, seed0=10 * N)
    assert spec.shape == plain.shape == (N, MAX_TOKENS)
    for pos in (1, 2, 3):
        assert np.bincount(plain[:, pos]).max() < 0.9 * N  # not a degenerate distribution
        assert homogeneity_p(spec[:, pos], plain[:, pos], V) > 0.01, pos
    assert homogeneity_p(spec[:, 1] * V + spec[:, 2], plain[:, 1] * V + plain[:, 2], V * V) > 0.01
