"""``/v1/completions`` with ``echo`` (and ``logprobs``): the prompt, with its tokens'
logprobs, before the completion, in OpenAI's legacy shape; and lm-evaluation-harness's
``local-completions`` loglikelihood requests, sent in the exact shape the harness sends them.

The shape tests run on the fake runner (tests/fakes.py: after token t its top alternatives
are t + 1, t + 2, ... with logprobs -0.5, -1.5, ...). The harness test runs a tiny random
Llama (with the real SmolLM2 tokenizer) and checks what the harness would parse out of the
answer (sum of the continuation's logprobs, is_greedy) against transformers' float32
forward over the same weights.
"""
from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from api_helpers import MODEL, V, assert_error, fake_engine, running_app, tokenizer
from helpers import hf_logits, hf_model, tiny_config


@pytest.fixture(scope="module")
def http():
    with running_app(fake_engine(max_model_len=128)) as (app, _):
        yield TestClient(app, raise_server_exceptions=False)


def completion(http, **body):
    return http.post("/v1/completions", json={"model": MODEL, "temperature": 0, **body})


def assert_offsets(lp: dict, text: str) -> None:
    """Offsets count the token texts from 0, and the tokens spell the returned text."""
    assert lp["text_offset"] == list(np.cumsum([0] + [len(t) for t in lp["tokens"]])[:-1])
    assert "".join(lp["tokens"]) == text


def test_echo_with_logprobs_puts_the_prompt_first(http):
    prompt = [1000, 1001, 1003, 1004]
    r = completion(http, prompt=prompt, max_tokens=3, logprobs=2, echo=True)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    tok = tokenizer()
    ids = prompt + [1005, 1006, 1007]  # the fake model continues with last + 1
    assert lp["tokens"] == [tok.decode([t], skip_special_tokens=False) for t in ids]
    assert choice["text"] == tok.decode(prompt, skip_special_tokens=False) + tok.decode(ids[4:])
    assert_offsets(lp, choice["text"])
    # position 0 has no logprobs; then 1001 after 1000 is the top choice, 1003 after 1001 the 2nd, ...
    assert lp["token_logprobs"] == [None, -0.5, -1.5, -0.5, -0.5, -0.5, -0.5]
    assert lp["top_logprobs"][0] is None
    assert lp["top_logprobs"][2] == {lp["tokens"][2]: -1.5, tok.decode([1002]): -0.5}
    assert all(len(d) == 2 for d in lp["top_logprobs"][1:])
    assert r.json()["usage"]["completion_tokens"] == 3 and r.json()["usage"]["prompt_tokens"] == 4


def test_echo_with_max_tokens_0_returns_only_the_prompt(http):
    r = completion(http, prompt=["The capital of France", "Hello"], max_tokens=0, logprobs=0, echo=True, n=2)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["text"] for c in body["choices"]] == ["The capital of France"] * 2 + ["Hello"] * 2
    for c in body["choices"]:
        n = len(tokenizer().encode(c["text"]))
        assert len(c["logprobs"]["tokens"]) == n and c["finish_reason"] == "length"
        assert all(len(d) == 1 for d in c["logprobs"]["top_logprobs"][1:])  # logprobs 0: the token alone
        assert_offsets(c["logprobs"], c["text"])
    assert body["usage"]["completion_tokens"] == 0


def test_echo_without_logprobs_is_text_only(http):
    c = completion(http, prompt="Hello", max_tokens=2, echo=True).json()["choices"][0]
    assert c["logprobs"] is None and c["text"].startswith("Hello") and len(c["text"]) > len("Hello")


@pytest.mark.parametrize("body, param", [
    ({"max_tokens": 0}, "max_tokens"),  # 0 only with echo
    ({"max_tokens": 0, "echo": True, "stream": True}, "echo"),
    ({"max_tokens": 1, "echo": True, "logprobs": 21}, "logprobs"),  # the server's max_logprobs is 20
])
def test_refused(http, body, param):
    assert_error(completion(http, prompt="Hello", **body), 400, param)


# ----------------------------------------------------------------------- lm-evaluation-harness


