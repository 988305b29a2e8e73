"""The runner's greedy fast path (`jaxinfer.runner.model_runner.greedy_only`): an all-greedy step
with nothing applied before the argmax takes its ids from the model step and runs no
sampler; the ids (and logits) are those of the sampler path, and any step that needs the
sampler still gets it. Tiny random model, a few short requests."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers import tiny_config
from jaxinfer import LLM, SamplingParams
from jaxinfer.runner import batch as B
from jaxinfer.runner.buckets import Bucket
from jaxinfer.runner.model_runner import greedy_only
from jaxinfer.models.params import init_params

CFG = tiny_config(vocab=256, tied=True)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32, num_blocks=64,
               model_config=CFG, params=init_params(CFG, scale=5.0, seed=3), tokenizer=None, warmup=False,
               return_logits=True, enable_prefix_caching=False)  # both runs compute the same steps


def _sampling(**fields):
    layout = B.BatchLayout(B.BucketLadders(32, 4, 8), 16, CFG.vocab_size, 128, 4)
    s = B.empty_inputs(Bucket(4, 4, 4), layout, penalties=False, mask=False).sampling
    return dataclasses.replace(s, **{k: np.asarray(v) for k, v in fields.items()})


def test_greedy_only_needs_every_sampler_stage_off():
    V = CFG.vocab_size
    assert greedy_only(_sampling(), V)
    assert not greedy_only(_sampling(any_sampled=True), V)
    assert not greedy_only(_sampling(any_logprobs=True), V)
    assert not greedy_only(_sampling(bias_ids=np.array([[V] * 4, [5, V, V, V], [V] * 4, [V] * 4])), V)
    layout = B.BatchLayout(B.BucketLadders(32, 4, 8), 16, V, 128, 4)
    full = B.empty_inputs(Bucket(4, 4, 4), layout).sampling  # penalty history and bitmask present
    assert not greedy_only(full, V)
    assert not greedy_only(dataclasses.replace(full, hist_ids=None, num_prompt=None, num_hist=None), V)


def _generate(llm, fast: bool, params: list[SamplingParams]):
    runner = llm.engine.runner
    runner.greedy_fast_path = fast
    calls = []
    samplers = dict(runner._samplers)
    runner._samplers = {k: (lambda f: lambda *a: calls.append(1) or f(*a))(f) for k, f in samplers.items()}
    try:
        prompts = [list(range(3 + i, 40 + 7 * i)) for i in range(len(params))]
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        runner._samplers = samplers | {k: f for k, f in runner._samplers.items() if k not in samplers}
        runner.greedy_fast_path = True
    return [o.outputs[0] for o in outs], len(calls)


def test_fast_path_gives_the_sampler_paths_tokens_and_logits(llm):
    greedy = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)] * 3
    fast, fast_calls = _generate(llm, True, greedy)
    slow, slow_calls = _generate(llm, False, greedy)
    assert fast_calls == 0 and slow_calls > 0
    for a, b in zip(fast, slow):
        assert a.token_ids == b.token_ids
        np.testing.assert_array_equal(np.asarray(a.logits), np.asarray(b.logits))


def test_a_step_that_needs_the_sampler_runs_it(llm):
    """A greedy row beside a row with a logit bias, logprobs or temperature: the sampler runs
    and the outputs equal those without the fast path."""
    mixed = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
             SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logit_bias={7: 100.0}),
             SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2),
             SamplingParams(temperature=0.9, seed=1, max_tokens=8, ignore_eos=True)]
    fast, fast_calls = _generate(llm, True, mixed)
    slow, _ = _generate(llm, False, mixed)
    assert fast_calls > 0
    assert [o.token_ids for o in fast] == [o.token_ids for o in slow]
    assert set(fast[1].token_ids) == {7}
    assert len(fast[2].logprobs) == 8 and fast[2].logprobs == slow[2].logprobs
