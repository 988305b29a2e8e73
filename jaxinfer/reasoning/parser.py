"""The reasoning parsers: where a model's reasoning ends and its answer begins.

Owns `ReasoningParser` (one per ``--reasoning-parser`` name), the mode a request's output
starts in (`ReasoningParser.start_mode`), the whole-text split (`ReasoningParser.split`),
the incremental split a stream uses (`ReasoningStream`), and `grammar_prefix`, the Lark
text that lets a structured-output constraint apply only after ``</think>``.

Semantics (vLLM's ``vllm/reasoning/qwen3_reasoning_parser.py`` and
``deepseek_r1_reasoning_parser.py``, as of 2026):
  * ``deepseek_r1``: the chat template opened ``<think>``, so the output starts inside the
    reasoning; a leading ``<think>`` the model writes itself is dropped; everything before
    the first ``</think>`` is reasoning, the rest is content; with no ``</think>`` (the
    output was cut, or the model never closed it) everything is reasoning.
  * ``qwen3``: the output is reasoning only when it starts with ``<think>`` or the prompt
    ends inside an open ``<think>`` (Qwen3.5 and the Thinking-2507 templates write it into
    the prompt); otherwise (Qwen3 Instruct-2507, Qwen2.5, or ``enable_thinking: false``)
    all of it is content. Once open, the same split as ``deepseek_r1``: no ``</think>``
    means the reasoning was cut, and everything is reasoning (vLLM's current parser; its
    2025 versions answered all-content there, which a stream that has already sent
    reasoning deltas cannot honour).
  * Both: a prompt that ends with ``</think>`` (a template that closed the reasoning for
    the model, as Qwen3's does for ``enable_thinking: false``) means the output is all
    content (vLLM's ``prompt_is_reasoning_end``). Only the prompt's end is read, so an
    earlier assistant turn's ``</think>`` does not count.
Text is split as is: the whitespace a model writes around the markers stays in the
reasoning and the content, as vLLM returns it. Empty parts are None.

Streaming holds back only what may still change class: a tail of the reasoning that may
be the start of ``</think>`` (so a marker split over two tokens is never shown), and, for
``qwen3``, a start that may still become ``<think>``. Concatenated deltas equal the
whole-text split.
"""
from __future__ import annotations

import re

START, END = "<think>", "</think>"
PARSERS = ("deepseek_r1", "qwen3")

PROMPT_TAIL_TOKENS = 16  # of a token-id prompt, the end decoded for `ReasoningParser.start_mode`
REASONING, MAYBE, CONTENT = "reasoning", "maybe", "content"  # the mode an output starts in
MODES = (REASONING, MAYBE, CONTENT)


def get_parser(name: str | None) -> "ReasoningParser | None":
    """The parser called ``name`` (None for None).

    Raises:
      ValueError: an unknown name.
    """
    if name is None:
        return None
    if name not in PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}; choose from {', '.join(PARSERS)}")
    return ReasoningParser(name)


class ReasoningParser:
    """One reasoning convention (``name`` in `PARSERS`). Stateless; see `ReasoningStream`
    for a stream's state."""

    def __init__(self, name: str):
        if name not in PARSERS:
            raise ValueError(f"unknown reasoning parser {name!r}; choose from {', '.join(PARSERS)}")
        self.name = name

    def start_mode(self, prompt_text: str | None, chat_template_kwargs: dict | None = None) -> str:
        """The mode the output starts in: `REASONING` (inside ``<think>``), `MAYBE`
        (``qwen3``: reasoning only if the output opens ``<think>``) or `CONTENT`.

        Args:
          prompt_text: the prompt as the model reads it (special tokens kept), or only its
            end; None when unknown (token-id prompts without a tokenizer).
          chat_template_kwargs: the request's; ``enable_thinking: false`` makes ``qwen3``
            output all content.
        """
        if self.name == "qwen3" and (chat_template_kwargs or {}).get("enable_thinking") is False:
            return CONTENT
        tail = (prompt_text or "").rstrip()
        if tail.endswith(END):
            return CONTENT
        if tail.endswith(START):
            return REASONING
        return REASONING if self.name == "deepseek_r1" else MAYBE

    def split(self, text: str, mode: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of a finished output; an empty part is None."""
        reasoning, content = self._split(text, mode, final=True)
        return reasoning or None, content or None

    def partial(self, text: str, mode: str) -> tuple[str, str]:
        """(reasoning, content) of an unfinished output, without what may still change
        class; each is a prefix of what `split` gives once the output is complete."""
        return self._split(text, mode, final=False)

    def _split(self, text: str, mode: str, final: bool) -> tuple[str, str]:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == CONTENT:
            return "", text
        stripped = text.lstrip()
        if not final and stripped != START and START.startswith(stripped):
            return "", ""  # "" or "<thi": may still open the reasoning
        opened = stripped.startswith(START)
        if mode == MAYBE and not opened:
            return "", text
        body = stripped[len(START):] if opened else text
        reasoning, end, content = body.partition(END)
        if end or final:
            return reasoning, content
        return reasoning[:len(reasoning) - _end_prefix_len(reasoning)], ""


def _end_prefix_len(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``</think>``."""
    for k in range(min(len(END) - 1, len(text)), 0, -1):
        if text.endswith(END[:k]):
            return k
    return 0


class ReasoningStream:
    """The incremental split of one output: each `update` with the output's text so far
    (it only grows) returns what the reasoning and the content gained since the last call.

    Args:
      parser: the `ReasoningParser`.
      mode: the mode the output starts in (`ReasoningParser.start_mode`).
    """

    def __init__(self, parser: ReasoningParser, mode: str):
        self.parser = parser
        self.mode = mode
        self.reasoning = ""  # sent so far
        self.content = ""

    def update(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning delta, content delta) for the output text ``text``; ``final``: the
        output is complete (nothing is held back any more)."""
        if final:
            reasoning, content = (p or "" for p in self.parser.split(text, self.mode))
        else:
            reasoning, content = self.parser.partial(text, self.mode)
        dr = reasoning[len(self.reasoning):] if reasoning.startswith(self.reasoning) else ""
        dc = content[len(self.content):] if content.startswith(self.content) else ""
        self.reasoning += dr
        self.content += dc
        return dr, dc

    @property
    def in_content(self) -> bool:
        """Whether the reasoning has ended (what follows is content)."""
        return self.content != "" or self.mode == CONTENT


def grammar_prefix(mode: str, answer: str) -> str | None:
    """A Lark grammar (llguidance dialect) that admits the reasoning of an output that
    starts in ``mode``, then the grammar named ``answer`` (``@answer``); None for `CONTENT`
    (the constraint applies from the first token).

    The reasoning and its ``</think>`` are one lexeme (any text whose only ``</think>`` is
    at its end): llguidance's lexer does not backtrack, so a separate ``"</think>"``
    terminal after a free-text one would never match.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == CONTENT:
        return None
    end = _lark_regex(END)
    think = f"/(?s:.*){end}/ & ~/(?s:.*{end}.+)/"
    if mode == MAYBE:
        think = f"/{_lark_regex(START)}(?s:.*){end}/ & ~/(?s:.*{end}.+)/"
        return f"start: REASONING? @{answer}\nREASONING: {think}\n"
    return f"start: REASONING @{answer}\nREASONING: {think}\n"


def _lark_regex(literal: str) -> str:
    """``literal`` as a regex inside Lark's ``/.../`` delimiters."""
    return re.escape(literal).replace("/", "\\/")
