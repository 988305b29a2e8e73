"""Engine logprobs (per token ``{token_id: Logprob}``) in OpenAI's two response formats.

* Completions (legacy): parallel lists ``tokens``, ``token_logprobs``, ``top_logprobs``
  (a dict of the sampled token plus the top ``logprobs`` alternatives) and ``text_offset``.
  With ``echo``, the prompt's tokens come first (`echo_logprobs`, from the engine's prompt
  logprobs), the first with null ``token_logprobs`` and ``top_logprobs`` (nothing precedes it).
* Chat: ``content`` = one item per token with ``token``, ``logprob``, ``bytes`` and
  ``top_logprobs`` (exactly the top ``top_logprobs`` alternatives, sorted descending).
Both format a slice of tokens so a stream sends each token's logprobs once (SC-27).
"""
from __future__ import annotations

import codecs
import functools

from jaxinfer.entrypoints.openai.protocol import ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob
from jaxinfer.outputs import Logprob

MIN_LOGPROB = -9999.0


class TextOffsets:
    """Character offsets of successive tokens in the text they decode to (``text_offset``).

    A byte-level BPE token may hold part of a character (an emoji's first two bytes); its
    own text is then a replacement character, but it adds no character to the text. So the
    offset advances by the characters that the token's UTF-8 bytes (`token_bytes`) complete,
    through an incremental decoder that keeps a character's leading bytes until its last one
    arrives. Offsets never run past the decoded text. One instance per choice, carried
    across the chunks of a stream.
    """

    def __init__(self, start: int = 0):
        self.offset = start
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def advance(self, tokenizer, token_id: int, text: str) -> int:
        """The offset of this token (characters before it); then moves past it."""
        at = self.offset
        self.offset += len(self._decoder.decode(bytes(token_bytes(tokenizer, token_id, text))))
        return at


def completion_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]],
                        offsets: TextOffsets | None = None, tokenizer=None) -> CompletionLogprobs:
    """Legacy format for ``token_ids`` (a slice of the output) and their ``entries``.

    Args:
      offsets: the choice's `TextOffsets` (a stream's, advanced here); None: from 0.
      tokenizer: gives each token's bytes (`token_bytes`); None: the bytes of its text.
    """
    offsets = offsets if offsets is not None else TextOffsets()
    out = CompletionLogprobs()
    for tok, entry in zip(token_ids, entries):
        chosen = entry[tok]
        text = _text(chosen, tok)
        out.tokens.append(text)
        out.token_logprobs.append(_finite(chosen.logprob))
        out.top_logprobs.append({_text(lp, t): _finite(lp.logprob) for t, lp in entry.items()})
        out.text_offset.append(offsets.advance(tokenizer, tok, text))
    return out


def echo_logprobs(prompt_ids: list[int], entries: list[dict[int, Logprob] | None], tokenizer,
                  completion: CompletionLogprobs) -> CompletionLogprobs:
    """Legacy format of an echoed prompt followed by its completion's ``completion`` logprobs.

    Args:
      prompt_ids: the prompt's token ids.
      entries: the prompt logprobs, one per prompt token (`jaxinfer.outputs.RequestOutput.prompt_logprobs`);
        None entries (position 0) give null ``token_logprobs`` / ``top_logprobs``, their text
        decoded here.
      completion: the completion's logprobs, offsets counted from 0 (shifted after the prompt here).
    """
    out = CompletionLogprobs()
    offsets = TextOffsets()
    for tok, entry in zip(prompt_ids, entries):
        if entry is None:
            text = tokenizer.decode([tok], skip_special_tokens=False) if tokenizer is not None else f"<{tok}>"
            out.tokens.append(text)
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            out.text_offset.append(offsets.advance(tokenizer, tok, text))
        else:
            one = completion_logprobs([tok], [entry], offsets, tokenizer)
            for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                getattr(out, name).extend(getattr(one, name))
    out.tokens += completion.tokens
    out.token_logprobs += completion.token_logprobs
    out.top_logprobs += completion.top_logprobs
    out.text_offset += [offsets.offset + t for t in completion.text_offset]
    return out


def chat_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], num_top: int, tokenizer
                  ) -> ChatLogprobs:
    """Chat format: each token with its ``num_top`` best alternatives (best first)."""
    content = []
    for tok, entry in zip(token_ids, entries):
        top = sorted(((t, x) for t, x in entry.items() if x.rank is not None and x.rank <= num_top),
                     key=lambda item: -item[1].logprob)[:num_top]
        item = _top_item(tokenizer, tok, entry[tok])
        content.append(TokenLogprob(**item.model_dump(), top_logprobs=[_top_item(tokenizer, t, x) for t, x in top]))
    return ChatLogprobs(content=content)


def _top_item(tokenizer, token_id: int, x: Logprob) -> TopLogprob:
    text = _text(x, token_id)
    return TopLogprob(token=text, logprob=_finite(x.logprob), bytes=token_bytes(tokenizer, token_id, text))


def token_bytes(tokenizer, token_id: int, text: str) -> list[int]:
    """The UTF-8 bytes of one token (exact for byte-level BPE vocabularies, where a token
    may hold part of a character; else the bytes of its decoded text)."""
    if tokenizer is not None:
        piece = tokenizer.convert_ids_to_tokens([token_id])[0]
        decoder = _byte_decoder()
        if piece and all(c in decoder for c in piece):
            return [decoder[c] for c in piece]
    return list(text.encode("utf-8"))


def _finite(x: float) -> float:
    """JSON has no -inf: impossible tokens report -9999.0 (as vLLM does)."""
    return x if x > MIN_LOGPROB else MIN_LOGPROB


def _text(lp: Logprob, token_id: int) -> str:
    return lp.decoded_token if lp.decoded_token is not None else f"<{token_id}>"


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-printable-character table (byte-level BPE)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}
