"""From a request's ``prompt`` / ``messages`` to the token ids the engine sees.

Owns the prompt forms (text, texts, ids, lists of ids) and left truncation; chat
conversations go through `jaxinfer.tokenizer.chat` (shared with `LLM.chat`). Contracts:
  * Text prompts are encoded with the tokenizer's special tokens (BOS if it adds one);
    token-id prompts are used verbatim (no BOS added or removed) (SC-07, SC-23).
  * Chat prompts are rendered, then encoded without added special tokens, so a template
    that writes BOS itself yields exactly one (SC-23). Special-token strings inside message
    contents are plain text unless the server says otherwise (`jaxinfer.tokenizer.chat`); completion
    prompts keep parsing them (their author writes the whole prompt).
  * A template that drops or rejects the system role gets the system text merged into the
    first user turn, never silently lost (SC-24).
  * Truncation keeps the **last** tokens: ``truncate_prompt_tokens: K`` keeps K; the server
    flag ``--truncate-prompt left`` keeps what leaves room for ``max_tokens`` (SC-03).
Errors are `RequestError` (HTTP 400) naming ``prompt`` or ``messages``.
"""
from __future__ import annotations

import dataclasses
import logging

from jaxinfer.entrypoints.openai.params import tools_as_dicts
from jaxinfer.entrypoints.openai.protocol import (ChatCompletionRequest, ChatMessage, CompletionRequest,
                                                  TokenizeRequest)
from jaxinfer.tokenizer.chat import check_text, render_conversation, supports_system_role
from jaxinfer.errors import RequestError

logger = logging.getLogger(__name__)

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


def chat_prompt(req: ChatCompletionRequest | TokenizeRequest, tokenizer, *, parse_special: bool = False) -> Prompt:
    """Render a conversation with the chat template and encode it (`jaxinfer.tokenizer.chat`).

    One function for ``/v1/chat/completions`` and ``/tokenize`` (``messages``), so that
    ``/tokenize`` returns exactly the ids a chat request with the same fields is prompted
    with: the messages and the template inputs (`add_generation_prompt`,
    `continue_final_message`, the tools when ``tool_choice`` is not ``none``,
    `chat_template_kwargs`).

    Args:
      parse_special: special-token strings in message contents become control tokens.
    Raises:
      RequestError (param ``messages``, ``tool_choice`` or ``chat_template_kwargs``): see
      `jaxinfer.tokenizer.chat.render_conversation` and `params.tools_as_dicts`.
    """
    convo = [_message_dict(m) for m in req.messages]
    text, ids = render_conversation(convo, tokenizer, add_generation_prompt=req.add_generation_prompt is not False,
                                    continue_final_message=bool(req.continue_final_message),
                                    tools=tools_as_dicts(req), parse_special=parse_special,
                                    chat_template_kwargs=req.chat_template_kwargs)
    return Prompt(ids, text)


def _message_dict(m: ChatMessage) -> dict:
    d = {"role": m.role, "content": m.text()}
    if m.tool_calls:
        d["tool_calls"] = [c.model_dump() for c in m.tool_calls]
    return d


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
    or drops system messages (they are then merged into the first user turn), and say when
    there is no template (chat requests then get a 400; completions work)."""
    if tokenizer is None:
        return
    if not tokenizer.has_chat_template:
        logger.warning("the model has no chat template: /v1/chat/completions answers 400 "
                       "(pass --chat-template FILE or a bundled name such as gemma3); /v1/completions works")
        return
    if tokenizer.template_ignores_generation_prompt():
        logger.warning("the chat template ignores add_generation_prompt: prompts will lack the assistant header "
                       "and chat outputs may be wrong")
    if not supports_system_role(tokenizer):
        logger.warning("the chat template has no system role: system messages are merged into the first user turn")
