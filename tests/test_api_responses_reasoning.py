"""``/v1/responses`` on scripted answers (tests/scripted_runner.py), with ``--reasoning-parser``:
the reasoning becomes a ``reasoning`` item before the message or the calls, streamed as
``response.reasoning_text.delta`` events that never show a cut ``</think>``; the streamed
final response equals the non-streamed one; a reasoning cut by ``max_output_tokens`` is an
incomplete response with only the reasoning item. Without one: ``parallel_tool_calls: false``
gives one call, and a call cut by ``max_output_tokens`` never shows as text."""
from __future__ import annotations

import json

import pytest

from api_helpers import MODEL
from scripted_runner import Server

ASK = [{"role": "user", "content": "What is 2 + 2?"}]
TOOL = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}]
PIECES = ["Two plus two.", " Four.\n", "</th", "ink>", "\n\nIt is 4."]


@pytest.fixture(scope="module")
def srv():
    with Server("deepseek_r1") as s:
        yield s


def respond(srv, pieces, stream=False, chat_fields=None, **body):
    srv.script(ASK, pieces, **(chat_fields or {}))
    r = srv.http.post("/v1/responses", json={"model": MODEL, "input": ASK, "max_output_tokens": 64,
                                             "stream": stream, **body})
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()
    return [json.loads(block.split("\n")[1][len("data: "):]) for block in r.text[:-2].split("\n\n")]


def _plain(items):
    return [{k: v for k, v in i.items() if k not in ("id", "call_id")} for i in items]


def test_reasoning_item_then_message_streamed_alike(srv):
    r = respond(srv, PIECES)
    assert [i["type"] for i in r["output"]] == ["reasoning", "message"] and r["status"] == "completed"
    assert r["output"][0]["content"] == [{"type": "reasoning_text", "text": "Two plus two. Four.\n"}]
    assert r["output"][1]["content"][0]["text"] == "\n\nIt is 4."
    assert r["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    events = respond(srv, PIECES, stream=True)
    pieces = [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"]
    assert "".join(pieces) == "Two plus two. Four.\n" and not any("</" in p for p in pieces)
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "\n\nIt is 4."
    final = events[-1]
    assert final["type"] == "response.completed" and _plain(final["response"]["output"]) == _plain(r["output"])
    kinds = [e["type"] for e in events]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")


def test_reasoning_then_function_call(srv):
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    pieces = ["Need the weather.", "</think>", "\n\n", call]
    r = respond(srv, pieces, chat_fields={"tools": CHAT_TOOLS}, tools=[TOOL])
    assert [i["type"] for i in r["output"]] == ["reasoning", "function_call"]
    assert json.loads(r["output"][1]["arguments"]) == {"city": "Paris"}
    events = respond(srv, pieces, stream=True, chat_fields={"tools": CHAT_TOOLS}, tools=[TOOL])
    assert _plain(events[-1]["response"]["output"]) == _plain(r["output"])
    assert not [e for e in events if e["type"] == "response.output_text.delta"]


def test_reasoning_cut_by_max_output_tokens_is_incomplete(srv):
    pieces = ["Thinking", " very", " long", " about", " it", " still"]
    r = respond(srv, pieces, max_output_tokens=4)
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [(i["type"], i["status"]) for i in r["output"]] == [("reasoning", "incomplete")]
    events = respond(srv, pieces, stream=True, max_output_tokens=4)
    assert events[-1]["type"] == "response.incomplete"
    assert _plain(events[-1]["response"]["output"]) == _plain(r["output"])


def test_reasoning_items_in_input_stay_out_of_the_prompt(srv):
    srv.script(ASK, ["ok"])
    base = srv.http.post("/v1/responses", json={"model": MODEL, "input": ASK, "max_output_tokens": 4}).json()
    with_item = srv.http.post("/v1/responses", json={"model": MODEL, "max_output_tokens": 4, "input": [
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "x"}]},
        *ASK]}).json()
    assert with_item["usage"]["input_tokens"] == base["usage"]["input_tokens"]


@pytest.fixture(scope="module")
def plain():
    with Server(None) as s:
        yield s


def test_parallel_tool_calls_false_gives_one_call_and_a_cut_call_is_never_text(plain):
    one = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Madrid"}}\n</tool_call>'  # compact: the grammar's
    two = one + "\n" + one.replace("Madrid", "Vienna")
    plain.script(ASK, [two], tools=CHAT_TOOLS)
    body = {"model": MODEL, "input": ASK, "max_output_tokens": 64, "tools": [TOOL]}
    r = plain.http.post("/v1/responses", json=body).json()
    assert [i["type"] for i in r["output"]] == ["function_call", "function_call"]
    plain.script(ASK, [two], tools=CHAT_TOOLS)
    r = plain.http.post("/v1/responses", json={**body, "parallel_tool_calls": False}).json()
    assert [i["type"] for i in r["output"]] == ["function_call"] and r["parallel_tool_calls"] is False
    for limit, kinds in ((25, ["message"]), (40, ["function_call"])):  # inside the first call / the second
        plain.script(ASK, [two], tools=CHAT_TOOLS)
        cut = plain.http.post("/v1/responses", json={**body, "max_output_tokens": limit}).json()
        assert cut["status"] == "incomplete" and [i["type"] for i in cut["output"]] == kinds
        texts = [p["text"] for i in cut["output"] if i["type"] == "message" for p in i["content"]]
        assert texts in ([], [""]), cut["output"]
        plain.script(ASK, [two], tools=CHAT_TOOLS)
        r = plain.http.post("/v1/responses", json={**body, "max_output_tokens": limit, "stream": True})
        events = [json.loads(b.split("\n")[1][len("data: "):]) for b in r.text[:-2].split("\n\n")]
        assert _plain(events[-1]["response"]["output"]) == _plain(cut["output"])
        assert not [e for e in events if e["type"] == "response.output_text.delta"]
