"""The tool-call field reports of issue 49, one test each, on scripted answers
(tests/scripted_runner.py: the fake model writes a script within the structured-output mask,
so only the grammar can stop it):

* ``parallel_tool_calls: false`` with ``tool_choice`` unset or ``"auto"`` after two earlier
  two-call turns: the model "wants" two calls, the answer has one (streamed: index 0 only;
  n=8: one per choice); ``required`` and named stay at one.
* A call cut by ``max_tokens`` is never ``content``, for ``required``, named and ``auto``,
  streamed or not (complete calls are kept; ``finish_reason`` is ``length``).
* ``/tokenize`` with ``messages`` and ``tools`` (and ``chat_template_kwargs``) returns the
  ids the chat request is prompted with (its ``usage.prompt_tokens`` and the engine's ids).
* ``stream_options.continuous_usage_stats``: ``usage`` on every chunk (vLLM's rule: only with
  ``include_usage``).
"""
from __future__ import annotations

import json

import pytest

from api_helpers import MODEL, sse_json
from scripted_runner import Server, streamed

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOLS = [WEATHER, TIME]


def call(name: str, city: str) -> str:
    return f'<tool_call>\n{{"name":"{name}","arguments":{{"city":"{city}"}}}}\n</tool_call>'


def earlier_turn(i: int, a: str, b: str) -> list[dict]:
    calls = [{"id": f"c{i}{k}", "type": "function", "function": {"name": "get_weather",
                                                                  "arguments": json.dumps({"city": c})}}
             for k, c in enumerate((a, b))]
    return ([{"role": "user", "content": f"Weather in {a} and {b}?"},
             {"role": "assistant", "content": None, "tool_calls": calls}]
            + [{"role": "tool", "tool_call_id": c["id"], "content": "20 C"} for c in calls]
            + [{"role": "assistant", "content": f"{a} and {b}: 20 C."}])


# the report's conversation: two earlier two-call turns, then a question asking for two calls again
CONVO = earlier_turn(1, "Paris", "Rome") + earlier_turn(2, "Oslo", "Lima") + [
    {"role": "user", "content": "Weather in Madrid and Vienna?"}]
TWO_CALLS = [call("get_weather", "Madrid"), "\n", call("get_weather", "Vienna")]


@pytest.fixture(scope="module")
def srv():
    with Server(None) as s:
        yield s


def calls_of(message) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]


def test_script_without_the_flag_gives_two_calls(srv):
    """The control: without parallel_tool_calls false the scripted answer keeps both calls."""
    c = srv.chat(TWO_CALLS, messages=CONVO, tools=TOOLS, temperature=0)["choices"][0]
    assert calls_of(c["message"]) == [("get_weather", {"city": "Madrid"}), ("get_weather", {"city": "Vienna"})]


@pytest.mark.parametrize("tool_choice", [None, "auto", "required", {"type": "function",
                                                                      "function": {"name": "get_weather"}}])
def test_parallel_tool_calls_false_gives_at_most_one_call(srv, tool_choice):
    fields = dict(messages=CONVO, tools=TOOLS, temperature=0, parallel_tool_calls=False,
                  **({"tool_choice": tool_choice} if tool_choice is not None else {}))
    c = srv.chat(TWO_CALLS, **fields)["choices"][0]
    assert c["finish_reason"] == "tool_calls"
    assert calls_of(c["message"]) == [("get_weather", {"city": "Madrid"})]
    events = srv.chat(TWO_CALLS, stream=True, **fields)
    got = streamed(events)
    assert [d["index"] for d in got["calls"]] == [0] and got["finish"] == "tool_calls"
    r = srv.chat(TWO_CALLS, **dict(fields, n=8, temperature=1.0))
    assert [len(ch["message"]["tool_calls"]) for ch in r["choices"]] == [1] * 8


def test_parallel_tool_calls_false_still_allows_a_plain_answer(srv):
    c = srv.chat(["It is sunny in both."], messages=CONVO, tools=TOOLS, parallel_tool_calls=False)["choices"][0]
    assert c["message"]["content"] == "It is sunny in both." and c["finish_reason"] == "stop"
    c = srv.chat(["Let me check.\n", *TWO_CALLS], messages=CONVO, tools=TOOLS,
                 parallel_tool_calls=False)["choices"][0]  # text, then one call and the end
    assert c["message"]["content"] == "Let me check." and len(c["message"]["tool_calls"]) == 1


BERLIN = [call("get_weather", "Berlin")]


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}},
                                         "auto"])
@pytest.mark.parametrize("max_tokens", [3, 6, 12, 20])
def test_call_cut_by_max_tokens_is_never_content(srv, tool_choice, max_tokens):
    msgs = [{"role": "user", "content": "Weather in Berlin?"}]
    fields = dict(messages=msgs, tools=TOOLS, tool_choice=tool_choice, max_tokens=max_tokens)
    c = srv.chat(BERLIN, **fields)["choices"][0]
    assert c["finish_reason"] == "length"
    assert c["message"]["content"] is None and "tool_calls" not in c["message"], c
    got = streamed(srv.chat(BERLIN, stream=True, **fields))
    assert got["content"] == "" and got["calls"] == [] and got["finish"] == "length"


