"""Prompt logprobs on the host: which packed tokens of a step score which prompt token, and
recording what the device computed into ``Request.prompt_logprobs``.

Meaning (vLLM's ``prompt_logprobs``): for every prompt position ``p >= 1``, the logprob of
the actual prompt token ``p`` given tokens ``< p``, plus the top-k alternatives; position 0
has none (``None``). The logits at position ``j`` score token ``j + 1``, so a prefill chunk
covering positions ``[s, s + n)`` scores prompt positions ``s + 1 .. min(s + n, P - 1)``
(the last prompt position's logits are the first sampled token's, as usual). The values
come from the same paged, chunked prefill that fills the KV cache: the model step keeps
the final hidden states of every packed token, and an LM-head pass over them
(`jaxinfer.layers.sampler.prompt_logprobs`) runs only in steps where some row needs it.

Recompute after preemption scores the same positions again; positions already recorded
are skipped (targets -1), so each is recorded once. Prefix-cache hits would skip the
positions whose logits are wanted, so a request still missing prompt logprobs does not
look the cache up (`Request.needs_prompt_logprobs`; vLLM does the same): it computes its
whole prompt, and still registers its blocks for later requests.
Plain Python and numpy; no JAX import.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxinfer.outputs import Logprob
from jaxinfer.core.request import Request


def _scored_range(req: Request, n: int) -> range:
    """Positions ``j`` of this chunk (``n`` tokens from ``num_computed_tokens``) whose logits
    score a prompt token ``j + 1`` not recorded yet."""
    start = req.num_computed_tokens
    recorded = max(1, len(req.prompt_logprobs))  # entries so far, position 0 (None) included
    return range(max(start, recorded - 1), min(start + n, req.num_prompt_tokens - 1))


def step_targets(scheduled: Sequence[tuple[Request, int]], num_tokens: int) -> np.ndarray | None:
    """Targets of one packed step for `jaxinfer.layers.sampler.prompt_logprobs`.

    Args:
      scheduled: (request, new tokens) in batch order, before the step runs.
      num_tokens: the bucket's token count T.

    Returns:
      [T] int32: at each packed token whose logits score a prompt token still unrecorded,
      that token's id; -1 elsewhere. None when no row needs any (the step skips the pass).
    """
    targets = None
    offset = 0
    for req, n in scheduled:
        if req.needs_prompt_logprobs:
            js = _scored_range(req, n)
            if len(js):
                if targets is None:
                    targets = np.full(num_tokens, -1, np.int32)
                start = req.num_computed_tokens
                targets[offset + js.start - start:offset + js.stop - start] = req.prompt_token_ids[js.start + 1:js.stop + 1]
        offset += n
    return targets


def token_entry(token: int, logprob: float, rank: int, top_ids: np.ndarray, top_logprobs: np.ndarray, num_top: int,
                tokenizer=None) -> dict[int, Logprob]:
    """``{token_id: Logprob}`` for one position: ``token`` (with its rank) then the first
    ``num_top`` of ``top_ids`` / ``top_logprobs`` (best first, 1-based ranks), skipping -inf
    ones (tokens a mask forbade); texts decoded when a tokenizer is given."""
    entry = {token: Logprob(float(logprob), int(rank))}
    for j in range(num_top):
        t = int(top_ids[j])
        if t not in entry and np.isfinite(top_logprobs[j]):
            entry[t] = Logprob(float(top_logprobs[j]), j + 1)
    if tokenizer is not None:
        for t, lp in entry.items():
            lp.decoded_token = tokenizer.decode([t], skip_special_tokens=False)
    return entry


def record(req: Request, result: dict, offset: int, n: int, tokenizer=None) -> None:
    """Append the prompt logprobs this step computed for ``req`` (its ``n`` tokens start at
    packed index ``offset``; call before ``num_computed_tokens`` advances).

    ``result`` holds ``prompt_logprob [T]``, ``prompt_rank [T]``, ``prompt_top_ids [T, N]``
    and ``prompt_top_logprobs [T, N]`` (`jaxinfer.runner.model_runner.ModelRunner.execute`).
    """
    if not req.needs_prompt_logprobs:
        return
    if not req.prompt_logprobs:
        req.prompt_logprobs.append(None)  # position 0: nothing before it
    start = req.num_computed_tokens
    for j in _scored_range(req, n):
        k = offset + j - start
        req.prompt_logprobs.append(token_entry(
            req.prompt_token_ids[j + 1], result["prompt_logprob"][k], result["prompt_rank"][k],
            result["prompt_top_ids"][k], result["prompt_top_logprobs"][k], req.params.prompt_logprobs, tokenizer))
