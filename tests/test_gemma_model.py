"""Gemma 3's structure (sliding windows 5:1, local RoPE base, qk-norm, sandwich norms, GeGLU,
scaled embeddings, 1 + w norms) on a tiny random model against transformers' Gemma3ForCausalLM;
batching, preemption and prefix caching with windowed layers; both attention backends."""
from __future__ import annotations

import numpy as np
import pytest

from gemma_helpers import hf_gemma, tiny_gemma_config, tiny_gemma_params
from helpers import borrowed_runner, hf_logits, run_until_idle
from jaxinfer import LLM, SamplingParams

CFG = tiny_gemma_config()  # window 8: every prompt below crosses it, and blocks of 16 too
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def setup():
    params = tiny_gemma_params(CFG)
    llm = LLM("tiny-gemma", max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64, num_blocks=96,
              model_config=CFG, params=params, tokenizer=None, return_logits=True)
    return llm, hf_gemma(CFG, params), params


def prompts(lengths, seed=0):
    rs = np.random.RandomState(seed)
    return [rs.randint(3, CFG.vocab_size, n).tolist() for n in lengths]


def hf_greedy(hf, prompt, n):
    import torch

    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


def test_config_round_trips_through_transformers():
    import transformers

    hf_cfg = transformers.Gemma3TextConfig(**{k: v for k, v in CFG.to_hf_dict().items() if k != "architectures"})
    assert hf_cfg.layer_types == list(CFG.layer_types) and CFG.layer_types.count("full_attention") == 1
    from jaxinfer.config import ModelConfig
    assert ModelConfig.from_dict(hf_cfg.to_dict()) == CFG


def test_logits_match_transformers(setup):
    llm, hf, _ = setup
    p = prompts([37])[0]  # prefill in chunks past the window; decode past block edges
    out = llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0]
    ref = hf_logits(hf, p + out.token_ids)
    for i, lg in enumerate(out.logits):
        np.testing.assert_allclose(lg, ref[len(p) - 1 + i], atol=2e-4, rtol=1e-4)


def test_window_changes_the_output(setup):
    """The sliding layers really mask: the same weights without windows give other logits."""
    import dataclasses

    llm, _, params = setup
    full = LLM("tiny-gemma-full", max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32, num_blocks=16,
               model_config=dataclasses.replace(CFG, layer_types=(), sliding_window=None), params=params,
               tokenizer=None, warmup=False, return_logits=True)
    p = prompts([30], seed=4)[0]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    a = llm.generate([p], one, use_tqdm=False)[0].outputs[0].logits[0]
    b = full.generate([p], one, use_tqdm=False)[0].outputs[0].logits[0]
    assert np.abs(a - b).max() > 1e-2


def test_batched_greedy_equals_transformers_and_solo(setup):
    llm, hf, _ = setup
    ps = prompts([1, 7, 8, 9, 16, 17, 40])
    batched = llm.generate(ps, GREEDY, use_tqdm=False)
    for p, o in zip(ps, batched):
        assert o.outputs[0].token_ids == hf_greedy(hf, p, 20)
    solo = [llm.generate([p], GREEDY, use_tqdm=False)[0] for p in ps[-2:]]
    assert [o.outputs[0].token_ids for o in solo] == [o.outputs[0].token_ids for o in batched[-2:]]


def test_preemption_and_prefix_cache_keep_outputs(setup):
    llm, _, _ = setup
    shared = prompts([40], seed=9)[0]  # a shared prefix of 2.5 blocks, 5 windows long
    ps = [shared + t for t in prompts([5, 12, 20, 3, 9, 30], seed=5)]
    ref = [o.outputs[0].token_ids for o in llm.generate(ps, GREEDY, use_tqdm=False)]
    with borrowed_runner(llm.engine, 14) as e:  # 13 usable blocks: 6 requests need ~30
        for i, p in enumerate(ps):
            e.add_request(str(i), p, GREEDY)
        done = run_until_idle(e)
        assert e.scheduler.num_preemptions > 0
        assert [done[str(i)].outputs[0].token_ids for i in range(len(ps))] == ref
    for caching in (True, False):
        with borrowed_runner(llm.engine, enable_prefix_caching=caching) as e:
            for i, p in enumerate(ps):  # one after the other: the later ones hit the cached prefix
                e.add_request(str(i), p, GREEDY)
                done = run_until_idle(e)
                assert done[str(i)].outputs[0].token_ids == ref[i]


@pytest.mark.slow
def test_pallas_backend_matches_xla(setup):
    """The Pallas kernel (interpret mode) with per-layer windows gives the XLA path's tokens."""
    llm, _, params = setup
    pallas = LLM("tiny-gemma-pallas", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32, num_blocks=32,
                 model_config=CFG, params=params, tokenizer=None, warmup=False, return_logits=True,
                 attention_backend="pallas")
    ps = prompts([5, 20, 37], seed=2)
    sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    want = llm.generate(ps, sp, use_tqdm=False)
    got = pallas.generate(ps, sp, use_tqdm=False)
    for w, g in zip(want, got):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        np.testing.assert_allclose(np.stack(g.outputs[0].logits), np.stack(w.outputs[0].logits), atol=1e-4)
