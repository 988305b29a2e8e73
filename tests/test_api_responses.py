"""``/v1/responses`` over HTTP with the fake runner (next token = last + 1): input items map
onto chat messages, what the server does not implement is a 400 naming it, unknown and
evicted ids are 404s, the store's limits hold through the API, the event stream's framing
and order, a deadline or a disconnect mid-stream frees every KV block, and the stream writer
holds back tool-call text so its deltas equal the final message."""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient

from api_helpers import LiveServer, MODEL, assert_error, fake_engine, metric, running_app, tokenizer, wait_until
from jaxinfer.entrypoints.openai import prompts
from jaxinfer.entrypoints.openai import responses_input as I
from jaxinfer.entrypoints.openai import responses_output as O
from jaxinfer.entrypoints.openai import responses_stream as S
from jaxinfer.entrypoints.openai.protocol import ChatCompletionRequest
from jaxinfer.entrypoints.openai.responses_protocol import ResponsesRequest
from jaxinfer.outputs import CompletionOutput, RequestOutput

C = 256
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def api():
    with running_app(fake_engine(max_model_len=C, step_delay=0.002), responses_store_max_entries=3) as (app, ae):
        with LiveServer(app) as live:
            yield SimpleNamespace(http=TestClient(app, raise_server_exceptions=False), url=live.url, ae=ae)


def create(api, **body):
    return api.http.post("/v1/responses", json={"model": MODEL, "max_output_tokens": 4, "input": "hi", **body})


def idle(api) -> bool:
    return (metric(api.http, "jaxinfer_num_requests_running") == 0
            and metric(api.http, "jaxinfer_kv_blocks_free") == metric(api.http, "jaxinfer_kv_blocks_total"))


def test_input_items_map_onto_chat_messages():
    items = I.normalize_items([
        {"role": "user", "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{\"x\": 1}", "id": "fc_a"},
        {"type": "function_call", "call_id": "call_b", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_a", "output": "1"},
        {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "2"}]}])
    assert I.to_messages(items, "Answer in one line.") == [
        {"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": "Weather ?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
            {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "1"},
        {"role": "tool", "tool_call_id": "call_b", "content": "2"}]
    assert I.to_messages(I.normalize_items("hi"), None) == [{"role": "user", "content": "hi"}]


def test_prompt_is_the_chat_prompt_of_the_mapped_conversation(api):
    r = create(api, instructions="Answer in one line.", input=[{"role": "user", "content": "Weather?"}], tools=[TOOL])
    assert r.status_code == 200, r.text
    msgs = [{"role": "system", "content": "Answer in one line."}, {"role": "user", "content": "Weather?"}]
    tools = [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}]
    expected = prompts.chat_prompt(ChatCompletionRequest(messages=msgs, tools=tools), tokenizer())
    assert r.json()["usage"]["input_tokens"] == len(expected.token_ids)


@pytest.mark.parametrize("extra, param", [
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"no_such_field": 1}, "no_such_field"),
    ({"tools": [{"type": "web_search_preview"}]}, "tools"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools"),
    ({"tools": [{"type": "function", "name": "bad name"}]}, "tools"),
    ({"tool_choice": {"type": "web_search_preview"}, "tools": [TOOL]}, "tool_choice"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [TOOL]}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"content": "no role"}]}, "input"),
    ({"text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "text"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "no-such"}}}}, "text"),
    ({"text": {"verbosity": "low"}}, "text"),
    ({"truncation": "auto"}, "truncation"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"max_output_tokens": 10_000}, "max_output_tokens"),
    ({"input": "x" * 2000}, "input"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
])
def test_unsupported_or_malformed_is_400_naming_the_field(api, extra, param):
    err = assert_error(create(api, **extra), 400, param)
    if param in ("background", "conversation", "no_such_field"):
        assert param in err["message"]


def test_no_op_values_of_unimplemented_fields_are_accepted(api):
    r = create(api, background=False, service_tier="auto", include=[], truncation="disabled", reasoning={},
               prompt_cache_key="k", conversation=None, stream_options=None, parallel_tool_calls=False)
    assert r.status_code == 200, r.text
    assert r.json()["parallel_tool_calls"] is False


def test_retrieving_with_stream_is_a_400(api):
    rid = create(api).json()["id"]
    assert_error(api.http.get(f"/v1/responses/{rid}?stream=true"), 400, "stream")
    assert_error(api.http.get(f"/v1/responses/{rid}?stream=maybe"), 400, "stream")  # a query param is named
    assert api.http.get(f"/v1/responses/{rid}?stream=false").json()["id"] == rid


def test_unknown_ids_are_404s_in_the_error_shape(api):
    assert_error(api.http.get("/v1/responses/resp_nope"), 404)
    assert_error(api.http.delete("/v1/responses/resp_nope"), 404)
    err = assert_error(create(api, previous_response_id="resp_nope"), 404, "previous_response_id")
    assert err["code"] == "response_not_found"


