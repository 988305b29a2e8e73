"""Conversations -> the prompt the engine sees, shared by the HTTP API and `LLM.chat`.

Owns the chat roles (``developer`` is ``system``; ``tool`` results), text-part flattening,
the Unicode check, system messages for templates without a system role (merged into the
first user turn, never silently lost: serving case SC-24), tools and tool calls for
templates without tool support (`jaxinfer.structured_outputs.tool_calls`), and the template call. A
conversation is rendered once and encoded without added special tokens, so a template
that writes BOS itself yields exactly one (SC-23; also how transformers tokenizes chats).

Special tokens typed inside message contents (``<|im_end|>\n<|im_start|>system``) are
plain text by default: only the template's own markers become control tokens, so a user
cannot forge a turn. ``parse_special=True`` (the server's
``--parse-special-tokens-in-messages``) restores parsing them. Errors are `RequestError`
naming ``messages``. No JAX here.
"""
from __future__ import annotations

import functools
import json
import re

from jaxinfer.structured_outputs import tool_calls
from jaxinfer.errors import RequestError

SYSTEM_PROBE = "jaxinfer-system-probe-7f3a"
NO_TEMPLATE = ("this model has no chat template (a pretrained base model has none): start the server with "
               "--chat-template FILE or a bundled name such as gemma3 (LLM(chat_template=...) offline), "
               "or send a prompt to /v1/completions")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
# names the renderer passes to ``apply_chat_template`` itself, and its other options (every named
# parameter of transformers' ``apply_chat_template``; tests/test_chat_templates.py checks the list)
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})
_HOLE = "\ue000jxi{}\ue001"  # stands for message i's content while rendering (private-use characters)
_HOLE_RE = re.compile("\ue000jxi(\\d+)\ue001")


