"""Graceful degradation: which model answers a new request.

With ``--fallback-model F`` and ``--degrade-ttft-slo S``, a request for model M (not F)
goes to F instead when its estimated time to first token on M exceeds S seconds
(`jaxinfer.ttft_estimator.TTFTEstimator`: prefill tokens ahead of it / M's measured
prefill rate), rather than waiting in M's queue or getting a 429 there; a request that
would find M's waiting queue full (a 429 at once) counts as over the SLO. It stays on M
when any of these holds:

* the request says ``"allow_fallback": false``;
* M has no measured rate yet (no estimate), or the estimate is within S;
* the request is a chat request and F has no chat template;
* F is not ready (warming up, draining, dead).

The answer's ``model`` field and its ``x-jaxinfer-served-by`` header name the model that
answered; ``jaxinfer_requests_degraded_total`` counts the moves.
"""
from __future__ import annotations

from jaxinfer.api.model_registry import ModelRegistry, ServedModel

SERVED_BY_HEADER = "x-jaxinfer-served-by"


def choose(registry: ModelRegistry, requested: ServedModel, prompt_tokens: int, num_sequences: int, *,
           allow_fallback: bool, chat: bool) -> ServedModel:
    """The model that should answer.

    Args:
      registry: the served models (its ``fallback`` and ``degrade_ttft_slo``).
      requested: the model the request named.
      prompt_tokens: the request's prompt tokens on ``requested`` (summed over its
        prompts and ``n`` choices: what it adds to the queue).
      num_sequences: the engine requests it adds (prompts x ``n``).
      allow_fallback: the request's opt-out (False: never degrade).
      chat: a chat request (needs a fallback with a chat template).
    Returns:
      ``requested``, or the fallback model.
    """
    slo = registry.degrade_ttft_slo
    if registry.fallback is None or slo is None or not allow_fallback:
        return requested
    fallback = registry.models[registry.fallback]
    if fallback is requested or not fallback.async_engine.is_healthy:
        return requested
    if chat and not fallback.has_chat_template:
        return requested
    if _queue_full(requested, num_sequences):
        return fallback
    estimate = requested.async_engine.ttft.estimate(prompt_tokens)
    if estimate is None or estimate <= slo:
        return requested
    return fallback


def _queue_full(model: ServedModel, num_sequences: int) -> bool:
    """True when ``num_sequences`` more would not fit ``model``'s waiting queue now (the
    check `AsyncEngine` makes on add, read here from another thread: a hint)."""
    engine = model.async_engine.engine
    return engine is not None and engine.num_waiting + num_sequences > engine.config.scheduler.max_queue_len