def test_store_limit_evicts_through_the_api(api):
    ids = [create(api, input=f"turn {i}").json()["id"] for i in range(4)]  # the fixture keeps 3
    assert_error(api.http.get(f"/v1/responses/{ids[0]}"), 404)
    assert_error(create(api, previous_response_id=ids[0]), 404, "previous_response_id")
    got = api.http.get(f"/v1/responses/{ids[3]}")
    assert got.status_code == 200 and got.json()["id"] == ids[3] and got.json()["store"] is True
    assert api.http.delete(f"/v1/responses/{ids[3]}").json() == {"id": ids[3], "object": "response",
                                                                 "deleted": True}
    assert_error(api.http.get(f"/v1/responses/{ids[3]}"), 404)
    assert metric(api.http, "jaxinfer_responses_stored") <= 3
    assert metric(api.http, "jaxinfer_responses_store_evictions_total") >= 1
    assert metric(api.http, "jaxinfer_responses_store_bytes") > 0


def test_store_false_and_echoed_fields(api):
    r = create(api, store=False, metadata={"k": "v"}, user="u1", temperature=0, top_p=0.5,
               text={"format": {"type": "json_object"}}).json()
    assert (r["store"], r["metadata"], r["user"], r["temperature"], r["top_p"]) == (False, {"k": "v"}, "u1", 0, 0.5)
    assert r["text"] == {"format": {"type": "json_object"}}
    assert_error(api.http.get(f"/v1/responses/{r['id']}"), 404)


def test_previous_response_id_prepends_the_stored_conversation(api):
    r1 = create(api, input="first", instructions="Answer in one line.").json()
    r2 = create(api, input="second", previous_response_id=r1["id"]).json()
    answer = r1["output"][0]["content"][0]["text"]
    msgs = [{"role": "user", "content": "first"}, {"role": "assistant", "content": answer},
            {"role": "user", "content": "second"}]  # instructions are not carried over
    prompt = prompts.chat_prompt(ChatCompletionRequest(messages=msgs), tokenizer())
    assert r2["usage"]["input_tokens"] == len(prompt.token_ids)
    assert r2["previous_response_id"] == r1["id"]


def test_store_off_refuses_an_explicit_store():
    with running_app(fake_engine(max_model_len=C), responses_store_max_entries=0) as (app, _):
        http = TestClient(app, raise_server_exceptions=False)
        body = {"model": MODEL, "input": "hi", "max_output_tokens": 2}
        assert_error(http.post("/v1/responses", json={**body, "store": True}), 400, "store")
        r = http.post("/v1/responses", json=body).json()
        assert r["store"] is False
        assert_error(http.get(f"/v1/responses/{r['id']}"), 404)


def _events(raw: str) -> list[tuple[str, dict]]:
    assert raw.endswith("\n\n") and "[DONE]" not in raw
    out = []
    for block in raw[:-2].split("\n\n"):
        event, data = block.split("\n")
        assert event.startswith("event: ") and data.startswith("data: ")
        out.append((event[len("event: "):], json.loads(data[len("data: "):])))
    return out


def test_stream_framing_and_order(api):
    whole = create(api, input="stream me", max_output_tokens=6, temperature=0).json()
    r = create(api, input="stream me", max_output_tokens=6, temperature=0, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert all(name == data["type"] for name, data in events)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    names = [n for n, _ in events]
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert set(names[4:-4]) == {"response.output_text.delta"}
    text = whole["output"][0]["content"][0]["text"]
    assert "".join(d["delta"] for n, d in events if n == "response.output_text.delta") == text
    final = events[-1][1]["response"]
    assert final["output"][0]["content"] == whole["output"][0]["content"] and final["usage"]["output_tokens"] == 6
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}


def test_deadline_mid_stream_sends_error_then_failed(api):
    body = {"model": MODEL, "input": "slow", "max_output_tokens": 200, "stream": True, "request_timeout": 0.2}
    with httpx.Client(timeout=30) as c:
        r = c.post(api.url + "/v1/responses", json=body)
    assert r.status_code == 200
    events = _events(r.text)
    assert [n for n, _ in events[-2:]] == ["error", "response.failed"]
    assert events[-2][1]["code"] == "request_timeout" and events[-1][1]["response"]["status"] == "failed"
    assert wait_until(lambda: idle(api), 5)


def test_disconnect_mid_stream_frees_every_block(api):
    aborted = metric(api.http, "jaxinfer_requests_aborted_total")
    body = {"model": MODEL, "input": "long", "max_output_tokens": 200, "stream": True}
    with httpx.Client(timeout=10) as c, c.stream("POST", api.url + "/v1/responses", json=body) as r:
        for line in r.iter_lines():
            if "response.output_text.delta" in line:
                break
    assert wait_until(lambda: idle(api), 5)
    assert metric(api.http, "jaxinfer_requests_aborted_total") == aborted + 1


def _outputs(texts, finish="stop"):
    return [RequestOutput("r", None, [1], [CompletionOutput(0, t, list(range(i + 1)),
                                                            finish if i == len(texts) - 1 else None)],
                          i == len(texts) - 1) for i, t in enumerate(texts)]


