"""Successful requests: response shapes, fan-out, stops, EOS, logprobs, prompts (SC-12/13/23/24/27).

Fake-runner engine (next token = last + 1, or a token forced by ``logit_bias >= 50``) with the
real SmolLM2 tokenizer: every expected text is ``tokenizer.decode`` of hand-computed ids.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from api_helpers import (EOS, EOS_B, MODEL, V, assert_error, expected_ids, fake_engine, model_config, running_app,
                         sse_json, tokenizer)
from jaxinfer.config import ModelConfig

C = 256


@pytest.fixture(scope="module")
def api():
    # EOS ids as the builder derives them: config.json says A, generation_config.json says [A, B] (SC-13)
    eos = ModelConfig.from_dict({**model_config().to_hf_dict(), "eos_token_id": EOS},
                                {"eos_token_id": [EOS, EOS_B]}).eos_token_ids
    assert tokenizer().eos_token_id == EOS and set(eos) == {EOS, EOS_B}
    engine = fake_engine(max_model_len=C, eos=eos)
    with running_app(engine) as (app, ae):
        yield SimpleNamespace(http=TestClient(app, raise_server_exceptions=False), engine=engine, tok=tokenizer())


def post(api, path, **body):
    r = api.http.post(path, json={"model": MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_completion_response_shape(api):
    ids = api.tok.encode("Hello")
    body = post(api, "/v1/completions", prompt="Hello", max_tokens=5)
    assert body["object"] == "text_completion" and body["model"] == MODEL and body["id"].startswith("cmpl-")
    assert isinstance(body["created"], int)
    assert body["choices"] == [{"index": 0, "text": api.tok.decode(expected_ids(ids, 5)), "logprobs": None,
                                "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 5, "total_tokens": len(ids) + 5,
                             "prompt_tokens_details": {"cached_tokens": 0}}


def test_chat_response_shape(api):
    msgs = [{"role": "user", "content": "hi"}]
    ids = api.tok.apply_chat_template(msgs)
    body = post(api, "/v1/chat/completions", messages=msgs, max_tokens=4)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant",
                                                        "content": api.tok.decode(expected_ids(ids, 4))},
                                "logprobs": None, "finish_reason": "length"}]
    assert body["usage"]["prompt_tokens"] == len(ids)


def test_cached_tokens_in_usage(api):
    ids = list(range(5000, 5040))  # 40 tokens: 2 full blocks can come from the prefix cache
    first = post(api, "/v1/completions", prompt=ids, max_tokens=2)
    again = post(api, "/v1/completions", prompt=ids, max_tokens=2)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    assert again["choices"][0]["text"] == first["choices"][0]["text"]


def test_n_and_prompt_lists_fan_out(api):
    body = post(api, "/v1/completions", prompt=["a", "b c"], n=2, max_tokens=3, seed=5)
    texts = [api.tok.decode(expected_ids(api.tok.encode(p), 3)) for p in ("a", "b c")]
    assert [(c["index"], c["text"]) for c in body["choices"]] == [(0, texts[0]), (1, texts[0]), (2, texts[1]),
                                                                  (3, texts[1])]
    prompt_tokens = len(api.tok.encode("a")) + len(api.tok.encode("b c"))
    assert body["usage"]["prompt_tokens"] == prompt_tokens  # once per prompt, not per choice
    assert body["usage"]["completion_tokens"] == 4 * 3
    chat = post(api, "/v1/chat/completions", messages=[{"role": "user", "content": "x"}], n=3, max_tokens=2)
    assert [c["index"] for c in chat["choices"]] == [0, 1, 2]


def test_stop_strings(api):
    ids = [1000]
    out = expected_ids(ids, 12)
    full = api.tok.decode(out)
    stop = api.tok.decode(out[5:7])
    cut = full[: full.index(stop)]
    body = post(api, "/v1/completions", prompt=ids, max_tokens=12, stop=stop)
    assert body["choices"][0]["text"] == cut and body["choices"][0]["finish_reason"] == "stop"
    body = post(api, "/v1/completions", prompt=ids, max_tokens=12, stop=[stop, "zzzz"], include_stop_str_in_output=True)
    assert body["choices"][0]["text"] == cut + stop
    body = post(api, "/v1/completions", prompt=ids, max_tokens=12, stop_token_ids=[out[3]])
    assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["completion_tokens"] == 4


# ----------------------------------------------------------------------------- SC-12


def test_sc12_length_when_max_tokens_hit(api):
    body = post(api, "/v1/completions", prompt="1, 2, 3,", max_tokens=5, temperature=0, ignore_eos=True)
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 5
    r = api.http.post("/v1/completions", json={"prompt": "1, 2, 3,", "max_tokens": 5, "temperature": 0,
                                               "ignore_eos": True, "stream": True})
    chunks = sse_json(r.content)
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finals == [chunks[-1]] and chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_sc12_forced_eos_is_stop_with_empty_text(api):
    body = post(api, "/v1/completions", prompt="Hello", max_tokens=5, logit_bias={str(EOS): 100})
    ch = body["choices"][0]
    assert (ch["finish_reason"], ch["text"], body["usage"]["completion_tokens"]) == ("stop", "", 1)


def test_sc12_context_end_is_length(api):
    body = post(api, "/v1/completions", prompt=list(range(1000, 1000 + C - 3)), ignore_eos=True)
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 3


# ----------------------------------------------------------------------------- SC-13


@pytest.mark.parametrize("eos", [EOS, EOS_B])
def test_sc13_every_eos_id_stops(api, eos):
    msgs = [{"role": "user", "content": "hi"}]
    body = post(api, "/v1/chat/completions", messages=msgs, max_tokens=20, logit_bias={str(eos): 100})
    ch = body["choices"][0]
    assert (ch["finish_reason"], ch["message"]["content"], body["usage"]["completion_tokens"]) == ("stop", "", 1)


def test_sc13_ignore_eos_and_special_tokens(api):
    msgs = [{"role": "user", "content": "hi"}]
    body = post(api, "/v1/chat/completions", messages=msgs, max_tokens=20, logit_bias={str(EOS_B): 100},
                ignore_eos=True)
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 20
    body = post(api, "/v1/chat/completions", messages=msgs, max_tokens=20, logit_bias={str(EOS_B): 100},
                skip_special_tokens=False)
    ch = body["choices"][0]
    assert ch["finish_reason"] == "stop" and ch["message"]["content"] == api.tok.decode([EOS_B],
                                                                                       skip_special_tokens=False)
    assert "<|endoftext|>" in ch["message"]["content"]


# ----------------------------------------------------------------------------- SC-27


def test_sc27_completion_logprobs(api):
    body = post(api, "/v1/completions", prompt="The sky is", max_tokens=4, temperature=0, logprobs=3)
    lp = body["choices"][0]["logprobs"]
    assert all(len(lp[k]) == 4 for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"))
    out = expected_ids(api.tok.encode("The sky is"), 4)
    assert lp["tokens"] == [api.tok.decode([t]) for t in out]
    for chosen, entry in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert len(entry) in (3, 4) and all(v <= 0 for v in entry.values())
        assert chosen == max(entry.values())  # the fake runner's sampled token is its top token
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    assert "".join(lp["tokens"]) == body["choices"][0]["text"]
    assert_error(api.http.post("/v1/completions", json={"prompt": "x", "logprobs": 21}), 400, "logprobs")


def test_sc27_chat_logprobs(api):
    msgs = [{"role": "user", "content": "hi"}]
    body = post(api, "/v1/chat/completions", messages=msgs, max_tokens=4, logprobs=True)
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"] == 4
    for item in content:
        assert set(item) == {"token", "logprob", "bytes", "top_logprobs"} and item["top_logprobs"] == []
        assert bytes(item["bytes"]).decode() == item["token"]
    body = post(api, "/v1/chat/completions", messages=msgs, max_tokens=4, logprobs=True, top_logprobs=5)
    for item in body["choices"][0]["logprobs"]["content"]:
        values = [t["logprob"] for t in item["top_logprobs"]]
        assert len(values) == 5 and values == sorted(values, reverse=True) and item["logprob"] == values[0]
    for bad in ({"top_logprobs": 5}, {"logprobs": True, "top_logprobs": 21}, {"logprobs": 3}):
        r = api.http.post("/v1/chat/completions", json={"messages": msgs, **bad})
        assert_error(r, 400, "top_logprobs" if "top_logprobs" in bad else "logprobs")


def test_sc27_chat_stream_logprobs_per_chunk(api):
    msgs = [{"role": "user", "content": "hi"}]
    r = api.http.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 6, "logprobs": True,
                                                    "top_logprobs": 2, "stream": True,
                                                    "stream_options": {"include_usage": True}})
    chunks = sse_json(r.content)
    total = 0
    for c in chunks[1:-1]:
        ch = c["choices"][0]
        items = ch["logprobs"]["content"]
        assert "".join(i["token"] for i in items) == ch["delta"]["content"]  # exactly its own tokens
        assert all(len(i["top_logprobs"]) == 2 for i in items)
        total += len(items)
    assert total == chunks[-1]["usage"]["completion_tokens"] == 6


def test_byte_level_token_bytes(api):
    # ids 130.. are single UTF-8 continuation bytes: their text is U+FFFD but `bytes` is exact
    body = post(api, "/v1/chat/completions", messages=[{"role": "user", "content": "x"}], max_tokens=1,
                logprobs=True, logit_bias={"140": 100})
    item = body["choices"][0]["logprobs"]["content"][0]
    assert len(item["bytes"]) == 1 and item["bytes"][0] >= 0x80


# ----------------------------------------------------------------------------- SC-23 / SC-24 (prompt ids)


def tokenize(api, **body):
    r = api.http.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_sc23_prompt_ids_smollm(api):
    msgs = [{"role": "user", "content": "hi"}]
    chat_ids = tokenize(api, messages=msgs)
    assert chat_ids == api.tok.encode(api.tok.render_chat(msgs), add_special_tokens=False)
    assert post(api, "/v1/chat/completions", messages=msgs, max_tokens=1)["usage"]["prompt_tokens"] == len(chat_ids)
    assert tokenize(api, prompt="hi") == api.tok.encode("hi")
    for ids in ([1, 300, 301], [300, 301]):  # verbatim: no BOS added, none removed
        assert tokenize(api, prompt=ids) == ids
        assert post(api, "/v1/completions", prompt=ids, max_tokens=1)["usage"]["prompt_tokens"] == len(ids)


def test_sc23_exactly_one_bos(tmp_path):
    from test_tokenizer import BOS_TEMPLATE, make_tiny_tokenizer

    from jaxinfer.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(make_tiny_tokenizer(tmp_path, True, BOS_TEMPLATE))
    bos = tok.bos_token_id
    with running_app(fake_engine(tok=tok, vocab=tok.vocab_size, eos=(tok.eos_token_id,))) as (app, _):
        http = TestClient(app, raise_server_exceptions=False)
        ids = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()["tokens"]
        assert ids[0] == bos and ids.count(bos) == 1
        r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        assert r.json()["usage"]["prompt_tokens"] == len(ids)
        text_ids = http.post("/tokenize", json={"prompt": "hi"}).json()["tokens"]
        assert text_ids[0] == bos and text_ids.count(bos) == 1
        x, y = text_ids[1:3] if len(text_ids) > 2 else (text_ids[1], text_ids[1])
        for prompt in ([bos, x, y], [x, y]):
            r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
            assert r.json()["usage"]["prompt_tokens"] == len(prompt)


def test_sc24_generation_prompt_and_system(api):
    ids = tokenize(api, messages=[{"role": "system", "content": "Answer with the word ZEBRA."},
                                  {"role": "user", "content": "Hi"}])
    text = api.tok.decode(ids, skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n")
    assert text.count("ZEBRA") == 1 and text.index("ZEBRA") < text.index("<|im_start|>user")
    ids = tokenize(api, messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure, the"}],
                   continue_final_message=True)
    text = api.tok.decode(ids, skip_special_tokens=False)
    assert text.endswith("Sure, the") and text.count("<|im_start|>assistant") == 1
    r = api.http.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}], "prompt": "x"})
    assert_error(r, 400, "prompt")


@pytest.mark.parametrize("template", [
    "{% for m in messages %}{% if m['role'] != 'system' %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}{% if add_generation_prompt %}<|assistant|>"
    "{% endif %}",
])
def test_sc24_system_merged_when_template_has_no_system_role(tmp_path, template, caplog):
    from test_tokenizer import make_tiny_tokenizer

    from jaxinfer.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(make_tiny_tokenizer(tmp_path, False, template))
    with caplog.at_level(logging.WARNING), running_app(
            fake_engine(tok=tok, vocab=tok.vocab_size, eos=(tok.eos_token_id,))) as (app, _):
        http = TestClient(app, raise_server_exceptions=False)
        r = http.post("/tokenize", json={"messages": [{"role": "system", "content": "the lazy dog"},
                                                      {"role": "user", "content": "hello"}]})
        text = tok.decode(r.json()["tokens"], skip_special_tokens=False)
        assert "the lazy dog" in text and text.index("the lazy dog") < text.index("hello")  # never dropped
    assert any("no system role" in rec.message for rec in caplog.records)


def test_sc24_startup_warning_for_template_without_generation_prompt(tmp_path, caplog):
    from test_tokenizer import NO_GEN_PROMPT_TEMPLATE, make_tiny_tokenizer

    from jaxinfer.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(make_tiny_tokenizer(tmp_path, False, NO_GEN_PROMPT_TEMPLATE))
    with caplog.at_level(logging.WARNING), running_app(
            fake_engine(tok=tok, vocab=tok.vocab_size, eos=(tok.eos_token_id,))):
        pass
    assert any("add_generation_prompt" in rec.message for rec in caplog.records)


def test_detokenize_roundtrip(api):
    text = "Hello, world! 東京"
    ids = tokenize(api, prompt=text)
    assert api.http.post("/detokenize", json={"tokens": ids}).json()["prompt"] == text
    assert_error(api.http.post("/detokenize", json={"tokens": [V]}), 400, "tokens")


def test_tokenize_refuses_ids_generation_would_refuse(api):
    for bad in ([V], [-1], [5, V + 7]):
        assert_error(api.http.post("/tokenize", json={"prompt": bad}), 400, "prompt")
        assert_error(api.http.post("/v1/completions", json={"prompt": bad, "max_tokens": 1}), 400, "prompt")
    assert tokenize(api, prompt=[V - 1]) == [V - 1]
