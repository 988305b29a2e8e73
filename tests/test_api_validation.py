"""Every malformed request is a 4xx in OpenAI's envelope, before any engine work (SC-01/02/03/05/06/07).

Fake-runner engine (next token = last + 1) behind the real app, in process. Expected
outputs are computed by hand; "engine alive" = health 200 + the reference request's text
unchanged + KV blocks back to their idle value (F0).
"""
from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from api_helpers import (MODEL, REFERENCE, V, assert_alive, assert_error, expected_ids, fake_engine,
                         fake_reference_text, metric, running_app, tokenizer)
from jaxinfer.entrypoints.openai import prompts

C = 256  # max_model_len


@pytest.fixture(scope="module")
def api():
    engine = fake_engine(max_model_len=C, num_blocks=257)
    with running_app(engine) as (app, ae):
        http = TestClient(app, raise_server_exceptions=False)
        ref = fake_reference_text()
        assert http.post("/v1/completions", json=REFERENCE).json()["choices"][0]["text"] == ref
        yield SimpleNamespace(http=http, engine=engine, ref=ref, f0=metric(http, "jaxinfer_kv_blocks_free"))


def completion(api, **body):
    return api.http.post("/v1/completions", json={"model": MODEL, **body})


def chat(api, **body):
    return api.http.post("/v1/chat/completions", json={"model": MODEL, **body})


# ----------------------------------------------------------------------------- SC-01


@pytest.mark.parametrize("prompt", ["", [""], [], [[]], [[1, 2], []], ["a", ""]])
def test_sc01_empty_prompts_are_400(api, prompt):
    steps = api.engine.runner.steps
    assert_error(completion(api, prompt=prompt, max_tokens=8), 400, "prompt", "invalid_request_error")
    assert api.engine.runner.steps == steps  # no device work


def test_sc01_chat_empty_messages_and_empty_content(api, caplog):
    assert_error(chat(api, messages=[]), 400, "messages")
    r = chat(api, messages=[{"role": "user", "content": ""}], max_tokens=8)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 8
    assert_alive(api.http, api.ref, api.f0)
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING]  # no traceback


# ----------------------------------------------------------------------------- SC-02


def test_sc02_max_tokens_matrix(api):
    P = len(tokenizer().encode("Hello"))
    ok = lambda **kw: completion(api, prompt="Hello", temperature=0, **kw)  # noqa: E731
    for body in ({}, {"max_tokens": None}):  # omitted and null: the default (16), never 500
        r = ok(**body)
        assert r.status_code == 200, r.text
        u, ch = r.json()["usage"], r.json()["choices"][0]
        assert u["completion_tokens"] == 16 <= C - P and ch["finish_reason"] == "length"
    for bad in (0, -1, "10", 1.5, True, [1]):
        assert_error(ok(max_tokens=bad), 400, "max_tokens")
    r = ok(max_tokens=0, echo=True, logprobs=1)  # scores the prompt, generates nothing (tests/test_api_echo.py)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 0, r.text
    r = ok(max_tokens=1)
    assert r.json()["usage"]["completion_tokens"] == 1 and r.json()["choices"][0]["finish_reason"] == "length"
    r = ok(max_tokens=C - P)  # exact fit
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == C - P
    for too_many in (C - P + 1, 1_000_000_000):
        err = assert_error(ok(max_tokens=too_many), 400, "max_tokens")
        assert str(too_many) in err["message"] and str(C) in err["message"]  # names both limits
    assert_alive(api.http, api.ref, api.f0)


def test_sc02_chat_max_completion_tokens(api):
    msgs = [{"role": "user", "content": "hi"}]
    r = chat(api, messages=msgs, max_completion_tokens=3, max_tokens=7)  # the new name wins
    assert r.json()["usage"]["completion_tokens"] == 3
    assert_error(chat(api, messages=msgs, max_completion_tokens=0), 400, "max_completion_tokens")
    assert_error(chat(api, messages=msgs, max_completion_tokens=10 * C), 400, "max_completion_tokens")
    assert_error(chat(api, messages=msgs, max_tokens=10 * C), 400, "max_tokens")
    r = chat(api, messages=msgs)  # no limit: up to the context
    n_prompt = r.json()["usage"]["prompt_tokens"]
    assert r.json()["usage"]["completion_tokens"] == C - n_prompt


# ----------------------------------------------------------------------------- SC-03


