"""The offline `LLM` API under misuse, on a tiny random model: clear errors before any
work, and the same object keeps working (same greedy output, no leaked blocks)."""
from __future__ import annotations

import pytest

from helpers import tiny_config
from jaxinfer import LLM, SamplingParams
from jaxinfer.errors import RequestError
from jaxinfer.models.params import init_params

CFG = tiny_config(vocab=256, tied=False)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPT = [5, 17, 99, 3]


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32, num_blocks=48,
               model_config=CFG, params=init_params(CFG, scale=5.0, seed=1), tokenizer=None, warmup=False)


@pytest.fixture(scope="module")
def reference(llm):
    return llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def assert_usable(llm, reference):
    assert llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids == reference
    e = llm.engine
    assert e.num_free_blocks == e.num_total_blocks and not e.requests


def test_interrupted_generate_leaves_the_llm_usable(llm, reference, monkeypatch):
    """Ctrl+C inside generate (a KeyboardInterrupt from a step) aborts that call's requests."""
    real_step, calls = llm.engine.step, [0]

    def interrupting_step():
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(llm.engine, "step", interrupting_step)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([PROMPT] * 6, SamplingParams(max_tokens=50, ignore_eos=True), use_tqdm=False)
    monkeypatch.undo()
    assert llm.engine.num_free_blocks == llm.engine.num_total_blocks  # freed at once
    assert_usable(llm, reference)


def test_too_long_prompt_is_context_length_exceeded(llm, reference):
    """The offline path raises the same typed error the HTTP API maps to its 400."""
    for prompt, sp, param in (([5] * 128, GREEDY, "prompt"), ([5] * 100, SamplingParams(max_tokens=29), "max_tokens")):
        with pytest.raises(RequestError) as exc:
            llm.generate([prompt], sp, use_tqdm=False)
        assert (exc.value.code, exc.value.param) == ("context_length_exceeded", param)
        assert "truncate_prompt_tokens" in exc.value.message
    assert_usable(llm, reference)


@pytest.mark.parametrize("params", [[GREEDY, GREEDY], [], [GREEDY] * 4])
def test_sampling_params_list_must_match_prompts(llm, reference, params):
    with pytest.raises(ValueError, match="SamplingParams for 3 prompts"):
        llm.generate([PROMPT] * 3, params, use_tqdm=False)
    assert_usable(llm, reference)


@pytest.mark.parametrize("prompts", [b"hello", 5, None, [1.0, 2.0], [[1, 2], [True]], [[1, "a"]]])
def test_malformed_prompts_are_type_errors(llm, reference, prompts):
    with pytest.raises(TypeError):
        llm.generate(prompts, GREEDY, use_tqdm=False)
    assert_usable(llm, reference)


@pytest.mark.parametrize("kwargs,param", [
    (dict(ignore_eos="no"), "ignore_eos"), (dict(skip_special_tokens="false"), "skip_special_tokens"),
    (dict(n=True), "n"), (dict(logprobs=True), "logprobs"), (dict(seed=True), "seed"),
    (dict(stop=5), "stop"), (dict(stop_token_ids="abc"), "stop_token_ids"), (dict(stop_token_ids=[1.5]), "stop_token_ids"),
    (dict(logit_bias=[1, 2]), "logit_bias"), (dict(logit_bias={"abc": 1}), "logit_bias"),
])
def test_sampling_params_name_the_bad_field(kwargs, param):
    with pytest.raises(RequestError) as exc:
        SamplingParams(**kwargs)
    assert exc.value.param == param


def test_sampling_params_still_take_the_convenient_forms():
    sp = SamplingParams(stop="x", stop_token_ids=[3, 4], logit_bias={"7": 1.5, 8: -2})
    assert sp.stop == ("x",) and sp.stop_token_ids == (3, 4) and sp.logit_bias == ((7, 1.5), (8, -2.0))
    np = pytest.importorskip("numpy")
    sp = SamplingParams(max_tokens=np.int64(3), top_k=np.int32(5), seed=np.uint64(7), stop_token_ids=[np.int64(2)])
    assert (sp.max_tokens, sp.top_k, sp.seed, sp.stop_token_ids) == (3, 5, 7, (2,))
    assert all(type(v) is int for v in (sp.max_tokens, sp.top_k, sp.seed, *sp.stop_token_ids))


def test_numpy_token_ids_and_bad_argument_types(llm, reference):
    import numpy as np

    out = llm.generate([[np.int64(t) for t in PROMPT]], GREEDY, use_tqdm=False)
    assert out[0].outputs[0].token_ids == reference and all(type(t) is int for t in out[0].prompt_token_ids)
    with pytest.raises(TypeError, match="sampling_params must be SamplingParams"):
        llm.generate([PROMPT], "temperature=0", use_tqdm=False)
    with pytest.raises(TypeError, match="priority must be a list"):
        llm.generate([PROMPT], GREEDY, use_tqdm=False, priority=1)
    assert_usable(llm, reference)


@pytest.mark.parametrize("kwargs", [dict(dtype="float16"), dict(attention_backend="foo"), dict(load_format="bogus"),
                                    dict(max_queue_len=0), dict(max_num_seqs=8, max_num_batched_tokens=4),
                                    dict(kv_cache_memory=0), dict(kv_cache_memory=1024), dict(max_model_len=1000),
                                    dict(max_model_len="128"), dict(max_num_seqs=2.0), dict(seed=-1)])
def test_constructor_refuses_settings_that_cannot_work(kwargs):
    args = dict(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32, model_config=CFG,
                params=init_params(CFG, seed=1), tokenizer=None, warmup=False)
    args.update(kwargs)
    if "load_format" in kwargs:
        args = {k: v for k, v in args.items() if k not in ("model_config", "params", "tokenizer")}
    with pytest.raises(ValueError):
        LLM("tiny", **args)  # CFG's context is 512: max_model_len 1000 is past it


def test_chat_messages_are_checked_before_the_template(tmp_path):
    from test_tokenizer import BOS_TEMPLATE, make_tiny_tokenizer

    from jaxinfer.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(make_tiny_tokenizer(tmp_path, True, BOS_TEMPLATE))
    llm = LLM("tiny", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32, num_blocks=48, warmup=False,
              model_config=tiny_config(vocab=tok.vocab_size), params=init_params(tiny_config(vocab=tok.vocab_size)),
              tokenizer=tok)
    user = {"role": "user", "content": "hi"}
    for bad in ([], [{"content": "hi"}], [{"role": "robot", "content": "hi"}],
                [{"role": "user", "content": [{"type": "image_url"}]}], [{"role": "user", "content": 5}],
                [{"role": "user", "content": 0}], user, None, [{"role": ["user"], "content": "hi"}],
                *([user, {"role": "assistant", "content": None, "tool_calls": calls}]
                  for calls in ("abc", [{"id": "x"}], [{"function": None}],
                                [{"function": {"name": "f", "arguments": {"a": 1}}}]))):
        with pytest.raises(RequestError) as exc:
            llm.chat(bad, GREEDY, use_tqdm=False)
        assert exc.value.param == "messages", bad
    with pytest.raises(RequestError) as exc:
        llm.generate("bad \ud800 x", GREEDY, use_tqdm=False)  # a lone surrogate, as from JSON's escape
    assert exc.value.param == "prompt"
    parts = llm.chat([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], GREEDY, use_tqdm=False)
    plain = llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False)
    assert parts[0].prompt_token_ids == plain[0].prompt_token_ids
    assert llm.engine.num_free_blocks == llm.engine.num_total_blocks
