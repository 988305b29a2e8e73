"""Speculative decoding in the engine on a tiny random Llama (issue 17).

The reference is the same engine without speculation, over the same compiled runner:
greedy outputs must be token-identical alone, in a batch of 16 and under forced
preemption; seeded sampled outputs too (the verification rows draw each position's
sample exactly as a plain decode step); stop tokens, max_tokens and logprobs inside an
accepted run behave as without speculation. Every comparison also checks that drafts were
accepted, so it is not vacuous. Also: no compilation after warm-up, rolled-back blocks
(none leaked, none wrongly cached), and the counters against an independent count (a
lone request's output tokens = its steps + accepted drafts). The statistical test at
temperature 0.8 lives in test_spec_decode_stats.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from helpers import run_requests, run_until_idle, tiny_config
from jaxinfer import LLM, SamplingParams
from jaxinfer.engine.llm_engine import LLMEngine
from jaxinfer.runner.model_runner import CompileCounter
from jaxinfer.models.params import init_params

CFG = tiny_config(vocab=64, tied=False)
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1,
        "min_acceptance_rate": 0.0}
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    params = init_params(CFG, scale=5.0, seed=1)
    return LLM("tiny", max_model_len=64, max_num_seqs=16, max_num_batched_tokens=64, num_blocks=160,
               model_config=CFG, params=params, tokenizer=None, speculative_config=SPEC, use_tqdm=False)


@contextlib.contextmanager
def engine_like(llm, num_blocks=None, **changes):
    """Another engine over ``llm``'s compiled runner (its KV memory): ``changes`` replace
    fields of the config (``speculative=None``: the reference). Prefix caches reset after."""
    e = llm.engine
    other = LLMEngine(dataclasses.replace(e.config, **changes), e.model_config, e.runner,
                      num_blocks or e.block_manager.num_blocks)
    try:
        yield other
    finally:
        assert other.reset_prefix_cache() and e.reset_prefix_cache()


run = run_requests


def reference(llm, prompts, params, **changes):
    with engine_like(llm, speculative=None, **changes) as plain:
        return run(plain, prompts, params)


def prompts(n, seed=0):
    """Prompts that repeat a short motif (so outputs partly copy them) and random ones."""
    rs = np.random.RandomState(seed)
    out = []
    for i in range(n):
        if i % 2:
            out.append(rs.randint(3, CFG.vocab_size, rs.randint(5, 31)).tolist())
        else:
            out.append(rs.randint(3, CFG.vocab_size, rs.randint(3, 8)).tolist() * rs.randint(2, 5))
    return out


def accepted(llm):
    return llm.engine.speculator.stats.num_accepted_tokens


def test_greedy_alone_identical_and_no_compilation_after_warmup(llm):
    ps = prompts(6, seed=1)
    ref = reference(llm, ps, GREEDY)
    compiles, runner_compiles, acc = CompileCounter.count, llm.engine.runner.num_compilations, accepted(llm)
    for p, r in zip(ps, ref):
        assert run(llm.engine, [p], GREEDY)[0].token_ids == r.token_ids
    assert accepted(llm) > acc
    assert CompileCounter.count == compiles and llm.engine.runner.num_compilations == runner_compiles


def test_greedy_batch_of_16_identical(llm):
    ps = prompts(16, seed=2)
    ref = reference(llm, ps, GREEDY)
    acc = accepted(llm)
    assert [o.token_ids for o in run(llm.engine, ps, GREEDY)] == [o.token_ids for o in ref]
    assert accepted(llm) > acc


def test_greedy_under_preemption_identical(llm):
    ps = prompts(16, seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    ref = reference(llm, ps, params)
    with engine_like(llm, num_blocks=24) as small:
        got = run(small, ps, params)
        assert small.scheduler.num_preemptions > 0 and small.speculator.stats.num_accepted_tokens > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]


def test_seeded_sampling_identical_with_penalties_and_logprobs(llm):
    ps = prompts(8, seed=4)
    params = [SamplingParams(temperature=(0.3, 0.8)[i % 2], seed=100 + i, max_tokens=30, ignore_eos=True, logprobs=3,
                             top_k=20 if i % 2 else -1, frequency_penalty=0.3 if i % 3 == 0 else 0.0)
              for i in range(len(ps))]
    ref = reference(llm, ps, params)
    acc = accepted(llm)
    got = run(llm.engine, ps, params)
    assert accepted(llm) > acc
    for g, r in zip(got, ref):
        assert g.token_ids == r.token_ids
        assert [list(d) for d in g.logprobs] == [list(d) for d in r.logprobs]
        np.testing.assert_allclose([d[t].logprob for d, t in zip(g.logprobs, g.token_ids)],
                                   [d[t].logprob for d, t in zip(r.logprobs, r.token_ids)], atol=1e-5)


def test_stop_token_and_max_tokens_inside_an_accepted_run(llm):
    ps = prompts(8, seed=5)
    free = reference(llm, ps, GREEDY)
    # stop at a token each output produces after a while; cut max_tokens mid-run
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop_token_ids=[o.token_ids[12]])
              for o in free] + [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (7, 13, 22)]
    ps = ps + ps[:3]
    ref = reference(llm, ps, params)
    got = run(llm.engine, ps, params)
    for g, r in zip(got, ref):
        assert (g.token_ids, g.finish_reason, g.stop_reason) == (r.token_ids, r.finish_reason, r.stop_reason)


def test_rejected_drafts_never_reach_the_prefix_cache(llm):
    """Continue each finished sequence as a new prompt: its full blocks come from the
    prefix cache the speculating run filled; any rejected draft's K/V registered there
    would change the continuation (the reference computes it from scratch)."""
    ps = prompts(6, seed=6)
    first = run(llm.engine, ps, GREEDY)
    follow = [p + o.token_ids[:17] for p, o in zip(ps, first)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    hits = llm.engine.scheduler.prefix_hits
    got = run(llm.engine, follow, params)
    assert llm.engine.scheduler.prefix_hits > hits
    assert [o.token_ids for o in got] == [o.token_ids for o in reference(llm, follow, params)]


def test_counters_and_metrics(llm):
    e = llm.engine
    p = [5, 6, 7, 8, 9] * 6
    before = e.snapshot()
    steps0 = e.num_steps
    out = run(e, [p], GREEDY)[0]
    snap = e.snapshot()
    acc = snap.spec_num_accepted_tokens - before.spec_num_accepted_tokens
    assert acc > 0
    assert len(out.token_ids) == (e.num_steps - steps0) + acc  # one token per step, plus each accepted draft
    assert snap.spec_num_draft_tokens - before.spec_num_draft_tokens >= acc
    assert snap.spec_mean_acceptance_length == pytest.approx(1 + snap.spec_num_accepted_tokens / snap.spec_num_drafts)

    from jaxinfer.entrypoints.openai.metrics import _EngineCollector

    reg = CollectorRegistry()
    reg.register(_EngineCollector([SimpleNamespace(name="tiny", async_engine=SimpleNamespace(is_healthy=True, engine=e))]))
    text = generate_latest(reg).decode()
    vals = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert vals["jaxinfer_spec_decode_num_draft_tokens_total"] == snap.spec_num_draft_tokens
    assert vals["jaxinfer_spec_decode_num_accepted_tokens_total"] == snap.spec_num_accepted_tokens
    assert vals["jaxinfer_spec_decode_num_drafts_total"] == snap.spec_num_drafts
    assert vals["jaxinfer_spec_decode_mean_acceptance_length"] == pytest.approx(snap.spec_mean_acceptance_length)


def test_disable_by_batch_size_turns_speculation_off(llm):
    """Four requests admitted together run in lockstep: with disable_by_batch_size 4 no
    step speculates, with 5 they do."""
    ps = [[5, 6, 7, 8] * 2, [9, 10] * 4, [11, 12, 13, 14] * 2, [3, 4] * 4]
    drafts = {}
    for limit in (4, 5):
        spec = dataclasses.replace(llm.engine.config.speculative, disable_by_batch_size=limit)
        with engine_like(llm, speculative=spec) as e:
            got = run(e, ps, GREEDY)
            drafts[limit] = e.speculator.stats.num_draft_tokens
        assert [o.token_ids for o in got] == [o.token_ids for o in reference(llm, ps, GREEDY)]
    assert drafts[4] == 0 and drafts[5] > 0


@pytest.mark.slow
def test_pallas_backend_verification_rows():
    """The Pallas kernel (interpret mode on CPU; the default on GPUs) reads the verification
    rows' context, this step's earlier rows included, from the pages: same outputs."""
    cfg = tiny_config(vocab=64, hidden=32, layers=1, heads=2, kv_heads=1, inter=64)
    kw = dict(max_model_len=64, max_num_seqs=16, max_num_batched_tokens=32, num_blocks=64, model_config=cfg,
              params=init_params(cfg, scale=5.0, seed=1), tokenizer=None, warmup=False, use_tqdm=False,
              attention_backend="pallas", block_size=8)
    llm = LLM("tiny-pallas", speculative_config=SPEC, **kw)
    ps = [[3, 4, 5, 6, 7, 8] * 2, [9, 10, 11] * 3, [12, 13, 14, 15, 16] * 2]
    sp = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    ref = reference(llm, ps, sp)
    assert [o.token_ids for o in run(llm.engine, ps, sp)] == [o.token_ids for o in ref]
    assert accepted(llm) > 0


def test_prompt_logprobs_beside_verification_rows(llm):
    """A prompt scored (``prompt_logprobs``) in steps that also hold other requests'
    verification rows gets the values the same engine gives without speculation: the
    scored tokens are found at their packed offsets behind the extra rows."""
    ps = prompts(8, seed=5) + [np.random.RandomState(6).randint(3, CFG.vocab_size, 56).tolist()]
    scored = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=3)  # chunked: its rest runs behind

    def go(engine):
        for i, p in enumerate(ps[:8]):
            engine.add_request(str(i), p, GREEDY)
        for _ in range(4):  # the first eight are decoding (and drafting) when the ninth arrives
            engine.step()
        engine.add_request("scored", ps[8], scored)
        return run_until_idle(engine)["scored"]

    accepted = llm.engine.snapshot().spec_num_accepted_tokens
    got = go(llm.engine)
    with engine_like(llm, speculative=None) as plain:
        want = go(plain)
    assert len(got.prompt_logprobs) == len(ps[8]) and got.prompt_logprobs[0] is None
    for g, w in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:]):
        assert list(g) == list(w)
        np.testing.assert_allclose([x.logprob for x in g.values()], [x.logprob for x in w.values()], atol=1e-5)
    assert llm.engine.snapshot().spec_num_accepted_tokens > accepted  # drafts really shared those steps