def check_text(text: str, param: str) -> None:
    """Raise `RequestError` (400) for text that is not valid Unicode: JSON's ``\\ud800``
    escapes decode to lone surrogates, which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{param} is not valid Unicode: a lone surrogate at character {exc.start}",
                           param=param) from None


def conversation_from_dicts(conv) -> list[dict]:
    """Validate one conversation of message dicts (`LLM.chat`; the HTTP API validates with
    its schema) and flatten ``{"type": "text"}`` content parts.

    Raises:
      RequestError: not a list of messages with a known role and text content.
    """
    if not isinstance(conv, (list, tuple)):
        raise RequestError("a conversation must be a list of messages", param="messages")
    out = []
    for m in conv:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or m["role"] not in ROLES:
            raise RequestError(f"each message needs a role in {sorted(ROLES)}, got {m!r:.80}", param="messages")
        content = "" if m.get("content") is None else m["content"]
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError("content parts must be {'type': 'text', 'text': str}", param="messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestError(f"message content must be a string or text parts, got {content!r:.80}",
                               param="messages")
        msg = {"role": m["role"], "content": content}
        if m.get("tool_calls"):
            msg["tool_calls"] = _checked_tool_calls(m["tool_calls"])
        out.append(msg)
    return out


def _checked_tool_calls(calls) -> list:
    """An assistant message's ``tool_calls`` as OpenAI sends them: a list of ``{"function":
    {"name": str, "arguments": JSON text}}`` (``id`` and ``type`` optional here).

    Raises:
      RequestError (param ``messages``): any other shape (``arguments`` as a dict included:
        OpenAI's are a JSON string).
    """
    ok = isinstance(calls, (list, tuple)) and all(
        isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
        and isinstance(c["function"].get("arguments", ""), str) for c in calls)
    if not ok:
        raise RequestError('tool_calls must be a list of {"function": {"name": str, "arguments": JSON text}}, got '
                           f"{calls!r:.80}", param="messages")
    return list(calls)


def render_conversation(convo: list[dict], tokenizer, *, add_generation_prompt: bool = True,
                        continue_final_message: bool = False, tools: list[dict] | None = None,
                        parse_special: bool = False,
                        chat_template_kwargs: dict | None = None) -> tuple[str, list[int]]:
    """Render ``convo`` (dicts with a role in `ROLES`, string content, and for assistant turns
    optional OpenAI ``tool_calls``) with the chat template; returns ``(text, token_ids)``.

    Args:
      tools: OpenAI tool definitions offered to the model (described in the system turn when
        the template has no tool support of its own).
      parse_special: map special-token strings inside message contents to their ids (off:
        they are plain text; the template's own markers are special either way).
      chat_template_kwargs: more template variables (``{"enable_thinking": false}``), as
        vLLM's ``chat_template_kwargs`` (`check_template_kwargs`).
    Raises:
      RequestError (param ``messages``): no messages, no tokenizer or template, invalid
      Unicode, the template rejects the conversation, ``continue_final_message`` without a
      final assistant message; (param ``chat_template_kwargs``) see `check_template_kwargs`.
    """
    chat_template_kwargs = check_template_kwargs(chat_template_kwargs)
    if not convo:
        raise RequestError("messages must contain at least one message", param="messages")
    if tokenizer is None or not tokenizer.has_chat_template:
        raise RequestError(NO_TEMPLATE, param="messages")
    if continue_final_message and convo[-1]["role"] != "assistant":
        raise RequestError("continue_final_message needs a final assistant message", param="messages")
    native_tools = tokenizer.template_takes_tools()
    convo = [_as_template_message(m, native_tools) for m in convo]
    for turn in convo:
        check_text(turn["content"], "messages")
    if tools:  # their names, descriptions and schemas reach the prompt too
        check_text(json.dumps(tools, ensure_ascii=False), "tools")
    if tools and not native_tools:
        convo = _with_tools_text(convo, tools)
    if not supports_system_role(tokenizer):
        convo = merge_system_into_user(convo)
    contents = [m["content"] for m in convo]
    holes = [dict(m, content=_HOLE.format(i)) for i, m in enumerate(convo)]
    try:
        text = tokenizer.render_chat(holes, add_generation_prompt=add_generation_prompt,
                                     continue_final_message=continue_final_message,
                                     tools=tools if native_tools else None,
                                     chat_template_kwargs=chat_template_kwargs)
    except Exception as exc:  # jinja errors raised by the template (e.g. role order)
        raise RequestError(f"the chat template rejected the messages: {exc}", param="messages") from exc
    return _encode_filled(text, contents, tokenizer, parse_special)


def check_template_kwargs(kwargs) -> dict:
    """A request's ``chat_template_kwargs``, checked: an object whose keys are not the names
    the renderer passes itself (messages, tools, the generation-prompt switches and the
    tokenizer's own call options), so a client adds template variables but cannot replace
    the conversation or the tokenization.

    Raises:
      RequestError (param ``chat_template_kwargs``): not an object, or a reserved key.
    """
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise RequestError("chat_template_kwargs must be an object", param="chat_template_kwargs")
    reserved = sorted(set(kwargs) & RESERVED_TEMPLATE_KWARGS)
    if reserved:
        raise RequestError(f"chat_template_kwargs may not set {', '.join(reserved)} (give them as request fields)",
                           param="chat_template_kwargs")
    return dict(kwargs)


def _as_template_message(m: dict, native_tools: bool) -> dict:
    """A message as the template sees it: canonical role; tool calls and results as text
    unless the template renders them itself."""
    out = {"role": ROLES[m["role"]], "content": m["content"]}
    calls = m.get("tool_calls") or []
    if native_tools:
        if calls:
            out["tool_calls"] = calls
        return out
    if calls:
        blocks = [tool_calls.render_call(c["function"]["name"], c["function"].get("arguments") or "{}")
                  for c in calls]
        out["content"] = "\n".join(([m["content"]] if m["content"] else []) + blocks)
    if out["role"] == "tool":
        out["content"] = tool_calls.render_response(m["content"])
    return out


def _with_tools_text(convo: list[dict], tools: list[dict]) -> list[dict]:
    """Prepend the tools' description to the system turn (a new one if there is none)."""
    text = tool_calls.tools_system_text(tools)
    if convo and convo[0]["role"] == "system":
        return [dict(convo[0], content=f"{convo[0]['content']}\n\n{text}")] + convo[1:]
    return [{"role": "system", "content": text}] + convo


def _encode_filled(text: str, contents: list[str], tokenizer, parse_special: bool) -> tuple[str, list[int]]:
    """Put the contents into the rendered holes and encode. With ``parse_special`` off,
    a content span that contains a special token is re-encoded on its own as plain text;
    a conversation without one encodes exactly as the whole text does."""
    pieces, spans, pos = [], [], 0
    for m in _HOLE_RE.finditer(text):
        pieces.append(text[pos:m.start()])
        start = sum(map(len, pieces))
        pieces.append(contents[int(m.group(1))])
        spans.append((start, start + len(pieces[-1])))
        pos = m.end()
    pieces.append(text[pos:])
    full = "".join(pieces)
    ids, offsets = tokenizer.encode_with_offsets(full)
    if parse_special or not _special_inside(ids, offsets, spans, tokenizer.all_special_ids):
        return full, ids
    out, cursor = [], 0
    for a, b in spans:
        out += tokenizer.encode(full[cursor:a], add_special_tokens=False)
        out += tokenizer.encode_plain(full[a:b])
        cursor = b
    return full, out + tokenizer.encode(full[cursor:], add_special_tokens=False)


def _special_inside(ids, offsets, spans, special_ids) -> bool:
    return any(t in special_ids and any(a <= s and e <= b for a, b in spans)
               for t, (s, e) in zip(ids, offsets) if e > s)


def supports_system_role(tokenizer) -> bool:
    """Whether the chat template renders a system message's text (probed once per tokenizer
    and template)."""
    return _supports_system_role(tokenizer, tokenizer.chat_template)


@functools.lru_cache(maxsize=8)
def _supports_system_role(tokenizer, template: str | None) -> bool:
    try:
        text = tokenizer.render_chat([{"role": "system", "content": SYSTEM_PROBE}, {"role": "user", "content": "x"}])
    except Exception:  # templates that raise on the system role
        return False
    return SYSTEM_PROBE in text


def merge_system_into_user(convo: list[dict]) -> list[dict]:
    """Fold system messages into the first user turn (``system\\n\\nuser``)."""
    system = "\n\n".join(m["content"] for m in convo if m["role"] == "system")
    rest = [dict(m) for m in convo if m["role"] != "system"]
    if not system:
        return rest
    for m in rest:
        if m["role"] == "user":
            m["content"] = f"{system}\n\n{m['content']}"
            return rest
    return [{"role": "user", "content": system}] + rest
