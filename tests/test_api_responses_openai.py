"""``/v1/responses`` through the official ``openai`` client, unchanged, against a tiny random
Llama with SmolLM2's tokenizer (so grammars constrain real token strings): plain text, JSON
following a schema (``text.format``), a function tool round trip through
``function_call_output``, ``previous_response_id`` across three turns (each turn's answer
equals the chat completion of the same conversation: one path), ``responses.input_items.list``
(paged by the client), and ``responses.stream``
(every event parses; the final response equals the non-streamed one, greedy)."""
from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pydantic
import pytest

from api_helpers import LiveServer, metric, running_app, tokenizer
from helpers import tiny_config
from jaxinfer import LLM
from jaxinfer.models.params import init_params

M = "tiny"
CFG = tiny_config(vocab=49152, hidden=32, layers=1, heads=2, kv_heads=1, inter=32)
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Berlin", "Madrid"]}},
                         "required": ["city"], "additionalProperties": False}}]
class Pick(pydantic.BaseModel):
    color: Literal["red", "green", "blue"]
    size: Literal["S", "M", "L"]


GREEDY = {"model": M, "temperature": 0, "max_output_tokens": 8}


@pytest.fixture(scope="module")
def server():
    llm = LLM("tiny", max_model_len=512, max_num_seqs=4, max_num_batched_tokens=64, num_blocks=96,
              model_config=CFG, params=init_params(CFG, scale=2.0, seed=3), tokenizer=tokenizer(), use_tqdm=False,
              warmup=False)
    with running_app(llm.engine, served_model_name=M) as (app, _), LiveServer(app) as live:
        live.client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        yield live


def _plain(items) -> list[dict]:
    """Output items without their ids (they differ between two runs of the same answer)."""
    out = []
    for item in items:
        d = item.model_dump(exclude_none=True)
        d.pop("id", None)
        d.pop("call_id", None)
        out.append(d)
    return out


def test_plain_create(server):
    r = server.client.responses.create(input="Say hello.", instructions="Answer in one line.", **GREEDY)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == M
    assert [o.type for o in r.output] == ["message"] and r.output[0].content[0].type == "output_text"
    assert r.output_text == r.output[0].content[0].text
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":  # a random model rarely ends on its own
        assert r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 8
    else:
        assert r.status == "completed" and r.usage.output_tokens < 8
    chat = server.client.chat.completions.create(model=M, temperature=0, max_tokens=8, messages=[
        {"role": "system", "content": "Answer in one line."}, {"role": "user", "content": "Say hello."}])
    assert chat.choices[0].message.content == r.output_text  # the chat path, the same answer
    assert chat.usage.prompt_tokens == r.usage.input_tokens


def test_json_schema_text_format(server):
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": SCHEMA, "strict": True}}
    r = server.client.responses.create(model=M, input="A person as JSON.", text=fmt, temperature=0,
                                       max_output_tokens=80)
    assert r.status == "completed", r.output_text
    jsonschema.validate(json.loads(r.output_text), SCHEMA)
    assert r.text.format.type == "json_schema"
    parsed = server.client.responses.parse(model=M, input="Pick one.", text_format=Pick, temperature=0,
                                           max_output_tokens=40)  # the SDK's pydantic helper
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Pick)
    r = server.client.responses.create(model=M, input="JSON please.", text={"format": {"type": "json_object"}},
                                       temperature=1.0, max_output_tokens=80, extra_body={"seed": 1})
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict)


def test_function_tool_round_trip(server):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    r = server.client.responses.create(input=ask, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                       **GREEDY | {"max_output_tokens": 40})  # one call: bounded, completes
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and r.status == "completed"
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.status == "completed"
    assert json.loads(call.arguments)["city"] in ("Paris", "Berlin", "Madrid")
    follow = ask + [o.model_dump(exclude_none=True) for o in r.output] + [
        {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"}]
    r2 = server.client.responses.create(input=follow, tools=TOOLS, **GREEDY)
    assert r2.output and r2.usage.input_tokens > r.usage.input_tokens
    chat = server.client.chat.completions.create(model=M, temperature=0, max_tokens=8, tools=[
        {"type": "function", "function": {k: v for k, v in TOOLS[0].items() if k != "type"}}], messages=ask + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": c.call_id, "type": "function", "function": {
            "name": c.name, "arguments": c.arguments}} for c in calls]}] + [
        {"role": "tool", "tool_call_id": call.call_id, "content": "21 C, sunny"}])
    assert chat.usage.prompt_tokens == r2.usage.input_tokens  # the call and its result reached the prompt


