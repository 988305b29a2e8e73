"""Gemma 3's structure (sliding windows 5:1, local RoPE base, qk-norm, sandwich norms, GeGLU,
scaled embeddings, 1 + w norms) on a tiny random model against transformers' Gemma3ForCausalLM;
batching, preemption and prefix caching with windowed layers; no compilation after warm-up;
both attention backends.

Compiles dominate this file's time: one engine, warmed up once with small limits (8
buckets: 1, 2, 4 or 8 tokens x context width 0 or 4 blocks), serves every test but the
Pallas one."""
from __future__ import annotations

import numpy as np
import pytest

from gemma_helpers import hf_gemma, tiny_gemma_config, tiny_gemma_params
from helpers import borrowed_runner, hf_logits, run_until_idle
from jaxinfer import LLM, SamplingParams
from jaxinfer.runner.model_runner import CompileCounter

CFG = tiny_gemma_config()  # window 8: every prompt below crosses it, and blocks of 16 too
MAX_LEN = 64
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def setup():
    """(warmed-up engine, its transformers twin, params); 64 tokens of context, 8 per step."""
    params = tiny_gemma_params(CFG)
    llm = LLM("tiny-gemma", max_model_len=MAX_LEN, max_num_seqs=8, max_num_batched_tokens=8, num_blocks=48,
              model_config=CFG, params=params, tokenizer=None, return_logits=True, use_tqdm=False)
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


def test_no_compilation_after_warmup(setup):
    """Every prompt length up to the context, mixed sampling, preemption and the prefix cache
    run on the warm-up's executables alone."""
    llm, _, _ = setup
    runner = llm.engine.runner
    before = (CompileCounter.count, runner.num_compilations)
    ps = prompts([1, 7, 8, 9, 15, 16, 17, 31, 33, 47, 63], seed=11)
    params = [[GREEDY, SamplingParams(temperature=0.8, top_k=5, seed=i, max_tokens=12),
               SamplingParams(temperature=0, max_tokens=10, logprobs=5),
               SamplingParams(temperature=1.0, top_p=0.5, min_p=0.1, presence_penalty=1.0, frequency_penalty=0.5,
                              repetition_penalty=1.3, max_tokens=9, logit_bias={7: 3.0}, logprobs=0)][i % 4]
              for i in range(len(ps))]
    params = [sp.replace(max_tokens=min(sp.max_tokens, MAX_LEN - len(p))) for sp, p in zip(params, ps)]
    llm.generate(ps, params, use_tqdm=False)
    with borrowed_runner(llm.engine, 10) as e:  # 9 blocks for ~20 needed: forced preemption
        for i, p in enumerate(ps[:8]):
            e.add_request(str(i), p, params[i])
        run_until_idle(e)
        assert e.scheduler.num_preemptions > 0
    assert (CompileCounter.count, runner.num_compilations) == before


def test_logits_match_transformers(setup):
    llm, hf, _ = setup
    p = prompts([37])[0]  # prefill in chunks past the window; decode past block edges
    out = llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0]
    ref = hf_logits(hf, p + out.token_ids)
    for i, lg in enumerate(out.logits):
        np.testing.assert_allclose(lg, ref[len(p) - 1 + i], atol=2e-4, rtol=1e-4)


def test_window_changes_the_output(setup):
    """The sliding layers really mask: the engine matches transformers with windows of 8, and
    transformers with the same weights and windows wider than the prompt (only the masks
    differ) gives other logits."""
    import dataclasses

    llm, _, params = setup
    full = hf_gemma(dataclasses.replace(CFG, sliding_window=CFG.max_position_embeddings), params)
    p = prompts([30], seed=4)[0]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    a = llm.generate([p], one, use_tqdm=False)[0].outputs[0].logits[0]
    np.testing.assert_allclose(a, hf_logits(setup[1], p)[-1], atol=2e-4, rtol=1e-4)
    assert np.abs(a - hf_logits(full, p)[-1]).max() > 1e-2


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
    shared = prompts([24], seed=9)[0]  # a shared prefix of 1.5 blocks, 3 windows long
    ps = [shared + t for t in prompts([5, 12, 19, 3, 9, 15], seed=5)]
    ref = [o.outputs[0].token_ids for o in llm.generate(ps, GREEDY, use_tqdm=False)]
    with borrowed_runner(llm.engine, 7) as e:  # 6 usable blocks: 6 requests need ~18
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
