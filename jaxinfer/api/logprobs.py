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

import functools

from jaxinfer.api.protocol import ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob
from jaxinfer.outputs import Logprob

MIN_LOGPROB = -9999.0


def completion_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], text_offset: int = 0
                        ) -> CompletionLogprobs:
    """Legacy format for ``token_ids`` (a slice of the output) and their ``entries``.

    Args:
      text_offset: character offset of the first token in the generated text.
    """
    out = CompletionLogprobs()
    for tok, entry in zip(token_ids, entries):
        chosen = entry[tok]
        text = _text(chosen, tok)
        out.tokens.append(text)
        out.token_logprobs.append(_finite(chosen.logprob))
        out.top_logprobs.append({_text(lp, t): _finite(lp.logprob) for t, lp in entry.items()})
        out.text_offset.append(text_offset)
        text_offset += len(text)
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
    offset = 0
    for tok, entry in zip(prompt_ids, entries):
        if entry is None:
            text = tokenizer.decode([tok], skip_special_tokens=False) if tokenizer is not None else f"<{tok}>"
            out.tokens.append(text)
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            out.text_offset.append(offset)
            offset += len(text)
        else:
            one = completion_logprobs([tok], [entry], offset)
            for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                getattr(out, name).extend(getattr(one, name))
            offset = next_text_offset(one, offset)
    out.tokens += completion.tokens
    out.token_logprobs += completion.token_logprobs
    out.top_logprobs += completion.top_logprobs
    out.text_offset += [offset + t for t in completion.text_offset]
    return out


def next_text_offset(logprobs: CompletionLogprobs, start: int) -> int:
    """The offset after the tokens of ``logprobs`` (to continue a stream)."""
    return start + sum(len(t) for t in logprobs.tokens)


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