def test_previous_response_id_three_turns(server):
    c = server.client
    r1 = c.responses.create(input="My name is Ada.", instructions="Answer briefly.", **GREEDY)
    r2 = c.responses.create(input="What is my name?", previous_response_id=r1.id, **GREEDY)
    r3 = c.responses.create(input="Spell it.", previous_response_id=r2.id, **GREEDY)
    assert r3.previous_response_id == r2.id
    messages = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": r1.output_text},
                {"role": "user", "content": "What is my name?"}, {"role": "assistant", "content": r2.output_text},
                {"role": "user", "content": "Spell it."}]  # instructions are not carried over (OpenAI's rule)
    chat = c.chat.completions.create(model=M, temperature=0, max_tokens=8, messages=messages)
    assert chat.usage.prompt_tokens == r3.usage.input_tokens
    assert chat.choices[0].message.content == r3.output_text
    assert c.responses.retrieve(r2.id).output_text == r2.output_text
    c.responses.delete(r1.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r1.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(input="again", previous_response_id=r1.id, **GREEDY)
    r4 = c.responses.create(input="And now?", previous_response_id=r3.id, store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r4.id)


def test_input_items_list_pages_through_the_conversation(server):
    c = server.client
    r1 = c.responses.create(input="My name is Ada.", **GREEDY)
    r2 = c.responses.create(input=[{"role": "user", "content": [{"type": "input_text", "text": "Spell it."}]}],
                            previous_response_id=r1.id, **GREEDY)
    page = c.responses.input_items.list(r2.id, order="asc", limit=2)
    assert len(page.data) == 2 and page.has_more and page.last_id == page.data[-1].id
    items = list(page)  # the client follows ``after=last_id`` to the next page
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant"), ("message", "user")]
    assert items[1].id == r1.output[0].id and items[1].content[0].text == r1.output_text
    assert items[2].content[0].type == "input_text" and items[2].content[0].text == "Spell it."
    assert [i.id for i in c.responses.input_items.list(r2.id)] == [i.id for i in items][::-1]  # desc by default
    with pytest.raises(openai.BadRequestError):
        c.responses.input_items.list(r2.id, include=["message.input_image.image_url"])
    c.responses.delete(r2.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.input_items.list(r2.id)


@pytest.mark.parametrize("extra", [{}, {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False,
                                    "max_output_tokens": 40}])
def test_stream_events_parse_and_final_equals_create(server, extra):
    body = {"input": "Weather in Berlin?", **GREEDY, **extra}
    whole = server.client.responses.create(**body)
    with server.client.responses.stream(**body) as stream:
        events = list(stream)
        final = stream.get_final_response() if whole.status == "completed" else None
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == ("response.completed" if whole.status == "completed" else "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response
    assert _plain(done.output) == _plain(whole.output)
    assert (done.usage.input_tokens, done.usage.output_tokens) == (whole.usage.input_tokens, whole.usage.output_tokens)
    assert done.status == whole.status
    if final is not None:
        assert _plain(final.output) == _plain(whole.output)
    if "tools" in extra:
        assert "response.function_call_arguments.done" in types and final is not None  # one call: completes
    else:
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas == whole.output_text
    assert server.client.responses.retrieve(done.id).output_text == whole.output_text  # streamed ones are stored


def test_unsupported_fields_are_400s_naming_them(server):
    c = server.client
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(input="hi", tools=[{"type": "web_search"}], **GREEDY)
    assert e.value.body["param"] == "tools" and "web_search" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(input="hi", background=True, **GREEDY)
    assert e.value.body["param"] == "background"


def test_no_kv_blocks_leak(server):
    import httpx

    with httpx.Client(base_url=server.url) as http:
        assert metric(http, "jaxinfer_num_requests_running") == 0
        assert metric(http, "jaxinfer_kv_blocks_free") == metric(http, "jaxinfer_kv_blocks_total")
