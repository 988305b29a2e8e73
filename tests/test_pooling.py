"""Pooling requests end to end on a tiny random Llama (float32): the offline `LLM.embed` /
`encode` against transformers' final hidden states (after the final norm, ``last`` and
``mean``, prompts longer than one chunk), KV blocks freed in the step the prefill ends, no
compilation after warm-up, and generation unchanged by embedding requests in its batches."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from helpers import hf_model, tiny_config
from jaxinfer import LLM, PoolingParams, SamplingParams
from jaxinfer.engine.protocol import RequestSpec
from jaxinfer.errors import RequestError
from jaxinfer.models.params import init_params

CFG = tiny_config(vocab=256, tied=False)
PARAMS = init_params(CFG, scale=5.0, seed=1)
CHUNK = 32  # max_num_batched_tokens
PROMPTS = [[5, 17, 99, 3], list(range(3, 80)), [7], list(range(200, 100, -1))]  # 77 and 100 tokens: chunked


def make_llm(**kw):
    args = dict(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=CHUNK, num_blocks=48, model_config=CFG,
                params=PARAMS, tokenizer=None, warmup=False, runner="pooling", dtype="float32", use_tqdm=False)
    return LLM("tiny", **{**args, **kw})


@pytest.fixture(scope="module")
def llm():
    return make_llm()


@pytest.fixture(scope="module")
def hf_states():
    hf = hf_model(CFG, PARAMS)
    with torch.no_grad():
        return [hf.model(torch.tensor([p])).last_hidden_state[0].numpy().astype(np.float64) for p in PROMPTS]


def assert_idle(llm):
    e = llm.engine
    assert e.num_free_blocks == e.num_total_blocks and not e.requests and not e.has_unfinished_requests()


def test_last_pooling_equals_transformers_final_hidden_state(llm, hf_states):
    outs = llm.encode(PROMPTS, PoolingParams(normalize=False), use_tqdm=False)
    for out, h, p in zip(outs, hf_states, PROMPTS):
        assert out.prompt_token_ids == p and out.finished
        np.testing.assert_allclose(out.outputs.data, h[-1], atol=1e-4, rtol=0)
    assert_idle(llm)


def test_mean_pooling_equals_transformers_mean_over_chunks(hf_states):
    llm = make_llm(pooling_type="mean", enable_prefix_caching=True)
    llm.encode(PROMPTS[1], use_tqdm=False)  # its blocks are now in the prefix cache: mean must not use them
    outs = llm.encode(PROMPTS, PoolingParams(normalize=False), use_tqdm=False)
    for out, h in zip(outs, hf_states):
        np.testing.assert_allclose(out.outputs.data, h.mean(axis=0), atol=1e-4, rtol=0)
    assert outs[1].num_cached_tokens == 0
    assert_idle(llm)


def test_embed_normalizes_and_truncates(llm, hf_states):
    outs = llm.embed(PROMPTS[:2], use_tqdm=False)
    for out, h in zip(outs, hf_states):
        v = np.asarray(out.outputs.embedding)
        np.testing.assert_allclose(v, h[-1] / np.linalg.norm(h[-1]), atol=1e-5)
        assert out.outputs.hidden_size == CFG.hidden_size
    short = llm.embed(PROMPTS[0], PoolingParams(dimensions=5), use_tqdm=False)[0].outputs.embedding
    h = hf_states[0][-1][:5]
    np.testing.assert_allclose(short, h / np.linalg.norm(h), atol=1e-5)


def test_bad_inputs_are_refused_before_any_work(llm):
    steps = llm.engine.num_steps
    with pytest.raises(RequestError, match="dimensions"):
        llm.embed([1, 2], PoolingParams(dimensions=CFG.hidden_size + 1), use_tqdm=False)
    with pytest.raises(RequestError, match="limit is 128"):
        llm.embed(list(range(1, 130)), use_tqdm=False)
    with pytest.raises(RequestError):
        llm.embed([[1, 2], []], use_tqdm=False)
    with pytest.raises(RequestError, match="dimensions"):
        PoolingParams(dimensions=0)
    with pytest.raises(ValueError, match="LLM.embed"):
        llm.generate([1, 2, 3])
    assert llm.engine.num_steps == steps
    assert_idle(llm)
    assert len(llm.embed(list(range(1, 129)), use_tqdm=False)[0].outputs.embedding) == CFG.hidden_size  # = limit


def test_generate_llm_refuses_embed():
    gen = make_llm(runner="generate")
    with pytest.raises(ValueError, match='runner="pooling"'):
        gen.embed([1, 2, 3])


def test_blocks_are_freed_in_the_step_the_prefill_ends(llm):
    e = llm.engine
    e.add_requests([RequestSpec("p", list(range(1, 21)), SamplingParams(), pooling=PoolingParams())])
    outs = e.step()  # 20 tokens: one step
    assert [o.request_id for o in outs] == ["p"] and outs[0].finished and outs[0].pooled is not None
    assert outs[0].outputs[0].finish_reason == "stop" and outs[0].outputs[0].token_ids == []
    assert_idle(llm)
    fresh = list(range(250, 180, -1))  # 70 tokens no earlier prompt began with (no prefix-cache hit)
    e.add_requests([RequestSpec("q", fresh, SamplingParams(), pooling=PoolingParams())])
    assert e.step() == [] and e.num_free_blocks < e.num_total_blocks  # 70 tokens: 3 chunks, blocks held
    assert e.step() == []
    assert e.step()[0].finished
    assert_idle(llm)


def test_abort_mid_prefill_frees_blocks_and_returns_no_vector(llm):
    e = llm.engine
    e.add_requests([RequestSpec("a", list(range(240, 170, -1)), SamplingParams(), pooling=PoolingParams())])
    assert e.step() == [] and e.num_free_blocks < e.num_total_blocks  # first of 3 chunks computed
    e.abort_request("a")
    (out,) = e.step()
    assert out.finished and out.outputs[0].finish_reason == "abort" and out.pooled is None
    assert_idle(llm)


def test_last_pooling_uses_prefix_cache_hits(llm, hf_states):
    """``last`` needs the last token alone (always computed): a cached prefix is reused."""
    llm.encode(PROMPTS[3], use_tqdm=False)
    out = llm.encode(PROMPTS[3], PoolingParams(normalize=False), use_tqdm=False)[0]
    assert out.num_cached_tokens > 0
    np.testing.assert_allclose(out.outputs.data, hf_states[3][-1], atol=1e-4, rtol=0)


def test_no_compilation_after_warmup_and_generation_unchanged_by_embeddings():
    """Greedy tokens of 3 streams alone, then with embedding requests (some chunked) joining
    their batches at several steps: the same tokens, no new compilation, nothing held after."""
    llm = make_llm(warmup=True, max_model_len=64, max_num_batched_tokens=16)  # few buckets: a short warm-up
    e = llm.engine
    compiled = e.runner.num_compilations
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    gen_prompts = [[9, 8, 7, 6], list(range(40, 60)), [100, 3]]

    def run(with_embeddings: bool):
        e.add_requests([RequestSpec(f"g{i}-{with_embeddings}", p, greedy) for i, p in enumerate(gen_prompts)])
        done, step = {}, 0
        while e.has_unfinished_requests():
            if with_embeddings and step in (1, 4, 9):
                e.add_requests([RequestSpec(f"e{step}-{j}", list(range(step + 1, step + 1 + n)), greedy,
                                            pooling=PoolingParams()) for j, n in enumerate((5, 40))])
            for out in e.step():
                if out.finished:
                    done[out.request_id] = out
            step += 1
        return done

    alone = run(False)
    mixed = run(True)
    for i in range(len(gen_prompts)):
        assert mixed[f"g{i}-True"].outputs[0].token_ids == alone[f"g{i}-False"].outputs[0].token_ids
    assert sum(k.startswith("e") and v.pooled is not None for k, v in mixed.items()) == 6
    assert e.runner.num_compilations == compiled
    assert_idle(llm)


def test_pooling_config_flags():
    from jaxinfer.config.args import engine_config, pooler_config
    from types import SimpleNamespace

    assert pooler_config('{"pooling_type": "MEAN"}') == "mean" and pooler_config(None) is None
    for bad in ('{"pooling_type": "CLS"}', '{"normalize": false}', "[1]", "{"):
        with pytest.raises(ValueError, match="pooler-config"):
            pooler_config(bad)
    cfg = engine_config(SimpleNamespace(runner="pooling", pooling_type="last", pooler_config='{"pooling_type": "mean"}'),
                        CFG)
    assert (cfg.runner, cfg.pooling_type) == ("pooling", "mean")
    with pytest.raises(ValueError, match="runner"):
        dataclasses.replace(cfg, runner="embed")


def test_host_pooling_weights_and_restart_after_preemption():
    """`jaxinfer.core.pooling`: which packed tokens each row pools, and a chunk from position 0
    (a preempted request recomputing) restarting the running sum."""
    from jaxinfer.core import pooling
    from jaxinfer.core.request import Request

    def req(n, kind):
        r = Request("r", list(range(n)), SamplingParams(), seed=0, max_tokens=0)
        r.pooling = PoolingParams().resolved(kind)
        return r

    gen = Request("g", [1, 2], SamplingParams(), seed=0, max_tokens=4)
    assert pooling.step_weights([(gen, 0, 2)], 8, 2) is None  # a generate-only step sends nothing
    last, mean = req(10, "last"), req(10, "mean")
    rows, w = pooling.step_weights([(last, 0, 4), (mean, 6, 4), (gen, 2, 1)], 12, 4)
    assert rows.tolist() == [4, 4, 4, 4, 1, 1, 1, 1, 4, 4, 4, 4] and w.tolist() == [0] * 4 + [1] * 4 + [0] * 4
    rows, _ = pooling.step_weights([(last, 6, 4)], 8, 2)
    assert rows.tolist() == [2, 2, 2, 0, 2, 2, 2, 2]  # the final chunk's last token
    pooling.record(mean, np.full(3, 2.0), 0, 6)
    pooling.record(mean, np.full(3, 1.0), 0, 4)  # preempted: recomputed from 0
    pooling.record(mean, np.full(3, 3.0), 4, 6)
    mean.pooling = dataclasses.replace(mean.pooling, normalize=False)
    np.testing.assert_allclose(pooling.finalize(mean), np.full(3, 0.4))
    assert pooling.needs_every_position(mean) and not pooling.needs_every_position(last)
