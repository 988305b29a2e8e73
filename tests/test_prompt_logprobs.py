"""Prompt logprobs (vLLM's ``prompt_logprobs``) through the paged, chunked prefill, on tiny
random models, against transformers' float32 forward over the same weights.

Covers: values and top-k at every prompt position (chunks of 32 tokens, a 1-token prompt,
rows with and without prompt logprobs in one step), tied and untied LM heads, a request
that would hit the prefix cache (it computes its whole prompt instead; later requests still
hit the blocks it registered), recompute after preemption (each position recorded once),
nothing compiled after warm-up, and the limits.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers import hf_logits, hf_model, run_until_idle, tiny_config
from jaxinfer import LLM, SamplingParams
from jaxinfer.engine.llm_engine import LLMEngine
from jaxinfer.errors import RequestError
from jaxinfer.runner.model_runner import CompileCounter
from jaxinfer.models.params import init_params

TOP = 3


def _make(tied: bool):
    """The untied model warms up (so compilations can be counted); the tied one compiles on use."""
    cfg = tiny_config(vocab=256, tied=tied)
    params = init_params(cfg, scale=4.0, seed=3)
    llm = LLM("tiny", max_model_len=256, max_num_seqs=8, max_num_batched_tokens=32, num_blocks=96, model_config=cfg,
              params=params, tokenizer=None, use_tqdm=False, warmup=not tied)
    return llm, hf_model(cfg, params)


@pytest.fixture(scope="module")
def untied():
    return _make(False)


def rand(n, seed):
    return np.random.RandomState(seed).randint(3, 256, n).tolist()


def reference(model, prompt):
    """Per position p >= 1: (logprob of prompt[p], top-TOP ids, the whole logprob row), float64."""
    logits = hf_logits(model, prompt).astype(np.float64)
    m = logits.max(-1, keepdims=True)
    lp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    return [(lp[p - 1, prompt[p]], list(np.argsort(-lp[p - 1])[:TOP]), lp[p - 1]) for p in range(1, len(prompt))]


def check(out, model, prompt):
    got = out.prompt_logprobs
    assert len(got) == len(prompt) and got[0] is None
    for p, (want, top, row) in enumerate(reference(model, prompt), start=1):
        entry, tok = got[p], prompt[p]
        np.testing.assert_allclose(entry[tok].logprob, want, rtol=1e-4, atol=1e-4)
        assert entry[tok].rank == 1 + int(np.sum(row > row[tok]))
        assert set(entry) == set(top) | {tok}
        assert [entry[t].rank for t in top] == list(range(1, TOP + 1))
        for t, lp in entry.items():
            np.testing.assert_allclose(lp.logprob, row[t], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tied", [False, True])
def test_values_match_transformers_across_chunks(tied, untied):
    llm, model = untied if not tied else _make(True)
    prompts = [rand(70, 1), [7], rand(5, 2), rand(33, 4)]  # 70 and 33 tokens span chunks of 32
    params = [SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=TOP),
              SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=TOP),
              SamplingParams(temperature=0, max_tokens=3),  # no prompt logprobs in the same steps
              SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=TOP, logprobs=1)]
    before = CompileCounter.count
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert tied or CompileCounter.count == before, "prompt logprobs must not compile after warm-up"
    for i in (0, 1, 3):
        check(outs[i], model, prompts[i])
    assert outs[2].prompt_logprobs is None
    # the sampled tokens are the same with and without prompt logprobs
    again = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in outs]


def _engine(llm, num_blocks=96, caching=True) -> LLMEngine:
    e = llm.engine
    cfg = dataclasses.replace(e.config, cache=dataclasses.replace(e.config.cache, enable_prefix_caching=caching))
    return LLMEngine(cfg, e.model_config, e.runner, num_blocks, e.tokenizer)


def test_prefix_cache_hit_is_skipped_then_reused(untied):
    llm, model = untied
    prompt = rand(60, 5)
    e = _engine(llm)
    e.add_request("plain", prompt, SamplingParams(temperature=0, max_tokens=2))
    run_until_idle(e)
    e.add_request("scored", prompt, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=TOP))
    out = run_until_idle(e)["scored"]
    assert out.num_cached_tokens == 0
    check(out, model, prompt)
    e.add_request("again", prompt, SamplingParams(temperature=0, max_tokens=2))
    assert run_until_idle(e)["again"].num_cached_tokens == 48  # the 3 full blocks before the last token


def test_recompute_after_preemption_records_each_position_once(untied):
    llm, model = untied
    prompts = [rand(30 + 5 * i, 60 + i) for i in range(6)]
    e = _engine(llm, num_blocks=14, caching=False)
    for i, p in enumerate(prompts):
        e.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, prompt_logprobs=1))
    outs = run_until_idle(e)
    assert e.scheduler.num_preemptions > 0
    for i, p in enumerate(prompts):
        got = outs[str(i)].prompt_logprobs
        assert len(got) == len(p)
        for q, (want, _, _) in enumerate(reference(model, p), start=1):
            np.testing.assert_allclose(got[q][p[q]].logprob, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("value", [-1, 21, 1.5, True])
def test_limits(untied, value):
    llm, _ = untied
    with pytest.raises(RequestError) as err:
        llm.generate([[5, 6, 7]], SamplingParams(prompt_logprobs=value), use_tqdm=False)
    assert err.value.param == "prompt_logprobs"


def test_one_token_prompt_has_the_position_0_entry(untied):
    """Every prompt position gets an entry, so a one-token prompt gets ``[None]`` (not ``[]``)."""
    llm, _ = untied
    out = llm.generate([[5]], SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2), use_tqdm=False)[0]
    assert out.prompt_logprobs == [None]