def harness_request(context: list[int], continuation: list[int], legacy: bool) -> dict:
    """The body ``local-completions`` posts for one loglikelihood request (token-id prompts, batch
    size 1): lm-eval 0.4.3+ (``max_tokens: 1, logprobs: 1``) or 0.4.0-0.4.2 (``max_tokens: 0, logprobs: 5``)."""
    if legacy:
        return {"model": MODEL, "prompt": [context + continuation], "echo": True, "max_tokens": 0, "temperature": 0.0,
                "logprobs": 5, "seed": 1234}
    return {"model": MODEL, "prompt": [context + continuation], "temperature": 0, "max_tokens": 1, "logprobs": 1,
            "seed": 1234, "echo": True}


def harness_parse(choice: dict, ctxlen: int, legacy: bool) -> tuple[float, bool]:
    """What the harness reads from a choice: (sum of the continuation's logprobs, is_greedy).
    0.4.3+ drops the last entry (the generated token) and calls a token greedy when its
    logprob equals the best of its top_logprobs."""
    lps = choice["logprobs"]["token_logprobs"][ctxlen:None if legacy else -1]
    tops = choice["logprobs"]["top_logprobs"][ctxlen:None if legacy else -1]
    return sum(lps), all(lp == max(top.values()) for lp, top in zip(lps, tops))


@pytest.fixture(scope="module")
def tiny_server():
    from jaxinfer import LLM
    from jaxinfer.models.params import init_params

    cfg = tiny_config(vocab=V, hidden=32, heads=2, kv_heads=1, inter=64)
    params = init_params(cfg, scale=3.0, seed=5)
    # no warm-up: compiles only the few buckets used (a full warm-up at SmolLM2's vocabulary takes minutes)
    llm = LLM("tiny", max_model_len=64, max_num_seqs=4, max_num_batched_tokens=32, num_blocks=32, model_config=cfg,
              params=params, tokenizer=tokenizer(), use_tqdm=False, warmup=False)
    with running_app(llm.engine) as (app, _):
        yield TestClient(app, raise_server_exceptions=False), hf_model(cfg, params)


@pytest.mark.parametrize("legacy", [False, True])
def test_lm_eval_loglikelihood_request(tiny_server, legacy):
    http, model = tiny_server
    rng = np.random.RandomState(7)
    context = rng.randint(3, V, 40).tolist()  # 40 + continuation: the prompt spans two prefill chunks
    logits = hf_logits(model, context).astype(np.float64)
    greedy = [int(np.argmax(logits[-1]))]
    for continuation in (rng.randint(3, V, 6).tolist(), greedy):
        ids = context + continuation
        lp = hf_logits(model, ids).astype(np.float64)
        lp = lp - lp.max(-1, keepdims=True)
        lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
        want = sum(lp[p - 1, ids[p]] for p in range(len(context), len(ids)))
        want_greedy = all(np.argmax(lp[p - 1]) == ids[p] for p in range(len(context), len(ids)))
        r = http.post("/v1/completions", json=harness_request(context, continuation, legacy))
        assert r.status_code == 200, r.text
        got, is_greedy = harness_parse(r.json()["choices"][0], len(context), legacy)
        np.testing.assert_allclose(got, want, rtol=1e-4)
        assert is_greedy == want_greedy
    assert want_greedy  # the last continuation was the greedy token


def test_text_offsets_count_characters_not_token_pieces():
    """A token holding part of a character (byte-level BPE splits an emoji) adds no character:
    each offset is the length of the text the tokens before it complete, never past the text,
    and a stream's chunks (one `TextOffsets` carried across them) give the same offsets."""
    from jaxinfer.entrypoints.openai import logprobs as lp
    from jaxinfer.outputs import Logprob

    tok = tokenizer()
    ids = tok.encode("Emoji list: 😀😃😄 done", add_special_tokens=False)
    entries = [{t: Logprob(-0.1, 1, tok.decode([t]))} for t in ids]
    text = tok.decode(ids)
    expected = [len(tok.decode(ids[:i]).rstrip("\ufffd")) for i in range(len(ids))]
    assert any(t == "\ufffd" for t in (tok.decode([i]) for i in ids))  # the case at hand: split characters
    whole = lp.completion_logprobs(ids, entries, tokenizer=tok)
    assert whole.text_offset == expected and max(expected) < len(text)
    offsets, streamed = lp.TextOffsets(), []
    for a, b in [(0, 3), (3, 4), (4, 9), (9, len(ids))]:
        streamed += lp.completion_logprobs(ids[a:b], entries[a:b], offsets, tok).text_offset
    assert streamed == expected
