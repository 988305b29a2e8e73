"""Per-request log lines of the server (``--disable-log-requests`` turns them off).

Logger ``jaxinfer.requests``, level INFO: one line when the engine accepts a request and
one when it ends, e.g.
``request cmpl-3f2a-0: 12 prompt tokens, max_tokens 16, temperature 0.7, top_p 1, seed None``
and ``request cmpl-3f2a-0 finished: length, 16 output tokens, 0.41 s, 2 cached prompt tokens``.
Prompt text is not logged (it may be private); only its length.
"""
from __future__ import annotations

import logging
import time

logger = logging.getLogger("jaxinfer.requests")


def log_added(request_id: str, num_prompt_tokens: int, params, pooling=None) -> None:
    """The line for an accepted request (``params``: its `SamplingParams`; ``pooling``: a pooling
    request's `jaxinfer.pooling_params.PoolingParams`, logged instead of the sampling options)."""
    if pooling is not None:
        logger.info("request %s: %d prompt tokens, pooling (dimensions %s)", request_id, num_prompt_tokens,
                    pooling.dimensions)
        return
    logger.info("request %s: %d prompt tokens, max_tokens %s, temperature %g, top_p %g, seed %s", request_id,
                num_prompt_tokens, params.max_tokens, params.temperature, params.top_p, params.seed)


def log_finished(out) -> None:
    """The line for a finished `RequestOutput` (seconds since its arrival)."""
    c = out.outputs[0] if out.outputs else None
    m = out.metrics
    took = "" if m is None else f", {(m.finished_time or time.monotonic()) - m.arrival_time:.2f} s"
    logger.info("request %s finished: %s, %d output tokens%s, %d cached prompt tokens", out.request_id,
                c.finish_reason if c else "unknown", len(c.token_ids) if c else 0, took, out.num_cached_tokens)
