"""``--reasoning-parser`` over HTTP on scripted answers (tests/scripted_runner.py; SmolLM2's
tokenizer, in which ``</think>`` is several tokens): non-streamed and streamed answers split
into ``reasoning_content`` / ``reasoning`` and ``content`` alike, a ``</think>`` cut over two
tokens never shows, an answer without reasoning stays content; ``chat_template_kwargs``
reach the template (``enable_thinking``), a template that opens ``<think>`` in the prompt
starts the output in reasoning; constraints and tool calls apply to the answer after the
reasoning (issue 46)."""
from __future__ import annotations

import json

import pytest

from api_helpers import MODEL
from scripted_runner import Server, streamed

MSGS = [{"role": "user", "content": "What is 2 + 2?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
# Qwen3's switch, in a small ChatML template: thinking off writes an empty, closed think block
QWEN3_LIKE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
              "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
# Qwen3.5 / Thinking-2507 style: the template opens the reasoning for the model
OPENS_THINK = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
               "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


@pytest.fixture(scope="module")
def servers():
    made = {}

    def get(parser, template=None):
        if (parser, template) not in made:
            made[parser, template] = Server(parser, template).__enter__()
        return made[parser, template]
    yield get
    for s in made.values():
        s.__exit__(None, None, None)


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_reasoning_splits_alike_streamed_and_not(servers, parser):
    srv = servers(parser)
    pieces = ["<think>\n" if parser == "qwen3" else "", "Two plus two.", " Four.\n", "</th", "ink>", "\n\nIt is 4."]
    msg = srv.chat(pieces)["choices"][0]
    assert msg["message"]["reasoning_content"] == msg["message"]["reasoning"] == ("\n" if parser == "qwen3" else "") + \
        "Two plus two. Four.\n"
    assert msg["message"]["content"] == "\n\nIt is 4." and msg["finish_reason"] == "stop"
    got = streamed(srv.chat(pieces, stream=True))
    assert (got["reasoning_content"], got["content"]) == (msg["message"]["reasoning_content"], "\n\nIt is 4.")
    reasoning_pieces = [p for p in got["pieces"] if p]
    assert len(reasoning_pieces) >= 4 and not any("</" in p for p in reasoning_pieces)  # "</" then "th": held back


def test_answer_without_reasoning_is_content(servers):
    srv = servers("qwen3")
    msg = srv.chat(["Just the answer: 4."])["choices"][0]["message"]
    assert msg["content"] == "Just the answer: 4." and "reasoning_content" not in msg and "reasoning" not in msg
    got = streamed(srv.chat(["Just the answer: 4."], stream=True))
    assert got["content"] == "Just the answer: 4." and got["reasoning_content"] == ""


def test_deepseek_r1_without_end_is_all_reasoning_and_cut_reasoning_stays_reasoning(servers):
    srv = servers("deepseek_r1")
    msg = srv.chat(["Still thinking about it"])["choices"][0]["message"]
    assert msg["reasoning_content"] == "Still thinking about it" and msg["content"] is None
    r = srv.chat(["<think>", "Long thought that max_tokens cuts", "</think>", "never seen"], max_tokens=4)
    c = r["choices"][0]
    assert c["finish_reason"] == "length" and c["message"]["content"] is None and c["message"]["reasoning"]


def test_include_reasoning_false_drops_it(servers):
    srv = servers("deepseek_r1")
    msg = srv.chat(["Hidden.", "</think>", "Shown."], include_reasoning=False)["choices"][0]["message"]
    assert msg["content"] == "Shown." and "reasoning_content" not in msg
    got = streamed(srv.chat(["Hidden.", "</think>", "Shown."], stream=True, include_reasoning=False))
    assert got["content"] == "Shown." and got["reasoning_content"] == ""


def test_enable_thinking_false_reaches_the_template_and_answers_content(servers):
    srv = servers("qwen3", QWEN3_LIKE)
    on = srv.http.post("/tokenize", json={"model": MODEL, "messages": MSGS}).json()["tokens"]
    off = srv.http.post("/tokenize", json={"model": MODEL, "messages": MSGS,
                                           "chat_template_kwargs": {"enable_thinking": False}}).json()["tokens"]
    assert srv.tok.decode(off, skip_special_tokens=False).endswith("<think>\n\n</think>\n\n")
    assert not srv.tok.decode(on, skip_special_tokens=False).endswith("</think>\n\n")
    pieces = ["<think>", "x", "</think>", "y"]
    assert srv.chat(pieces)["choices"][0]["message"]["reasoning"] == "x"
    msg = srv.chat(pieces, chat_template_kwargs={"enable_thinking": False})["choices"][0]["message"]
    assert msg["content"] == "<think>x</think>y" and "reasoning" not in msg


def test_template_that_opens_think_starts_the_output_in_reasoning(servers):
    srv = servers("qwen3", OPENS_THINK)
    msg = srv.chat(["I should add.", "</think>", "4"])["choices"][0]["message"]
    assert (msg["reasoning"], msg["content"]) == ("I should add.", "4")


def test_bad_chat_template_kwargs_are_400(servers):
    srv = servers("qwen3")
    for bad in ({"messages": []}, {"add_generation_prompt": False}, "thinking"):
        r = srv.http.post("/v1/chat/completions", json={"model": MODEL, "messages": MSGS, "chat_template_kwargs": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs", r.text


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
FMT = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}


def test_structured_output_applies_after_the_reasoning(servers):
    pieces = ["Not JSON at all {", "</think>", '{"a":', "4}"]
    msg = servers("deepseek_r1").chat(pieces, response_format=FMT)["choices"][0]["message"]
    assert msg["reasoning"] == "Not JSON at all {" and json.loads(msg["content"]) == {"a": 4}
    no_parser = servers(None).chat(pieces, response_format=FMT)["choices"][0]["message"]["content"]
    assert not no_parser.startswith("Not JSON")  # the mask held the answer from its first token
    # qwen3: the constraint starts at once when the answer opens no <think>, after it when it does
    assert json.loads(servers("qwen3").chat(['{"a":', "4}"], response_format=FMT)["choices"][0]["message"]
                      ["content"]) == {"a": 4}
    msg = servers("qwen3").chat(["<think>", "hm", "</think>", '{"a":', "5}"], response_format=FMT)
    assert json.loads(msg["choices"][0]["message"]["content"]) == {"a": 5}


CALL = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo"}}\n</tool_call>'


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_qwen_tool_call_after_reasoning(servers, tool_choice):
    srv = servers("qwen3")
    pieces = ["<think>", "The user wants weather.", "</think>", CALL]
    c = srv.chat(pieces, tools=TOOLS, tool_choice=tool_choice)["choices"][0]
    assert c["finish_reason"] == "tool_calls" and c["message"]["reasoning"] == "The user wants weather."
    assert c["message"]["content"] is None
    assert [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in c["message"]["tool_calls"]] == [
        ("get_weather", {"city": "Oslo"})]
    got = streamed(srv.chat(pieces, stream=True, tools=TOOLS, tool_choice=tool_choice))
    assert got["reasoning"] == "The user wants weather." and got["content"] == "" and got["finish"] == "tool_calls"
    assert [json.loads(t["function"]["arguments"]) for t in got["calls"]] == [{"city": "Oslo"}]


def test_official_client_reads_the_reasoning(servers):
    import openai

    srv = servers("deepseek_r1")
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=srv.http, max_retries=0)
    pieces = ["Add them.", "</think>", "4"]
    srv.script(MSGS, pieces)
    m = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=16).choices[0].message
    assert (m.reasoning_content, m.reasoning, m.content) == ("Add them.", "Add them.", "4")
    srv.script(MSGS, pieces)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=16, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "Add them."
    assert "".join(d.content or "" for d in deltas) == "4"