def test_sc03_overlong_prompts_are_400_before_prefill(api):
    prefill = metric(api.http, "jaxinfer_prefill_tokens_total")
    ids = list(range(100, 100 + C + 1))
    t0 = time.monotonic()
    err = assert_error(completion(api, prompt=ids, max_tokens=1), 400, "prompt")
    assert str(C + 1) in err["message"] and str(C - 1) in err["message"]
    r = completion(api, prompt=ids, max_tokens=1, stream=True)
    assert_error(r, 400, "prompt")  # a status, not a 200 stream holding an error
    assert "text/event-stream" not in r.headers["content-type"]
    long_text = "hello world " * (3 * C)
    assert len(tokenizer().encode(long_text)) > 2 * C
    assert_error(completion(api, prompt=long_text, max_tokens=1), 400, "prompt")
    assert_error(chat(api, messages=[{"role": "user", "content": long_text}], max_tokens=1), 400, "messages")
    assert time.monotonic() - t0 < 4 * 1.0
    assert metric(api.http, "jaxinfer_prefill_tokens_total") == prefill
    r = completion(api, prompt=ids[: C - 1], max_tokens=1)  # boundary: C - 1 ids + 1 token fits
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == C - 1
    assert_alive(api.http, api.ref, api.f0)


def test_too_long_prompts_say_context_length_exceeded(api):
    """OpenAI's code for a request past the context, and the way out named, on both endpoints."""
    ids = list(range(100, 100 + C))  # C ids: no room for one token
    long_text = "hello world " * (3 * C)
    for r, param in ((completion(api, prompt=ids, max_tokens=1), "prompt"),
                     (completion(api, prompt=ids[:10], max_tokens=C), "max_tokens"),
                     (chat(api, messages=[{"role": "user", "content": long_text}]), "messages"),
                     (chat(api, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=C),
                      "max_completion_tokens")):
        err = assert_error(r, 400, param, "invalid_request_error")
        assert err["code"] == "context_length_exceeded" and "truncate_prompt_tokens" in err["message"], err
    assert completion(api, prompt=ids, max_tokens=1, truncate_prompt_tokens=C - 1).status_code == 200  # the remedy
    assert_error(completion(api, prompt=ids, max_tokens="x"), 400, "max_tokens")["code"] != "context_length_exceeded"


def test_sc03_truncate_prompt_tokens_keeps_the_last_k(api):
    ids = list(range(1000, 1000 + C + 500))
    K = C - 16
    r = completion(api, prompt=ids, truncate_prompt_tokens=K, max_tokens=16)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == K
    assert r.json()["choices"][0]["text"] == tokenizer().decode(expected_ids(ids, 16))
    assert_error(completion(api, prompt=ids, truncate_prompt_tokens=C, max_tokens=1), 400, "truncate_prompt_tokens")
    assert_error(completion(api, prompt=ids, truncate_prompt_tokens=0), 400, "truncate_prompt_tokens")


def test_truncate_keeps_exactly_the_last_tokens():
    p = prompts.Prompt(list(range(10)), "text")
    kept = prompts.truncate(p, keep=4, max_model_len=100, max_tokens=1, truncate_left=False)
    assert (kept.token_ids, kept.num_truncated, kept.text) == ([6, 7, 8, 9], 6, None)
    left = prompts.truncate(p, keep=None, max_model_len=8, max_tokens=3, truncate_left=True)
    assert left.token_ids == [5, 6, 7, 8, 9]  # room for max_tokens: 8 - 3
    assert prompts.truncate(p, keep=None, max_model_len=8, max_tokens=3, truncate_left=False) is p
    assert prompts.truncate(p, keep=20, max_model_len=100, max_tokens=1, truncate_left=False) is p


def test_sc03_server_flag_truncate_left():
    with running_app(fake_engine(max_model_len=C), truncate_prompt="left") as (app, _):
        http = TestClient(app, raise_server_exceptions=False)
        ids = list(range(1000, 1000 + C + 500))
        r = http.post("/v1/completions", json={"prompt": ids, "max_tokens": 16})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == C - 16
        r = http.post("/v1/completions", json={"prompt": ids, "max_tokens": C})
        assert_error(r, 400, "prompt")  # no room left: not truncated, still a 400


# ----------------------------------------------------------------------------- SC-05 / SC-06


@pytest.mark.parametrize("top_k", [-1, 0, 1, V + 1, 9999999])
def test_sc05_top_k_accepted(api, top_k):
    r = completion(api, prompt="Hello", temperature=1.0, seed=7, max_tokens=8, top_k=top_k)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == tokenizer().decode(expected_ids(tokenizer().encode("Hello"), 8))


