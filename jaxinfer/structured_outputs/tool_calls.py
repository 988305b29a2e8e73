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
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)


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


def tool_call_grammar(tools: list[dict], name: str | None = None, single: bool = False) -> str:
    """A Lark grammar (llguidance dialect, ``%json``) for one or more calls of ``tools``, or
    of the function ``name`` only, and nothing else. ``single``: exactly one call
    (``parallel_tool_calls: false``; a named function is always one call).

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
    call = f'"{OPEN}\\n" %json {json.dumps(schema)} "\\n{CLOSE}"'
    if name is not None or single:  # exactly one call
        return f"start: {call}\n"
    return f'start: call ("\\n" call)*\ncall: {call}\n'


def parse(text: str) -> tuple[str | None, list[dict]]:
    """Split a model answer into (content, calls).

    Returns:
      ``content``: the text outside call blocks (stripped; None when empty) and ``calls``:
      OpenAI ``tool_calls`` entries (``{"id", "type": "function", "function": {"name",
      "arguments"}}``, arguments as JSON text). Blocks that are not JSON objects with a
      string ``name`` stay in the content, as text. After at least one call, an unfinished
      call block at the end (cut by ``max_tokens``) is dropped, not shown as content.
    """
    calls, kept, pos = [], [], 0
    for m in _BLOCK.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}})
        kept.append(text[pos:m.start()])
        pos = m.end()
    tail = text[pos:].strip()
    cut_call = tail.startswith(OPEN) or (tail != "" and OPEN.startswith(tail))  # "<tool_call>{..." or "<tool"
    kept.append(text[pos:] if not (calls and cut_call) else "")
    content = "".join(kept).strip() if calls else text
    return (content or None), calls


def may_become_call(text: str) -> bool:
    """Whether a streamed answer so far could still turn into a call block (so it is held back)."""
    stripped = text.lstrip()
    return OPEN.startswith(stripped) or stripped.startswith(OPEN)
