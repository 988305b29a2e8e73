"""Chat with the real Gemma 3 270M tokenizer: the pretrained base model has no chat template,
so chat is a 400 naming ``--chat-template`` while completions work; with the bundled gemma3
template the reference's chat prompts (tests/data/gemma3/, rendered by transformers) give
exactly its prompt ids, and ``<end_of_turn>`` stops a chat. The engine runs on the fake
runner (tests/fakes.py): only the tokenizer and the model's stop ids are real."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from api_helpers import MODEL, assert_error, fake_engine, running_app
from jaxinfer.engine.builder import apply_chat_template
from jaxinfer.tokenizer.chat import render_conversation
from jaxinfer.config import ModelConfig
from jaxinfer.tokenizer.tokenizer import Tokenizer

pytestmark = pytest.mark.real_model
V = 262144  # Gemma 3's vocabulary


def chat_refs(oracle) -> list[dict]:
    refs = [r for r in oracle["prompts"] if r["kind"] == "chat"]
    assert refs
    return refs


@pytest.fixture(scope="module")
def bare(gemma3_dir) -> Tokenizer:
    """The converted model's tokenizer (no chat template). Loading its 262K vocabulary takes
    seconds: loaded once here, and templated copies share it."""
    return Tokenizer.from_dir(gemma3_dir)


@pytest.fixture(scope="module")
def end_of_turn(gemma3_dir, bare) -> int:
    """``<end_of_turn>``'s id, which the converted model lists as a stop id."""
    ids = bare.encode("<end_of_turn>", add_special_tokens=False)
    assert len(ids) == 1 and ids[0] in ModelConfig.from_dir(gemma3_dir).eos_token_ids
    return ids[0]


@pytest.fixture(scope="module")
def api(gemma3_dir, bare):
    """Two apps on the Gemma tokenizer and stop ids: ``bare`` as converted, ``templated`` with
    ``--chat-template gemma3``."""
    eos = ModelConfig.from_dir(gemma3_dir).eos_token_ids
    templated = apply_chat_template(bare, "gemma3")
    with running_app(fake_engine(tok=bare, vocab=V, eos=eos)) as (a, _), \
            running_app(fake_engine(tok=templated, vocab=V, eos=eos)) as (b, _):
        yield SimpleNamespace(bare=TestClient(a, raise_server_exceptions=False),
                              templated=TestClient(b, raise_server_exceptions=False))


def test_reference_chat_prompts_render_to_its_ids(bare, gemma3_oracle):
    tok = apply_chat_template(bare, "gemma3")
    for ref in chat_refs(gemma3_oracle):
        text, ids = render_conversation(ref["messages"], tok)
        assert text == ref["prompt_text"], ref["index"]
        assert ids == ref["prompt_ids"], ref["index"]


def test_base_model_has_no_template_and_chat_is_400(api):
    err = assert_error(api.bare.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}]}), 400, "messages", "invalid_request_error")
    assert "--chat-template" in err["message"]
    r = api.bare.post("/v1/completions", json={"model": MODEL, "prompt": "The capital of France is", "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3


def test_templated_chat_uses_reference_ids_and_stops_at_end_of_turn(api, gemma3_oracle, end_of_turn):
    ref = chat_refs(gemma3_oracle)[0]
    body = {"model": MODEL, "messages": ref["messages"], "max_tokens": 5}
    r = api.templated.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == ref["n_prompt_tokens"]
    assert r.json()["choices"][0]["finish_reason"] == "length"  # the fake runner never says end_of_turn itself
    r = api.templated.post("/v1/chat/completions", json={**body, "logit_bias": {str(end_of_turn): 100}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]  # the fake runner emits a token biased by >= 50: end_of_turn first
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == ""
    assert r.json()["usage"]["completion_tokens"] == 1