@pytest.mark.parametrize("top_k", [-2, 2.5, "5", [3]])
def test_sc05_top_k_rejected(api, top_k):
    assert_error(completion(api, prompt="Hello", temperature=1.0, seed=7, max_tokens=8, top_k=top_k), 400, "top_k")


@pytest.mark.parametrize("field,value,status", [
    ("top_p", 0, 400), ("top_p", 1.0000001, 400), ("top_p", 2, 400), ("top_p", -0.5, 400), ("top_p", 1e-9, 200),
    ("top_p", 1.0, 200), ("top_p", float("nan"), 400), ("temperature", 0, 200), ("temperature", 1e-6, 200),
    ("temperature", -0.1, 400), ("temperature", 2.0, 200), ("temperature", 2.01, 400), ("temperature", "1", 400),
    ("min_p", 1.5, 400), ("presence_penalty", 2.5, 400), ("frequency_penalty", -3, 400),
    ("repetition_penalty", 0, 400), ("seed", 2**64, 400), ("n", 0, 400), ("stop", [""], 400), ("stop", 5, 400),
    ("repetition_penalty", 1e-300, 400), ("repetition_penalty", 0.009, 400), ("repetition_penalty", 0.01, 200),
    ("stop", [f"s{i}" for i in range(65)], 400), ("stop", [f"s{i}" for i in range(64)], 200),
    ("stop", ["x" * 16385], 400), ("stop_token_ids", list(range(1025)), 400),
    ("priority", -3, 200), ("priority", 10, 200), ("priority", None, 200), ("priority", 1.5, 400),
    ("priority", "1", 400), ("priority", True, 400), ("priority", 2**63, 400),
])
def test_sc06_sampling_ranges(api, field, value, status):
    body = {"prompt": "Hello", "max_tokens": 8, "seed": 1, field: value}
    if value != value:  # NaN is not JSON: send it raw
        r = api.http.post("/v1/completions", content=f'{{"prompt": "Hello", "{field}": NaN}}',
                          headers={"content-type": "application/json"})
    else:
        r = completion(api, **body)
    if status == 200:
        assert r.status_code == 200, r.text
    else:
        assert_error(r, status, field)


# ----------------------------------------------------------------------------- SC-07


def test_sc07_token_id_prompts(api):
    r = completion(api, prompt=[1, 2, 3], max_tokens=4)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 3  # no BOS added
    assert r.json()["choices"][0]["text"] == tokenizer().decode(expected_ids([1, 2, 3], 4))
    r = completion(api, prompt=[[1, 2, 3], [4, 5]], max_tokens=4)
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert [c["text"] for c in choices] == [tokenizer().decode(expected_ids(p, 4)) for p in ([1, 2, 3], [4, 5])]
    assert r.json()["usage"]["prompt_tokens"] == 5


