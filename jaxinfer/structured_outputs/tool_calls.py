"""Tool calling: the text convention, its grammar, and parsing it back into calls.

Owns the Hermes-style format (NousResearch Hermes 2 Pro / Qwen 2.5 templates): the model
answers a call as ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one
block per call. For a chat template with no tool support of its own (SmolLM2's renders only
``role`` and ``content``), `tools_system_text` describes the tools in the system turn,
assistant ``tool_calls`` are rendered as those blocks, and ``tool`` results are wrapped in
``<tool_response>`` tags inside a ``tool`` turn. A template that takes ``tools`` itself gets
them natively (`jaxinfer.tokenizer.chat`); its calls are parsed the same way.

``tool_choice`` ``"required"`` or a named function is enforced by `tool_call_grammar` (a
Lark grammar whose arguments are the function's JSON schema), so the arguments always
parse and validate; ``"auto"`` is parsed when the model happens to answer in the format.
Plain Python; no JAX.
"""
from __future__ import annotations

import json
import re
import uuid

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def tools_system_text(tools: list[dict]) -> str:
    """The system-turn text that describes ``tools`` (OpenAI ``[{"type": "function", "function":
    {...}}]``) and the call format, for templates without tool support."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("You may call one or more functions to assist with the user query. The functions are:\n"
            f"<tools>\n{lines}\n</tools>\n"
            "To call a function, answer with a JSON object with its name and arguments inside tool_call tags:\n"
            f'{OPEN}\n{{"name": <function-name>, "arguments": <arguments-json-object>}}\n{CLOSE}')


def render_call(name: str, arguments: str) -> str:
    """One assistant call as the model writes it (``arguments``: the JSON text)."""
    try:
        args = json.loads(arguments) if arguments else {}
    except ValueError:
        args = arguments
    return f'{OPEN}\n{json.dumps({"name": name, "arguments": args}, ensure_ascii=False)}\n{CLOSE}'


def render_response(content: str) -> str:
    """A ``tool`` message's content as the model reads it."""
    return f"<tool_response>\n{content}\n</tool_response>"


def _rebase_refs(node, base: str):
    """``node`` with every document-local ``$ref`` (``#`` or ``#/...``) moved under the JSON
    pointer ``base``: a function's parameters schema is embedded in the call schema at ``base``,
    so its own ``#/$defs/x`` (or a recursive ``#``) must name ``base/$defs/x`` (or ``base``)."""
    if isinstance(node, list):
        return [_rebase_refs(v, base) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _rebase_refs(v, base) for k, v in node.items()}
    ref = node.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        out["$ref"] = "#" + base + ref[1:]
    return out


def _call_schema(tool: dict, index: int) -> tuple[dict, dict]:
    """(the schema of one call of ``tool``, ``{key: its parameters schema}`` for the root's
    ``$defs``). The parameters live in the root's ``$defs`` so that their own references
    (`_rebase_refs`) still resolve."""
    fn = tool["function"]
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    key = f"jaxinfer_tool_{index}_parameters"
    call = {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": {"$ref": f"#/$defs/{key}"}},
            "required": ["name", "arguments"], "additionalProperties": False}
    return call, {key: _rebase_refs(params, f"/$defs/{key}")}


def _calls_schema(tools: list[dict], name: str | None) -> dict:
    """The JSON schema of one call of ``tools`` (or of the function ``name`` only).

    Raises:
      KeyError: ``name`` is not one of ``tools``.
    """
    chosen = [t for t in tools if name is None or t["function"]["name"] == name]
    if not chosen:
        raise KeyError(name)
    calls, defs = [], {}
    for i, tool in enumerate(chosen):
        call, params = _call_schema(tool, i)
        calls.append(call)
        defs.update(params)
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema["$defs"] = defs
    schema["x-guidance"] = {"whitespace_flexible": False}  # compact JSON: no padding up to max_tokens
    return schema


def tool_call_grammar(tools: list[dict], name: str | None = None, single: bool = False) -> str:
    """A Lark grammar (llguidance dialect, ``%json``) for one or more calls of ``tools``, or
    of the function ``name`` only, and nothing else. ``single``: exactly one call
    (``parallel_tool_calls: false``; a named function is always one call).

    Raises:
      KeyError: ``name`` is not one of ``tools``.
    """
    call = f'"{OPEN}\\n" %json {json.dumps(_calls_schema(tools, name))} "\\n{CLOSE}"'
    if name is not None or single:  # exactly one call
        return f"start: {call}\n"
    return f'start: call ("\\n" call)*\ncall: {call}\n'


def at_most_one_call_grammar(tools: list[dict]) -> str:
    """A Lark grammar for ``tool_choice: "auto"`` with ``parallel_tool_calls: false``: any
    text without a call block, or such text then exactly one call of ``tools`` and the end.

    The text before a call and the call's opening tag are one lexeme (text whose only
    ``<tool_call>`` is at its end): llguidance's lexer does not backtrack, so a free-text
    terminal followed by a ``"<tool_call>"`` terminal would never reach the tag.
    """
    tag = re.escape(OPEN).replace("/", "\\/")
    return (f'start: TEXT? | OPENING "\\n" %json {json.dumps(_calls_schema(tools, None))} "\\n{CLOSE}"\n'
            f"TEXT: /(?s:.+)/ & ~/(?s:.*{tag}.*)/\n"
            f"OPENING: /(?s:.*){tag}/ & ~/(?s:.*{tag}.+)/\n")


def parse(text: str, truncated: bool = False) -> tuple[str | None, list[dict]]:
    """Split a model answer into (content, calls), as vLLM's Hermes parser does.

    Args:
      text: the answer (after any reasoning).
      truncated: the answer was cut by ``max_tokens``: a trailing start of the opening tag
        (``"<tool_c"``) is a cut call too.
    Returns:
      ``content``: the text before the first call block (right-stripped), or the whole text
      when it holds no call, or None when empty; ``calls``: OpenAI ``tool_calls`` entries
      (``{"id", "type": "function", "function": {"name", "arguments"}}``, arguments as JSON
      text). Blocks that are not JSON objects with a string ``name`` are not calls; with no
      call and no cut block the text stays content as it is. A block cut by ``max_tokens``
      (no ``</tool_call>``) is dropped, never shown as content; complete calls before it are
      kept. Text after the first call block is not content (Hermes answers put calls last).
    """
    first = text.find(OPEN)
    if first < 0:
        k = _open_prefix_len(text) if truncated else 0
        return ((text[:len(text) - k].rstrip() if k else text) or None), []
    calls, pos, cut = [], first, False
    while pos >= 0:
        end = text.find(CLOSE, pos)
        if end < 0:
            cut = True
            break
        call = _call(text[pos + len(OPEN):end])
        if call is not None:
            calls.append(call)
        pos = text.find(OPEN, end)
    if not calls and not cut:
        return (text or None), []
    return (text[:first].rstrip() or None), calls


def _call(block: str) -> dict | None:
    """The OpenAI call of one block's JSON, or None when it is not ``{"name": str, ...}``."""
    try:
        obj = json.loads(block)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def _open_prefix_len(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``<tool_call>``."""
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:k]):
            return k
    return 0


def stable_content(text: str) -> str:
    """The part of an unfinished answer that streams as content now: the text before the
    first ``<tool_call>`` (or before a tail that may become one), without trailing
    whitespace (`parse` strips it before a call). Always a prefix of `parse`'s content of
    the finished answer."""
    first = text.find(OPEN)
    head = text if first < 0 else text[:first]
    if first < 0:
        head = head[:len(head) - _open_prefix_len(head)]
    return head.rstrip()
