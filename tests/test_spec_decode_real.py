"""Speculative decoding on the real SmolLM2-135M-Instruct (issue 17): with n-gram prompt
lookup, greedy outputs of the shared oracle prompts equal transformers' reference tokens,
one at a time and all in one call, and drafts were accepted along the way."""
from __future__ import annotations

import pytest

from jaxinfer import LLM, SamplingParams

pytestmark = [pytest.mark.real_model, pytest.mark.slow]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32)
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@pytest.fixture(scope="module")
def llm(smollm2_dir):
    return LLM(str(smollm2_dir), dtype="float32", max_model_len=256, max_num_seqs=32, max_num_batched_tokens=128,
               num_blocks=160, warmup=False, speculative_config=SPEC)


def test_oracle_prompts_identical_with_ngram(llm, oracle):
    recs = oracle["results"]
    for rec in recs[:3]:
        out = llm.generate([rec["prompt_ids"]], GREEDY, use_tqdm=False)[0].outputs[0]
        assert out.token_ids == rec["generated_ids"], rec["index"]
    outs = llm.generate([r["prompt_ids"] for r in recs], GREEDY, use_tqdm=False)
    for rec, o in zip(recs, outs):
        assert o.outputs[0].token_ids == rec["generated_ids"], rec["index"]
        assert o.outputs[0].finish_reason == ("stop" if rec["stopped_on_eos"] else "length")
    e = llm.engine
    assert e.speculator.stats.num_accepted_tokens > 0
    assert e.num_free_blocks == e.num_total_blocks and not e.requests


def test_input_grounded_prompts_identical_to_no_speculation(llm):
    """On the input-grounded workload (answers copy spans of the prompt), greedy outputs
    with n-gram speculation equal those of the same runner without it, in one batch."""
    import dataclasses

    import numpy as np

    from helpers import run_until_idle
    from jaxinfer.bench import grounded
    from jaxinfer.engine.llm_engine import LLMEngine

    tok = llm.get_tokenizer()
    texts = [t for t, _ in grounded.prompts(3, 100, np.random.default_rng(0))]  # + 48 within max_model_len 256
    ids = [tok.encode(t) for t in texts]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    e = llm.engine
    accepted = e.speculator.stats.num_accepted_tokens
    got = [o.outputs[0].token_ids for o in llm.generate(ids, params, use_tqdm=False)]
    assert e.speculator.stats.num_accepted_tokens > accepted  # drafts were accepted on these prompts
    plain = LLMEngine(dataclasses.replace(e.config, speculative=None), e.model_config, e.runner,
                      e.block_manager.num_blocks)
    for i, p in enumerate(ids):
        plain.add_request(str(i), p, params)
    done = run_until_idle(plain)
    assert got == [done[str(i)].outputs[0].token_ids for i in range(len(ids))]
