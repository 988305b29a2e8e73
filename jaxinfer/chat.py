"""Conversations -> the prompt the engine sees, shared by the HTTP API and `LLM.chat`.

Owns the chat roles (``developer`` is ``system``), text-part flattening, the Unicode check,
system messages for templates without a system role (merged into the first user turn,
never silently lost: serving case SC-24), and the template call. A conversation is
rendered once and encoded without added special tokens, so a template that writes BOS
itself yields exactly one (SC-23; also how transformers tokenizes chats). Errors are
`RequestError` naming ``messages``. No JAX here.
"""
from __future__ import annotations

import functools

from jaxinfer.errors import RequestError

SYSTEM_PROBE = "jaxinfer-system-probe-7f3a"
NO_TEMPLATE = ("this model has no chat template (a pretrained base model has none): start the server with "
               "--chat-template FILE or a bundled name such as gemma3 (LLM(chat_template=...) offline), "
               "or send a prompt to /v1/completions")
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


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
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(f"each message needs a role in {sorted(ROLES)}, got {m!r:.80}", param="messages")
        content = m.get("content") or ""
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError("content parts must be {'type': 'text', 'text': str}", param="messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestError(f"message content must be a string or text parts, got {content!r:.80}",
                               param="messages")
        out.append({"role": m["role"], "content": content})
    return out


def render_conversation(convo: list[dict], tokenizer, *, add_generation_prompt: bool = True,
                        continue_final_message: bool = False) -> tuple[str, list[int]]:
    """Render ``convo`` (dicts with a role in `ROLES` and string content) with the chat
    template; returns ``(text, token_ids)``.

    Raises:
      RequestError (param ``messages``): no messages, no tokenizer or template, invalid
      Unicode, the template rejects the conversation, ``continue_final_message`` without a
      final assistant message.
    """
    if not convo:
        raise RequestError("messages must contain at least one message", param="messages")
    if tokenizer is None or not tokenizer.has_chat_template:
        raise RequestError(NO_TEMPLATE, param="messages")
    if continue_final_message and convo[-1]["role"] != "assistant":
        raise RequestError("continue_final_message needs a final assistant message", param="messages")
    convo = [{"role": ROLES[m["role"]], "content": m["content"]} for m in convo]
    for turn in convo:
        check_text(turn["content"], "messages")
    if not supports_system_role(tokenizer):
        convo = merge_system_into_user(convo)
    try:
        text = tokenizer.render_chat(convo, add_generation_prompt=add_generation_prompt,
                                     continue_final_message=continue_final_message)
    except Exception as exc:  # jinja errors raised by the template (e.g. role order)
        raise RequestError(f"the chat template rejected the messages: {exc}", param="messages") from exc
    return text, tokenizer.encode(text, add_special_tokens=False)


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
