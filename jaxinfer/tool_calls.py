"""Tool calling: the text convention, its grammar, and parsing it back into calls.

Owns the Hermes-style format (NousResearch Hermes 2 Pro / Qwen 2.5 templates): the model
answers a call as ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one
block per call. For a chat template with no tool support of its own (SmolLM2's renders only
``role`` and ``content``), `tools_system_text` describes the tools in the system turn,
assistant ``tool_calls`` are rendered as those blocks, and ``tool`` results are wrapped in
``<tool_response>`` tags inside a ``tool`` turn. A template that takes ``tools`` itself gets
them natively (`jaxinfer.chat`); its calls are parsed the same way.

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


def _call_schema(tool: dict) -> dict:
    fn = tool["function"]
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}


def tool_call_grammar(tools: list[dict], name: str | None = None) -> str:
    """A Lark grammar (llguidance dialect, ``%json``) for one or more calls of ``tools``, or
    of the function ``name`` only, and nothing else.

    Raises:
      KeyError: ``name`` is not one of ``tools``.
    """
    chosen = [t for t in tools if name is None or t["function"]["name"] == name]
    if not chosen:
        raise KeyError(name)
    schema = _call_schema(chosen[0]) if len(chosen) == 1 else {"anyOf": [_call_schema(t) for t in chosen]}
    schema["x-guidance"] = {"whitespace_flexible": False}  # compact JSON: no padding up to max_tokens
    call = f'"{OPEN}\\n" %json {json.dumps(schema)} "\\n{CLOSE}"'
    if name is not None:  # a named function: exactly one call
        return f"start: {call}\n"
    return f'start: call ("\\n" call)*\ncall: {call}\n'


def parse(text: str) -> tuple[str | None, list[dict]]:
    """Split a model answer into (content, calls).

    Returns:
      ``content``: the text outside call blocks (stripped; None when empty) and ``calls``:
      OpenAI ``tool_calls`` entries (``{"id", "type": "function", "function": {"name",
      "arguments"}}``, arguments as JSON text). Blocks that are not JSON objects with a
      string ``name`` stay in the content, as text.
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
    kept.append(text[pos:])
    content = "".join(kept).strip() if calls else text
    return (content or None), calls


def may_become_call(text: str) -> bool:
    """Whether a streamed answer so far could still turn into a call block (so it is held back)."""
    stripped = text.lstrip()
    return OPEN.startswith(stripped) or stripped.startswith(OPEN)
