"""Structured outputs and tool calls from the real SmolLM2-135M through the official ``openai``
client (in-process server, fp32 on CPU): every constrained answer parses and validates
(``jsonschema``), choices and regexes match, required and named tool calls parse and
validate, streamed tool-call deltas reassemble into the non-streamed call. No warm-up here
(it would compile every bucket); tests/test_structured_engine.py checks that constrained
steps compile nothing after warm-up."""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from api_helpers import LiveServer, REPO, running_app
from jaxinfer import LLM

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

M = "test-model"
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user", "guest"]},
    "pets": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
        "kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer", "minimum": 0, "maximum": 4}},
        "required": ["kind", "legs"], "additionalProperties": False}}},
    "required": ["name", "age", "role", "pets"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "maxLength": 20},
                                               "unit": {"enum": ["celsius", "fahrenheit"]}},
                                               "required": ["city", "unit"], "additionalProperties": False}}},
         {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
             "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
ASK = [{"role": "user", "content": "Describe a person as JSON."}]


@pytest.fixture(scope="module")
def client():
    llm = LLM(str(REPO / "weights" / "smollm2-135m-instruct"), dtype="float32", max_model_len=512, max_num_seqs=8,
              max_num_batched_tokens=128, num_blocks=260, use_tqdm=False, warmup=False)
    with running_app(llm.engine, served_model_name=M) as (app, _), LiveServer(app) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def chat(client, **kw):
    kw.setdefault("model", M)
    kw.setdefault("messages", ASK)
    return client.chat.completions.create(**kw)


def test_sampled_schema_outputs_all_validate(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda s: chat(client, response_format=fmt, temperature=1.0, seed=s, max_tokens=96),
                             range(50)))
    for r in outs:
        c = r.choices[0]
        assert c.finish_reason in ("stop", "length")
        if c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.message.content), SCHEMA)
    assert sum(r.choices[0].finish_reason == "stop" for r in outs) >= 45


def test_json_object_regex_choice(client):
    for s in range(4):
        r = chat(client, response_format={"type": "json_object"}, temperature=1.0, seed=s, max_tokens=64)
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(r.choices[0].message.content), dict)
    pattern = r"[A-Z][a-z]{2,8}, [0-9]{1,3}"
    for s in range(4):
        r = chat(client, temperature=1.0, seed=s, max_tokens=16, extra_body={"structured_outputs": {"regex": pattern}})
        assert re.fullmatch(pattern, r.choices[0].message.content)
    choices = ["Paris", "London", "Rome"]
    for s in range(4):
        r = client.completions.create(model=M, prompt="The capital of France is", temperature=1.0, seed=s,
                                      max_tokens=8, extra_body={"structured_outputs": {"choice": choices}})
        assert r.choices[0].text in choices


def _calls(message):
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]


def test_required_and_named_tool_calls(client):
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    r = chat(client, messages=msgs, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=96)
    assert r.choices[0].finish_reason == "tool_calls"
    for name, args in _calls(r.choices[0].message):
        jsonschema.validate(args, schemas[name])
    named = {"type": "function", "function": {"name": "add"}}
    r = chat(client, messages=msgs, tools=TOOLS, tool_choice=named, temperature=1.0, seed=1, max_tokens=64)
    assert r.choices[0].finish_reason == "tool_calls"
    ((name, args),) = _calls(r.choices[0].message)
    assert name == "add"
    jsonschema.validate(args, schemas["add"])
    # the call and its result round-trip through the template into a follow-up answer
    call = r.choices[0].message.tool_calls[0]
    follow = msgs + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    assert chat(client, messages=follow, tools=TOOLS, temperature=0, max_tokens=8).choices[0].finish_reason


def test_streamed_tool_call_reassembles(client):
    kw = dict(messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS, tool_choice="required",
              temperature=0, max_tokens=96)
    whole = chat(client, **kw).choices[0]
    calls: dict[int, dict] = {}
    finish = None
    for chunk in chat(client, stream=True, **kw):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                c = calls.setdefault(d.index, {"name": "", "arguments": ""})
                c["name"] += d.function.name or ""
                c["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == _calls(whole.message)
