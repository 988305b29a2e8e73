"""From a request's ``prompt`` / ``messages`` to the token ids the engine sees.

Owns the prompt forms (text, texts, ids, lists of ids), the chat template call, system
messages for templates without a system role, and left truncation. Contracts:
  * Text prompts are encoded with the tokenizer's special tokens (BOS if it adds one);
    token-id prompts are used verbatim (no BOS added or removed) (SC-07, SC-23).
  * Chat prompts are rendered, then encoded without added special tokens, so a template
    that writes BOS itself yields exactly one (SC-23).
  * A template that drops or rejects the system role gets the system text merged into the
    first user turn, never silently lost (SC-24).
  * Truncation keeps the **last** tokens: ``truncate_prompt_tokens: K`` keeps K; the server
    flag ``--truncate-prompt left`` keeps what leaves room for ``max_tokens`` (SC-03).
Errors are `RequestError` (HTTP 400) naming ``prompt`` or ``messages``.
"""
from __future__ import annotations

import dataclasses
import functools
import logging

from jaxinfer.api.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from jaxinfer.errors import RequestError

logger = logging.getLogger(__name__)

SYSTEM_PROBE = "jaxinfer-system-probe-7f3a"


@dataclasses.dataclass
class Prompt:
    """One prompt ready for the engine.

    Attributes:
      token_ids: ids after truncation.
      text: the prompt text (rendered chat for chat requests), None for id prompts.
      num_truncated: tokens dropped from the left.
    """

    token_ids: list[int]
    text: str | None = None
    num_truncated: int = 0


def completion_prompts(req: CompletionRequest, tokenizer) -> list[Prompt]:
    """The prompts of a completions request, in order (one choice group each).

    Raises:
      RequestError: empty prompt list, text without a tokenizer (param ``prompt``).
    """
    p = req.prompt
    if isinstance(p, str):
        return [Prompt(_encode(tokenizer, p), p)]
    if not p:
        raise RequestError("prompt must not be empty", param="prompt")
    if isinstance(p[0], str):
        return [Prompt(_encode(tokenizer, s), s) for s in p]
    if isinstance(p[0], int):
        return [Prompt(list(p))]
    return [Prompt(list(ids)) for ids in p]


def chat_prompt(req: ChatCompletionRequest | list[ChatMessage], tokenizer, *, add_generation_prompt: bool = True,
                continue_final_message: bool = False) -> Prompt:
    """Render a conversation with the chat template and encode it.

    Raises:
      RequestError (param ``messages``): no messages, no tokenizer or template, the
      template rejects the conversation, ``continue_final_message`` without a final
      assistant message.
    """
    messages = req.messages if isinstance(req, ChatCompletionRequest) else req
    if not messages:
        raise RequestError("messages must contain at least one message", param="messages")
    if tokenizer is None or not tokenizer.has_chat_template:
        raise RequestError("this model has no chat template: use /v1/completions", param="messages")
    if continue_final_message and messages[-1].role != "assistant":
        raise RequestError("continue_final_message needs a final assistant message", param="messages")
    convo = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in messages]
    for turn in convo:
        check_text(turn["content"], "messages")
    if not supports_system_role(tokenizer):
        convo = merge_system_into_user(convo)
    try:
        text = tokenizer.render_chat(convo, add_generation_prompt=add_generation_prompt,
                                     continue_final_message=continue_final_message)
    except Exception as exc:  # jinja errors raised by the template (e.g. role order)
        raise RequestError(f"the chat template rejected the messages: {exc}", param="messages") from exc
    return Prompt(tokenizer.encode(text, add_special_tokens=False), text)


@functools.lru_cache(maxsize=8)
def supports_system_role(tokenizer) -> bool:
    """Whether the chat template renders a system message's text (probed once per tokenizer)."""
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


def truncate(prompt: Prompt, *, keep: int | None, max_model_len: int, max_tokens: int | None,
             truncate_left: bool) -> Prompt:
    """Left-truncate a prompt.

    Args:
      keep: the request's ``truncate_prompt_tokens`` (keep the last ``keep`` ids), or None.
      max_model_len: the context limit C.
      max_tokens: the request's token budget (None: at least one token).
      truncate_left: the server's ``--truncate-prompt left``: a prompt with
        ``len + max_tokens > C`` keeps its last ``C - max_tokens`` ids.
    Raises:
      RequestError: ``keep`` >= C (param ``truncate_prompt_tokens``).
    """
    if keep is not None:
        if keep >= max_model_len:
            raise RequestError(f"truncate_prompt_tokens ({keep}) must be below max_model_len ({max_model_len})",
                               param="truncate_prompt_tokens")
    elif truncate_left:
        room = max_model_len - (max_tokens or 1)
        keep = room if room >= 1 else None
    if keep is None or len(prompt.token_ids) <= keep:
        return prompt
    dropped = len(prompt.token_ids) - keep
    return Prompt(prompt.token_ids[dropped:], None, dropped)


def check_text(text: str, param: str) -> None:
    """Raise `RequestError` (400) for text that is not valid Unicode: JSON's ``\\ud800``
    escapes decode to lone surrogates, which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{param} is not valid Unicode: a lone surrogate at character {exc.start}",
                           param=param) from None


def encode_text(tokenizer, text: str, *, add_special_tokens: bool = True, param: str = "prompt") -> list[int]:
    """Token ids of a text prompt; 400 without a tokenizer or for invalid Unicode."""
    if tokenizer is None:
        raise RequestError("this model has no tokenizer: send token ids", param=param)
    check_text(text, param)
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def _encode(tokenizer, text: str) -> list[int]:
    return encode_text(tokenizer, text)


def check_chat_template(tokenizer) -> None:
    """Start-up check: warn when the chat template ignores ``add_generation_prompt`` (SC-24)
    or drops system messages (they are then merged into the first user turn)."""
    if tokenizer is None or not tokenizer.has_chat_template:
        return
    if tokenizer.template_ignores_generation_prompt():
        logger.warning("the chat template ignores add_generation_prompt: prompts will lack the assistant header "
                       "and chat outputs may be wrong")
    if not supports_system_role(tokenizer):
        logger.warning("the chat template has no system role: system messages are merged into the first user turn")