@pytest.mark.parametrize("body,param", [
    ({"prompt": [-1]}, "prompt"), ({"prompt": [V]}, "prompt"), ({"prompt": [1099511627776]}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt"), ({"prompt": [1.5]}, "prompt"), ({"prompt": [[1, V]]}, "prompt"),
    ({"prompt": [True]}, "prompt"), ({"prompt": None}, "prompt"), ({"prompt": {"a": 1}}, "prompt"),
    ({"prompt": "x", "stop_token_ids": [V]}, "stop_token_ids"),
    ({"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
    ({"prompt": "x", "logit_bias": {str(V): 5}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"-3": 5}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"abc": 5}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": "1"}}, "logit_bias"),
])
def test_sc07_bad_ids_rejected_before_device_work(api, body, param):
    steps = api.engine.runner.steps
    assert_error(completion(api, max_tokens=4, **body), 400, param)
    assert api.engine.runner.steps == steps


def test_sc07_engine_alive_after_bad_ids(api):
    assert_alive(api.http, api.ref, api.f0)


# ----------------------------------------------------------------------------- the envelope itself


@pytest.mark.parametrize("content,param", [
    (b"{not json", None), (b"[1, 2]", None), (b"", None), (b'"a string"', None),
    (b'{"prompt": "x", "stream": "yes"}', "stream"), (b'{"prompt": "x", "n": 1.0}', "n"),
    (b'{"prompt": "x", "stream_options": {"include_usage": 1}}', "stream_options"),
    (b'{"prompt": "x", "user": 5}', "user"), (b'{"max_tokens": 5}', "prompt"),
])
def test_malformed_bodies_are_400_envelopes(api, content, param):
    r = api.http.post("/v1/completions", content=content, headers={"content-type": "application/json"})
    err = assert_error(r, 400, type_="invalid_request_error")
    assert err["param"] == param


@pytest.mark.parametrize("path,body", [("/v1/completions", {"prompt": "x"}),
                                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})])
def test_stream_options_without_stream_is_400(api, path, body):
    """As OpenAI and vLLM: ``stream_options`` only with ``stream: true`` (it was silently ignored)."""
    body = {"model": MODEL, "max_tokens": 2, **body, "stream_options": {"include_usage": True}}
    for stream in (None, False):
        sent = body if stream is None else {**body, "stream": stream}
        assert_error(api.http.post(path, json=sent), 400, "stream_options")
    assert api.http.post(path, json={**body, "stream": True}).status_code == 200


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", None])
def test_a_body_not_sent_as_json_names_the_content_type(api, content_type):
    """``curl -d '{...}'`` without ``-H 'Content-Type: application/json'`` sends a form: the 400
    says what to send, with the Content-Type it got; a JSON request never gets that hint."""
    body = b'{"model": "%s", "prompt": "x", "max_tokens": 1}' % MODEL.encode()
    headers = {"content-type": content_type} if content_type else {}
    err = assert_error(api.http.post("/v1/completions", content=body, headers=headers), 400,
                       type_="invalid_request_error")
    assert "Content-Type: application/json" in err["message"] and repr(content_type or "missing") in err["message"]
    ok = api.http.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert "Content-Type" not in assert_error(ok, 400, type_="invalid_request_error")["message"]


@pytest.mark.parametrize("messages", [
    [{"role": "robot", "content": "hi"}], [{"content": "hi"}], [{"role": "user", "content": 5}],
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "hi", [None],
])
def test_bad_messages_are_400(api, messages):
    assert_error(chat(api, messages=messages), 400, "messages")


def test_unsupported_and_unknown_fields(api):
    assert_error(completion(api, prompt="x", suffix="y"), 400, "suffix")
    assert_error(completion(api, prompt="x", best_of=3), 400, "best_of")
    r = completion(api, prompt="x", max_tokens=2, some_future_field={"a": 1}, best_of=1)  # extras are ignored
    assert r.status_code == 200
    assert_error(chat(api, messages=[{"role": "user", "content": "x"}], top_logprobs=2), 400, "top_logprobs")
    assert_error(chat(api, messages=[{"role": "user", "content": "x"}], continue_final_message=True), 400,
                 "messages")


def test_unknown_model_and_route(api):
    err = assert_error(completion(api, prompt="x", model="gpt-4"), 404, "model")
    assert err["code"] == "model_not_found"
    assert_error(api.http.get("/v1/nothing"), 404)
    assert_error(api.http.get("/v1/completions"), 405)


def test_models_endpoint(api):
    data = api.http.get("/v1/models").json()
    assert data["object"] == "list" and [m["id"] for m in data["data"]] == [MODEL]
    assert data["data"][0]["max_model_len"] == C


def test_api_key():
    with running_app(fake_engine(), api_key="s3cret") as (app, _):
        http = TestClient(app, raise_server_exceptions=False)
        body = {"prompt": "x", "max_tokens": 1}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = http.post("/v1/completions", json=body, headers=headers)
            assert_error(r, 401)
            assert r.headers["www-authenticate"] == "Bearer"
        assert_error(http.get("/v1/models"), 401)
        assert_error(http.post("/tokenize", json={"prompt": "x"}), 401)
        assert http.post("/v1/completions", json=body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        for path in ("/live", "/health", "/metrics"):  # orchestrators need no key
            assert http.get(path).status_code == 200


def test_openapi_documents_the_api(api):
    spec = api.http.get("/openapi.json").json()
    paths = spec["paths"]
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize", "/health",
                 "/live", "/metrics"):
        assert path in paths, path
    post = paths["/v1/completions"]["post"]
    assert {"400", "429", "503", "504"} <= set(post["responses"])
    props = spec["components"]["schemas"]["CompletionRequest"]["properties"]
    assert props["max_tokens"]["anyOf"][0]["minimum"] == 0  # 0 only with echo (a 400 otherwise, SC-02)
    assert "top_k" in props and "request_timeout" in props


def test_more_sequences_than_the_queue_is_400_not_429(api):
    """prompts x n above --max-queue-len can never be queued at once: 400 (not a 429 to retry forever)."""
    qlen = api.engine.config.scheduler.max_queue_len
    r = completion(api, prompt=["hi"] * 5, n=qlen // 4, max_tokens=1)
    assert_error(r, 400, "n")
    assert completion(api, prompt=["hi"] * 4, n=qlen // 4, max_tokens=1).status_code == 200
    assert_alive(api.http, api.ref, api.f0)


def test_unset_max_tokens_fits_a_pool_smaller_than_the_context():
    """A pool smaller than max_model_len: a chat without max_tokens generates up to what the
    pool holds instead of failing on a max_tokens the client never sent."""
    engine = fake_engine(max_model_len=2048, num_blocks=64)  # 63 blocks = 1008 tokens < 2048
    with running_app(engine) as (app, ae):
        http = TestClient(app, raise_server_exceptions=False)
        r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                    "ignore_eos": True})
        assert r.status_code == 200, r.text
        u = r.json()["usage"]
        assert u["prompt_tokens"] + u["completion_tokens"] == 63 * 16


def test_model_retrieve(api):
    r = api.http.get(f"/v1/models/{MODEL}")
    assert r.status_code == 200 and r.json()["id"] == MODEL and r.json()["object"] == "model"
    assert_error(api.http.get("/v1/models/other"), 404, "model")


# ----------------------------------------------------------------------------- hostile input found by probing


def post_raw(api, path, text):
    """POST a JSON text as is (``\\ud800`` stays an escape that decodes to a lone surrogate)."""
    return api.http.post(path, content=text.encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", '{"prompt": "x\\ud800", "max_tokens": 2}', "prompt"),
    ("/v1/completions", '{"prompt": ["ok", "x\\ud800"], "max_tokens": 2, "stream": true}', "prompt"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x\\ud800"}], "max_tokens": 2}', "messages"),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}], "max_tokens": 2}', "messages"),
    ("/tokenize", '{"prompt": "x\\ud800"}', "prompt"),
    ("/tokenize", '{"messages": [{"role": "user", "content": "x\\ud800"}]}', "messages"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": [{"type": '
     '"function", "function": {"name": "f", "description": "\\ud800", "parameters": {"type": "object"}}}]}', "tools"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": [{"type": '
     '"function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"\\udc00": {}}}}}]}',
     "tools"),
])
def test_lone_surrogates_are_400(api, path, body, param):
    assert_error(post_raw(api, path, body), 400, param)
    assert api.http.post("/tokenize", json={"prompt": "ok"}).status_code == 200  # connection still usable
    assert_alive(api.http, api.ref, api.f0)


@pytest.mark.parametrize("key", [" 5", "+5", "1_0", "\u0663", "-1", "5.0"])
def test_logit_bias_keys_are_plain_digits(api, key):
    assert_error(completion(api, prompt="Hello", max_tokens=1, logit_bias={key: 1.0}), 400, "logit_bias")


def test_seed_at_the_top_of_the_range_works_with_n(api):
    r = completion(api, prompt="Hello", max_tokens=2, seed=2**64 - 1, n=2, temperature=1.0)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 2


def test_prompts_are_tokenized_off_the_event_loop(api, monkeypatch):
    import asyncio

    on_loop = []

    def spy(fn):
        def wrapped(*args, **kw):
            try:
                asyncio.get_running_loop()
                on_loop.append(True)
            except RuntimeError:
                on_loop.append(False)
            return fn(*args, **kw)
        return wrapped

    tok = api.engine.tokenizer
    monkeypatch.setattr(tok, "encode", spy(tok.encode))  # completions, /tokenize
    monkeypatch.setattr(tok, "encode_with_offsets", spy(tok.encode_with_offsets))  # chat
    assert completion(api, prompt="Hello", max_tokens=1).status_code == 200
    assert chat(api, messages=[{"role": "user", "content": "hi"}], max_tokens=1).status_code == 200
    assert api.http.post("/tokenize", json={"prompt": "Hello"}).status_code == 200
    assert on_loop == [False, False, False]


def test_request_bodies_over_the_limit_are_413_before_parsing():
    with running_app(fake_engine(max_model_len=C), max_request_bytes=2000) as (app, _):
        http = TestClient(app, raise_server_exceptions=False)
        big = {"prompt": "a" * 3000, "max_tokens": 1}
        err = assert_error(http.post("/v1/completions", json=big), 413, type_="invalid_request_error")
        assert err["code"] == "request_too_large"

        def chunks():  # no Content-Length: counted while it arrives
            yield b'{"prompt": "'
            for _ in range(10):
                yield b"a" * 500
            yield b'", "max_tokens": 1}'

        assert_error(http.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"}),
                     413)
        r = http.post("/v1/completions", json={"prompt": "a" * 1000, "max_tokens": 1})
        assert r.status_code == 200, r.text