def test_complete_calls_are_kept_when_a_later_one_is_cut(srv):
    msgs = [{"role": "user", "content": "Weather in Madrid and Vienna?"}]
    ids = srv.script(msgs, TWO_CALLS, tools=TOOLS)
    first = len(srv.tok.encode(TWO_CALLS[0] + "\n", add_special_tokens=False))
    for tool_choice in ("required", "auto"):
        fields = dict(messages=msgs, tools=TOOLS, tool_choice=tool_choice, max_tokens=first + 5)
        assert first + 5 < len(ids)
        c = srv.chat(TWO_CALLS, **fields)["choices"][0]
        assert c["finish_reason"] == "length" and c["message"]["content"] is None
        assert calls_of(c["message"]) == [("get_weather", {"city": "Madrid"})]
        got = streamed(srv.chat(TWO_CALLS, stream=True, **fields))
        assert got["content"] == "" and [json.loads(d["function"]["arguments"]) for d in got["calls"]] == [
            {"city": "Madrid"}] and got["finish"] == "length"


def test_text_before_a_cut_call_stays_and_the_call_does_not(srv):
    fields = dict(messages=[{"role": "user", "content": "Weather?"}], tools=TOOLS, max_tokens=9)
    pieces = ["Checking now.", "\n", *BERLIN]
    c = srv.chat(pieces, **fields)["choices"][0]
    assert c["message"]["content"] == "Checking now." and c["finish_reason"] == "length"
    got = streamed(srv.chat(pieces, stream=True, **fields))
    assert got["content"] == "Checking now." and got["calls"] == []


@pytest.mark.parametrize("extra", [{}, {"tool_choice": "none"}, {"tool_choice": "required"},
                                   {"chat_template_kwargs": {"enable_thinking": False}},
                                   {"add_generation_prompt": False}])
def test_tokenize_with_tools_returns_the_chat_prompt_ids(srv, extra):
    msgs = [{"role": "user", "content": "Weather in Berlin?"}]
    body = {"model": MODEL, "messages": msgs, "tools": TOOLS, **extra}
    tokens = srv.http.post("/tokenize", json=body).json()["tokens"]
    before = len(srv.added)
    r = srv.http.post("/v1/chat/completions", json={**body, "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(tokens) and srv.added[before:] == [tokens]
    if extra.get("tool_choice") != "none":
        without = srv.http.post("/tokenize", json={"model": MODEL, "messages": msgs}).json()["tokens"]
        assert len(tokens) > len(without)  # the tools are in the prompt (the report: they were not)


def test_tokenize_refuses_what_the_chat_request_refuses(srv):
    msgs = [{"role": "user", "content": "hi"}]
    r = srv.http.post("/tokenize", json={"model": MODEL, "messages": msgs, "tools": TOOLS,
                                         "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = srv.http.post("/tokenize", json={"model": MODEL, "messages": msgs, "chat_template_kwargs": {"tools": []}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_continuous_usage_stats_puts_usage_on_every_chunk(srv, endpoint):
    srv.runner.script = None  # the fake model's own continuation
    body = {"model": MODEL, "max_tokens": 5, "n": 2, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    if endpoint == "chat":
        r = srv.http.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "hi"}]})
    else:
        r = srv.http.post("/v1/completions", json={**body, "prompt": "Hello there"})
    events = sse_json(r.content)
    assert all(e.get("usage") for e in events)
    final = events[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 10
    prompt = final["usage"]["prompt_tokens"]
    seen = {0: [], 1: []}
    for e in events[:-1]:
        u = e["usage"]
        assert u["prompt_tokens"] == prompt and u["total_tokens"] == prompt + u["completion_tokens"]
        seen[e["choices"][0]["index"]].append(u["completion_tokens"])
    for counts in seen.values():
        assert counts == sorted(counts) and counts[-1] == 5
    plain = sse_json(srv.http.post("/v1/completions", json={
        **body, "prompt": "Hello there", "stream_options": {"continuous_usage_stats": True}}).content)
    assert not any(e.get("usage") for e in plain)  # without include_usage: no usage at all (vLLM)


def test_a_tool_schema_that_cannot_compile_is_400_naming_tools(srv):
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "no-such-type"}}}]
    for fields in ({"tool_choice": "required"}, {"parallel_tool_calls": False}):
        r = srv.http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                                         "tools": bad, **fields})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text


def test_parallel_tool_calls_false_with_another_constraint_keeps_that_constraint(srv):
    """``auto`` + ``parallel_tool_calls: false`` + ``response_format``: the format applies (no 400
    for two constraints), and a call it let through is cut to one when parsed."""
    fields = dict(messages=[{"role": "user", "content": "x"}], tools=TOOLS, parallel_tool_calls=False)
    c = srv.chat(['{"ok":', "true}"], response_format={"type": "json_object"}, **fields)["choices"][0]
    assert json.loads(c["message"]["content"]) == {"ok": True}
    two = srv.chat(TWO_CALLS, structured_outputs={"regex": "(?s:.*)"}, **fields)["choices"][0]
    assert len(two["message"]["tool_calls"]) == 1


def test_held_back_text_keeps_every_tokens_logprobs_when_streamed(srv):
    fields = dict(messages=[{"role": "user", "content": "x"}], tools=TOOLS, logprobs=True)
    pieces = ["Checking.", "\n", *TWO_CALLS]
    whole = srv.chat(pieces, **fields)["choices"][0]["logprobs"]["content"]
    events = srv.chat(pieces, stream=True, **fields)
    pieces_lp = [t for e in events for c in e["choices"] for t in ((c.get("logprobs") or {}).get("content") or [])]
    assert [t["token"] for t in pieces_lp] == [t["token"] for t in whole] and len(whole) > 20
