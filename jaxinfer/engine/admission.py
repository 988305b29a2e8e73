"""Admission checks: what `LLMEngine.check_requests` asks of a group before queueing any of it.

Owns `check_ids` (duplicate ids), `check_prompt` (one prompt and its sampling options
against the model and the KV pool), `check_pooling_prompt` (the same for a pooling request) and `check_room` (the group size, room in the waiting
queue), in the order `LLMEngine.check_requests` calls them; and `check_wait`, the HTTP
layer's queue-wait bound (``--max-queue-wait``) on the estimated wait for a sequence slot,
asked before a group is handed to the engine.
Host only, no device work; every refusal is a `jaxinfer.errors.RequestError` (400) or a
`QueueFullError` (429 with Retry-After), raised before anything is queued, so a group is
admitted all or none (vLLM's ``_validate_model_inputs`` and the OpenAI API's
``context_length_exceeded`` follow the same lines).
"""
from __future__ import annotations

import collections
from typing import Callable, Sequence

import numpy as np

from jaxinfer.core.kv_cache.block_manager import BlockManager
from jaxinfer.config import EngineConfig
from jaxinfer.engine.protocol import RequestSpec
from jaxinfer.errors import CONTEXT_LENGTH_EXCEEDED, SHORTEN_HINT, QueueFullError, RequestError
from jaxinfer.pooling_params import PoolingParams
from jaxinfer.sampling_params import SamplingParams


def check_ids(specs: Sequence[RequestSpec], known_ids) -> None:
    """Refuse a group that repeats an id, or reuses one the engine holds (``known_ids``).

    Raises:
      RequestError: a duplicate id (param ``request_id``).
    """
    ids = [s.request_id for s in specs]
    counts = collections.Counter(ids)  # not ids.count per id: quadratic in the group size
    for rid in ids:
        if rid in known_ids or counts[rid] > 1:
            raise RequestError(f"duplicate request id {rid!r}", param="request_id")


def check_room(group_size: int, *, max_queue_len: int, num_waiting: int, free_slots: int,
               retry_after: Callable[[], float]) -> None:
    """Refuse a group that could never be queued at once, or has no room in the queue now.

    Args:
      group_size: sequences in the group (a request's prompts x ``n``).
      max_queue_len: ``--max-queue-len``: requests that may wait beyond the free sequence slots.
      num_waiting: requests waiting now; free_slots: sequence slots free now
        (`jaxinfer.core.sched.scheduler.Scheduler.free_slots`).
      retry_after: seconds until the queue drains, called only when refusing with 429.
    Raises:
      RequestError: more sequences than ``max_queue_len`` (param ``n``; retrying cannot help).
      QueueFullError: the waiting queue has no room for the whole group now.
    """
    if group_size > max_queue_len:
        raise RequestError(f"this request asks for {group_size} sequences (prompts x n); the server queues "
                           f"at most {max_queue_len} (--max-queue-len)", param="n")
    if num_waiting + group_size - free_slots > max_queue_len:  # the queue is what waits beyond free slots
        raise QueueFullError(f"waiting queue is full ({max_queue_len} requests)", retry_after=retry_after())


def check_pooling_prompt(ids: list[int], pooling: PoolingParams, *, vocab_size: int, hidden_size: int,
                         config: EngineConfig, block_manager: BlockManager) -> int:
    """Check the prompt of a pooling request (prefill only); returns its ``max_tokens``: 0.

    Its whole prompt is computed (in chunks of at most ``max_num_batched_tokens`` tokens), so
    it may fill ``max_model_len`` (no token is generated) and must fit the KV pool.

    Raises:
      RequestError: empty prompt, ids outside the vocabulary, more than ``max_model_len``
        tokens or than the whole pool holds (code ``context_length_exceeded``), ``dimensions``
        over the hidden size.
    """
    limit = config.scheduler.max_model_len
    _check_ids(ids, vocab_size)
    if len(ids) > limit:
        raise RequestError(f"input has {len(ids)} tokens; the limit is {limit} (max_model_len); {SHORTEN_HINT}",
                           param="input", code=CONTEXT_LENGTH_EXCEEDED)
    need = block_manager.blocks_needed(len(ids))
    if need > block_manager.num_usable_blocks:
        raise RequestError(f"input needs {need} KV blocks; the whole pool has {block_manager.num_usable_blocks}: "
                           f"it can never fit; {SHORTEN_HINT}", param="input", code=CONTEXT_LENGTH_EXCEEDED)
    pooling.check(hidden_size)
    return 0


def _check_ids(ids: list[int], vocab_size: int) -> None:
    if len(ids) == 0:
        raise RequestError("the prompt is empty (0 tokens)", param="prompt")
    if any(not isinstance(t, (int, np.integer)) or isinstance(t, bool) or not 0 <= t < vocab_size for t in ids):
        raise RequestError(f"prompt token ids must be integers in [0, {vocab_size})", param="prompt")


