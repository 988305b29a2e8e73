"""Graceful degradation: which model answers a new request.

With ``--fallback-model F`` and ``--degrade-ttft-slo S``, a request for model M (not F)
goes to F instead when its estimated time to first token on M exceeds S seconds
(`jaxinfer.engine.ttft_estimator.TTFTEstimator`: the wait for a sequence slot, plus prefill
tokens ahead of it / M's measured prefill rate), rather than waiting in M's queue or
getting a 429 there; a request that M refuses because its waiting queue is full goes to
F too (the serving layer asks `fallback_for` then), and one that F refuses because its
queue is full goes back to M's queue (a fallback never turns away what M alone would
have queued). It stays on M when any of these holds:

* the request says ``"allow_fallback": false``;
* M has no measured rate yet (no estimate), or the estimate is within S;
* F's own estimate for the request is no better than M's (F is as congested);
* the request is a chat request and F has no chat template;
* F is not ready (warming up, draining, dead).

The answer's ``model`` field and its ``x-jaxinfer-served-by`` header name the model that
answered; ``jaxinfer_requests_degraded_total`` counts the requests F answered for M.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from jaxinfer.entrypoints.openai.model_registry import ModelRegistry, ServedModel

SERVED_BY_HEADER = "x-jaxinfer-served-by"


def fallback_for(registry: ModelRegistry, requested: ServedModel, *, allow_fallback: bool,
                 chat: bool) -> ServedModel | None:
    """The model a request for ``requested`` may move to, or None: no fallback or SLO
    configured, the request opted out, it already is on the fallback, the fallback is not
    ready, or a chat request and a fallback without a chat template."""
    if registry.fallback is None or registry.degrade_ttft_slo is None or not allow_fallback:
        return None
    fallback = registry.models[registry.fallback]
    if fallback is requested or not fallback.async_engine.is_healthy:
        return None
    if chat and not fallback.has_chat_template:
        return None
    return fallback


def choose(registry: ModelRegistry, requested: ServedModel, prompt_tokens: int, *, allow_fallback: bool,
           chat: bool) -> ServedModel:
    """The model that should answer.

    Args:
      registry: the served models (its ``fallback`` and ``degrade_ttft_slo``).
      requested: the model the request named.
      prompt_tokens: the request's prompt tokens on ``requested`` (summed over its
        prompts and ``n`` choices: what it adds to the queue).
      allow_fallback: the request's opt-out (False: never degrade).
      chat: a chat request (needs a fallback with a chat template).
    Returns:
      ``requested``, or the fallback model (`fallback_for`) when the estimate exceeds the
      SLO and the fallback's own estimate is lower (or not measured yet).
    """
    fallback = fallback_for(registry, requested, allow_fallback=allow_fallback, chat=chat)
    if fallback is None:
        return requested
    estimate = requested.async_engine.ttft.estimate(prompt_tokens)
    if estimate is None or estimate <= registry.degrade_ttft_slo:
        return requested
    there = fallback.async_engine.ttft.estimate(prompt_tokens)  # its tokenizer may count otherwise: near enough
    return fallback if there is None or there < estimate else requested


@contextlib.contextmanager
def holding(model: ServedModel, key: str, prompt_tokens: int, max_tokens: int | None) -> Iterator[None]:
    """Count a request that is moving to ``model`` in that model's estimate (under
    ``key``, with ``prompt_tokens`` prompt tokens and at most ``max_tokens`` output tokens)
    for the duration of the block: while the request is prepared for it, before the
    engine is handed the real thing."""
    ttft = model.async_engine.ttft
    ttft.on_handed(key, prompt_tokens, max_tokens)
    try:
        yield
    finally:
        ttft.on_dropped(key)
