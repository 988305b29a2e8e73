"""Host-side text <-> token ids: the tokenizer wrapper and the streaming detokenizer.

Owns `Tokenizer` (a thin wrapper over a local transformers fast tokenizer: encode, decode,
chat templates) and `IncrementalDetokenizer` (turns generated ids into text that is safe to
stream, and applies stop strings). Sits at both ends of the pipeline: HTTP ->
``Tokenizer.encode`` -> engine -> ``IncrementalDetokenizer.step`` -> SSE.

Plain Python: this module must not import jax (a test checks it).
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Sequence

REPLACEMENT_CHAR = "\ufffd"  # what a decoder yields for an incomplete UTF-8 sequence
PROMPT_CONTEXT_TOKENS = 5  # prompt tokens decoded as left context (vLLM INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET)


class Tokenizer:
    """A model's tokenizer and chat template (``tokenizer.json`` & co. in a model folder).

    Attributes:
      vocab_size: number of tokens the tokenizer knows (may be below the model's vocab).
      bos_token_id, eos_token_id: the tokenizer's BOS/EOS ids (None if it has none). The
        engine's full EOS set also comes from ``generation_config.json`` (SC-13).
      all_special_ids: ids skipped by ``decode(..., skip_special_tokens=True)``: the
        declared special tokens plus every added token marked special.
      add_bos_token: whether ``encode(text)`` prepends BOS (measured, not read from config).
    """

    def __init__(self, hf_tokenizer: Any):
        self._tok = hf_tokenizer
        self.vocab_size: int = len(hf_tokenizer)
        self.bos_token_id: int | None = hf_tokenizer.bos_token_id
        self.eos_token_id: int | None = hf_tokenizer.eos_token_id
        added = getattr(hf_tokenizer, "added_tokens_decoder", {}) or {}
        self.all_special_ids: set[int] = set(hf_tokenizer.all_special_ids) | {
            i for i, t in added.items() if getattr(t, "special", False)}
        self.add_bos_token: bool = self._measure_add_bos()

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        """Load the fast tokenizer saved in ``path`` (no network).

        Raises:
          OSError: no tokenizer files in ``path``.
          ValueError: only a slow (Python) tokenizer is available.
        """
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True, use_fast=True)
        if not getattr(tok, "is_fast", False):
            raise ValueError(f"{path}: no fast tokenizer (tokenizer.json) found")
        return cls(tok)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special-token strings in it (``<|im_start|>``) map to their ids.

        ``add_special_tokens`` adds what the tokenizer's post-processor adds (BOS when
        `add_bos_token`).
        """
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of ``text`` with special-token strings in it encoded as ordinary text
        (no special tokens added either): for user-written message contents."""
        return list(self._tok.encode(text, add_special_tokens=False, split_special_tokens=True))

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """``encode(text, add_special_tokens=False)`` and each token's character span in ``text``."""
        enc = self._tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (no clean-up of tokenization spaces, so decoding is concatenative)."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens,
                                clean_up_tokenization_spaces=False)

    @property
    def chat_template(self) -> str | None:
        """The chat template's Jinja text (None when the tokenizer has none)."""
        return getattr(self._tok, "chat_template", None) or None

    @property
    def has_chat_template(self) -> bool:
        """Whether the tokenizer carries a chat template."""
        return self.chat_template is not None

    def with_chat_template(self, template: str) -> "Tokenizer":
        """A tokenizer like this one whose chat template is ``template`` (Jinja text, e.g. from
        `jaxinfer.tokenizer.templates.load_chat_template`), replacing its own if any (vLLM's
        ``--chat-template``). This one is left unchanged; the vocabulary is shared, not copied.

        Raises:
          ValueError: empty template text.
        """
        if not template or not template.strip():
            raise ValueError("the chat template is empty")
        hf = copy.copy(self._tok)  # shallow: the Rust tokenizer is shared, the template attribute is not
        hf.chat_template = template
        return Tokenizer(hf)

    def template_takes_tools(self) -> bool:
        """Whether the chat template renders a ``tools`` list itself (it names ``tools``)."""
        return self.has_chat_template and "tools" in str(self._tok.chat_template)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    continue_final_message: bool = False, tools: list[dict] | None = None,
                    chat_template_kwargs: dict[str, Any] | None = None) -> str:
        """Render ``messages`` with the chat template (transformers ``apply_chat_template``).

        Args:
          messages: ``[{"role": ..., "content": ...}, ...]``.
          add_generation_prompt: end with the assistant header (ignored when continuing).
          continue_final_message: leave the last (assistant) message open so the model
            continues it; then no generation prompt is added.
          tools: OpenAI tool definitions, for templates that render them (`template_takes_tools`).
          chat_template_kwargs: more variables for the template (``enable_thinking``); their
            names must not be the arguments above (`jaxinfer.tokenizer.chat` checks that).
        Raises:
          ValueError: the tokenizer has no chat template, or the template rejects the messages.
        """
        if not self.has_chat_template:
            raise ValueError("this model's tokenizer has no chat template")
        return self._tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message, **(chat_template_kwargs or {}),
            **({"tools": tools} if tools else {}))

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            continue_final_message: bool = False) -> list[int]:
        """Prompt ids of a chat: `render_chat`, then `encode` without added special tokens.

        A template that writes BOS itself thus yields exactly one BOS (serving case SC-23);
        this is also how transformers tokenizes chats.
        """
        text = self.render_chat(messages, add_generation_prompt, continue_final_message)
        return self.encode(text, add_special_tokens=False)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary strings of ``ids`` (byte-level forms, e.g. ``'ĠParis'``)."""
        return list(self._tok.convert_ids_to_tokens(list(ids)))

    def template_ignores_generation_prompt(self) -> bool:
        """True when the chat template renders the same with and without the generation prompt.

        Such a template never writes the assistant header, so chat outputs go wrong; the
        server warns at start-up (serving case SC-24). False when there is no template.
        """
        if not self.has_chat_template:
            return False
        msgs = [{"role": "user", "content": "Hi"}]
        return self.render_chat(msgs, add_generation_prompt=True) == self.render_chat(msgs, add_generation_prompt=False)

    def _measure_add_bos(self) -> bool:
        if self.bos_token_id is None:
            return False
        with_special = self.encode("a", add_special_tokens=True)
        return with_special[:1] == [self.bos_token_id] and self.encode("a", add_special_tokens=False)[:1] != [
            self.bos_token_id]


class IncrementalDetokenizer:
    """Streaming detokenizer (vLLM/TGI prefix_offset/read_offset scheme) with stop strings.

    Keeps the ids (a few prompt tokens as left context, then the generated ones) and two
    offsets: text is decoded from ``prefix_offset``; the part beyond ``decode(ids[prefix:read])``
    is new. New text whose decode ends in U+FFFD (a UTF-8 sequence not complete yet) waits
    for the next token. Stop strings are searched in the decoded output; the longest tail of
    the output that could still grow into a stop string is held back from `text`.

    Invariant (tested): the growth of `text` over the steps, then `flush`, concatenates to
    ``decode(generated_ids)`` cut at the first stop string to complete (exact for byte-level
    BPE tokenizers such as SmolLM2's; for SentencePiece tokenizers the prompt context keeps
    the first token's leading space, as vLLM does), and `text` never shrinks.

    Args:
      tokenizer: a `Tokenizer`.
      prompt_token_ids: the prompt; its last few ids give the left context.
      skip_special_tokens: drop special tokens from the text.
      stop: stop strings (empty strings are ignored).
      include_stop_str_in_output: keep the matched stop string at the end of the text.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], *, skip_special_tokens: bool = True,
                 stop: Sequence[str] = (), include_stop_str_in_output: bool = False):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._stop = [s for s in stop if s]
        self._include_stop = include_stop_str_in_output
        context = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        if self._decode(context).endswith(REPLACEMENT_CHAR):
            context = []  # prompt ends mid-character: no clean boundary to continue from
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self.num_generated = 0
        self._decoded = ""  # all complete output text so far (before stop truncation)
        self._emitted = 0  # len(text) while not finished
        self._final: str | None = None
        self.stop_reason: str | None = None

    @property
    def text(self) -> str:
        """Output text safe to emit so far (never shrinks)."""
        return self._final if self._final is not None else self._decoded[: self._emitted]

    @property
    def finished(self) -> bool:
        """True after a stop string matched or `flush` was called."""
        return self._final is not None

    def step(self, new_token_ids: Sequence[int]) -> str | None:
        """Append generated ids; returns the stop string that matched, else None.

        On a match `text` becomes final: cut before the stop string (or after it with
        ``include_stop_str_in_output``).

        Raises:
          RuntimeError: called after the detokenizer finished.
        """
        if self.finished:
            raise RuntimeError("step() after the detokenizer finished")
        self._ids.extend(int(t) for t in new_token_ids)
        self.num_generated += len(new_token_ids)
        self._decoded += self._new_text(final=False)
        return self._apply_stop()

    def flush(self) -> str:
        """At finish (EOS or length): release held-back text; returns the final full text."""
        if not self.finished:
            self._decoded += self._new_text(final=True)
            if self._apply_stop() is None:
                self._final = self._decoded
        return self._final

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def _new_text(self, final: bool) -> str:
        """Text added by ids past ``read_offset``; empty while it ends in a partial character."""
        prefix_text = self._decode(self._ids[self._prefix_offset: self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        if len(new_text) <= len(prefix_text) or (new_text.endswith(REPLACEMENT_CHAR) and not final):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return new_text[len(prefix_text):]

    def _apply_stop(self) -> str | None:
        """Finish on the first stop string to complete; else move the emit boundary."""
        if not self._stop:
            self._emitted = len(self._decoded)
            return None
        match = self._first_stop(start=self._emitted)
        if match is not None:
            idx, stop = match
            self._final = self._decoded[: idx + len(stop) if self._include_stop else idx]
            self.stop_reason = stop
            return stop
        self._emitted = max(self._emitted, len(self._decoded) - self._partial_stop_len())
        return None

    def _first_stop(self, start: int) -> tuple[int, str] | None:
        """(index, stop) of the stop string that ends first at or after ``start`` (ties: longest)."""
        best = None
        for s in self._stop:
            i = self._decoded.find(s, start)
            if i >= 0 and (best is None or (i + len(s), i) < (best[0] + len(best[1]), best[0])):
                best = (i, s)
        return best

    def _partial_stop_len(self) -> int:
        """Length of the longest tail of the output that is a proper prefix of a stop string."""
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self._decoded)), best, -1):
                if self._decoded.endswith(s[:k]):
                    best = k
                    break
        return best