def check_prompt(ids: list[int], params: SamplingParams, *, vocab_size: int, config: EngineConfig,
                 block_manager: BlockManager, grammar_engine: Callable[[], object]) -> int:
    """Check one prompt and its options; returns the effective ``max_tokens``.

    Unset ``max_tokens`` means as many as the context and the whole KV pool allow.

    Args:
      ids: prompt token ids; params: its sampling options.
      vocab_size: the model's vocabulary size V (ids must lie in [0, V)).
      config: the engine configuration (``max_model_len``, logit-bias and logprobs limits).
      block_manager: the KV pool (its usable blocks bound prompt + max_tokens).
      grammar_engine: returns the `jaxinfer.structured_outputs.grammar.GrammarEngine`; a structured-output
        request compiles its grammar here (then cached), so a bad grammar is refused at entry.
    Raises:
      RequestError: empty prompt, ids outside the vocabulary, prompt or prompt + max_tokens
        over ``max_model_len`` or the whole pool (code ``context_length_exceeded``), bad
        token ids in the options, a bad grammar, too many logit_bias entries or logprobs.
    """
    limit = config.scheduler.max_model_len
    _check_ids(ids, vocab_size)
    if len(ids) >= limit:
        raise RequestError(f"prompt has {len(ids)} tokens; the limit is {limit - 1} "
                           f"(max_model_len {limit}, at least one token must be generated); {SHORTEN_HINT}",
                           param="prompt", code=CONTEXT_LENGTH_EXCEEDED)
    max_tokens = _max_tokens(len(ids), params, limit, block_manager)
    params.check_token_ids(vocab_size)
    if params.structured_outputs is not None:
        grammar_engine().matcher(params.structured_outputs)
    if len(params.logit_bias) > config.max_logit_bias:
        raise RequestError(f"at most {config.max_logit_bias} logit_bias entries", param="logit_bias")
    for name in ("logprobs", "prompt_logprobs"):
        if getattr(params, name) is not None and getattr(params, name) > config.max_logprobs:
            raise RequestError(f"{name} must be <= {config.max_logprobs}", param=name)
    return max_tokens


def _max_tokens(prompt_len: int, params: SamplingParams, limit: int, block_manager: BlockManager) -> int:
    """The effective max_tokens of a prompt of ``prompt_len`` tokens (`check_prompt`)."""
    pool_tokens = block_manager.num_usable_blocks * block_manager.block_size
    if params.max_tokens is None:  # unset: as much as the context and the whole pool allow
        max_tokens = min(limit, pool_tokens) - prompt_len
        if max_tokens < 1:
            raise RequestError(f"prompt has {prompt_len} tokens; the KV pool holds {pool_tokens} tokens in all, "
                               f"leaving no room to generate; {SHORTEN_HINT}", param="prompt",
                               code=CONTEXT_LENGTH_EXCEEDED)
    else:
        max_tokens = params.max_tokens
    if prompt_len + max_tokens > limit:
        raise RequestError(f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) = {prompt_len + max_tokens} "
                           f"exceeds max_model_len ({limit}); lower max_tokens or {SHORTEN_HINT}",
                           param="max_tokens", code=CONTEXT_LENGTH_EXCEEDED)
    need = block_manager.blocks_needed(prompt_len + max_tokens)
    if need > block_manager.num_usable_blocks:
        raise RequestError(f"prompt + max_tokens needs {need} KV blocks; the whole pool has "
                           f"{block_manager.num_usable_blocks}: it can never fit; lower max_tokens or "
                           f"{SHORTEN_HINT}", param="max_tokens", code=CONTEXT_LENGTH_EXCEEDED)
    return max_tokens


def check_wait(estimate: float | None, bound: float | None, *, max_retry_after: float = 300.0) -> None:
    """Refuse a group at once when its estimated wait for a sequence slot exceeds the bound.

    A burst that will drain within ``bound`` is queued; a flood that will not is refused
    now, not after waiting ``bound`` seconds (docs/api.md, "Admission").

    Args:
      estimate: seconds until the group's last sequence would get a slot
        (`jaxinfer.engine.ttft_estimator.TTFTEstimator.queue_wait`), or None when unknown (no
        full-batch step measured yet): then it is queued, bounded by ``--max-queue-len``.
      bound: ``--max-queue-wait`` in seconds, or None (no bound).
      max_retry_after: cap on the suggested wait (seconds).
    Raises:
      QueueFullError: the estimate exceeds the bound; ``retry_after`` is the estimate
        (capped at ``max_retry_after``): when the requests ahead will have their slots.
    """
    if estimate is None or bound is None or estimate <= bound:
        return
    shown = "more than an hour" if estimate > 3600 else f"{estimate:.0f} s"
    raise QueueFullError(f"the server is overloaded: the estimated wait for a sequence slot is {shown}, over "
                         f"the {bound:g} s bound (--max-queue-wait)", retry_after=min(estimate, max_retry_after))