@pytest.mark.parametrize("answer", [
    '  Let me check. \n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
    '"arguments": {"city": "Rome"}}\n</tool_call>',
    "  Just text, <tool_ish> but no call.  ",
    "<tool_call>not json</tool_call> after",
])
def test_stream_writer_deltas_equal_the_final_message(answer):
    req = ResponsesRequest(input="x", tools=[TOOL])
    stored = []
    fmt = O.ResponsesFormat(req, "m", splitter=O.Splitter(parse_tools=True), store=True, on_done=stored.append)
    writer = S._Writer(fmt, None)
    events = writer.start()
    outs = _outputs([answer[:k] for k in range(1, len(answer) + 1)])
    for out in outs[:-1]:
        events += writer.progress(out.outputs[0].text)
    events += writer.finish(outs[-1], 5)
    parsed = [json.loads(e.split("\n")[1][len("data: "):]) for e in events]
    final = parsed[-1]["response"]
    expected = O.output_items(fmt.split(outs[-1]), O.ItemIds(), "completed")
    strip = lambda items: [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in items]  # noqa: E731
    assert strip(final["output"]) == strip(expected) and stored == [final]
    deltas = "".join(p["delta"] for p in parsed if p["type"] == "response.output_text.delta")
    messages = [i for i in final["output"] if i["type"] == "message"]
    assert deltas == (messages[0]["content"][0]["text"] if messages else "")
    assert "<tool_call" not in deltas or "tool_call>not json" in answer
    added = [p["output_index"] for p in parsed if p["type"] == "response.output_item.added"]
    assert added == list(range(len(final["output"])))


def test_a_response_larger_than_the_byte_budget_says_it_was_not_stored():
    with running_app(fake_engine(max_model_len=C), responses_store_max_bytes=1500) as (app, _):
        http = TestClient(app, raise_server_exceptions=False)
        r = http.post("/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2}).json()
        assert r["store"] is False
        assert_error(http.get(f"/v1/responses/{r['id']}"), 404)


def test_input_items_list_the_conversation_as_a_cursor_page(api):
    r1 = create(api, input=[{"role": "user", "content": "first"}]).json()
    r2 = create(api, input="second", previous_response_id=r1["id"]).json()
    url = f"/v1/responses/{r2['id']}/input_items"
    page = api.http.get(url, params={"order": "asc"}).json()
    assert page["object"] == "list" and page["has_more"] is False
    items = page["data"]  # the chain's input, its output, then this input; oldest first
    assert [(i["type"], i["role"]) for i in items] == [("message", "user"), ("message", "assistant"),
                                                       ("message", "user")]
    assert items[0]["content"] == [{"type": "input_text", "text": "first"}]
    assert items[1]["id"] == r1["output"][0]["id"] and items[1]["content"][0]["type"] == "output_text"
    assert items[2]["content"][0]["text"] == "second" and items[2]["id"].startswith("msg_")
    assert (page["first_id"], page["last_id"]) == (items[0]["id"], items[2]["id"])
    assert api.http.get(url).json()["data"] == items[::-1]  # desc by default
    assert api.http.get(f"/v1/responses/{r1['id']}/input_items").json()["data"] == items[:1]  # ids are stable
    first = api.http.get(url, params={"order": "asc", "limit": 2}).json()
    assert first["data"] == items[:2] and first["has_more"] is True
    rest = api.http.get(url, params={"order": "asc", "limit": 2, "after": first["last_id"]}).json()
    assert rest["data"] == items[2:] and rest["has_more"] is False
    back = api.http.get(url, params={"order": "asc", "limit": 1, "before": items[2]["id"]}).json()
    assert back["data"] == items[1:2] and back["has_more"] is True


def test_input_items_keep_client_ids_and_tool_items(api):
    r = create(api, input=[{"type": "message", "id": "msg_mine", "role": "user", "content": "x"},
                           {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
                           {"type": "function_call_output", "call_id": "call_1", "output": "42"}]).json()
    data = api.http.get(f"/v1/responses/{r['id']}/input_items", params={"order": "asc"}).json()["data"]
    assert data[0]["id"] == "msg_mine"
    assert {k: data[1][k] for k in ("type", "call_id", "name", "arguments")} == {
        "type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
    assert data[2]["type"] == "function_call_output" and data[2]["output"] == "42"
    assert data[1]["id"].startswith("fc_") and data[2]["id"].startswith("fco_")


@pytest.mark.parametrize("params, param", [({"limit": 0}, "limit"), ({"limit": 101}, "limit"),
                                           ({"order": "up"}, "order"), ({"after": "msg_nope"}, "after"),
                                           ({"before": "msg_nope"}, "before"),
                                           ({"include": "message.input_image.image_url"}, "include"),
                                           ({"include[]": "message.input_image.image_url"}, "include")])
def test_input_items_bad_params_are_400s(api, params, param):
    rid = create(api).json()["id"]
    assert_error(api.http.get(f"/v1/responses/{rid}/input_items", params=params), 400, param)


def test_input_items_of_an_unknown_id_is_a_404(api):
    err = assert_error(api.http.get("/v1/responses/resp_nope/input_items"), 404)
    assert err["code"] == "response_not_found"
