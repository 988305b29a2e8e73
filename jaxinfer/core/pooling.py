"""Pooling requests on the host: which packed tokens a step pools, the running pooled state,
and the final vector.

A pooling request (``Request.pooling`` set; `jaxinfer.pooling_params.PoolingParams`) computes its
prompt only, possibly over several chunked-prefill steps, and ends in the step that computes
its last prompt token (`jaxinfer.core.sched.scheduler.Scheduler.update`). Each step that holds
one of its chunks sends the runner per-token weights (`step_weights`); the runner returns the
weighted sum of the final hidden states (after the model's final norm) per row, [R, D]
float32. ``last`` pooling weighs the last prompt token alone (present only in the final
chunk); ``mean`` weighs every prompt token by 1, and the chunks' sums add up on the host
(`record`, float64), divided by the prompt length at the end (`finalize`). A chunk that starts
at position 0 restarts the sum, so a request preempted mid-prefill (recomputed from 0) pools
each token once. ``mean`` needs every position's state, so such requests take no prefix-cache
hits (`needs_every_position`); ``last`` needs only the last token, which is always computed.
Plain numpy; no JAX import.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxinfer.core.request import Request

NORM_EPS = 1e-12  # the smallest norm divided by (torch.nn.functional.normalize's default eps)


def needs_every_position(req: Request) -> bool:
    """Whether the request pools over every prompt position (``mean``): no prefix-cache hits."""
    return req.pooling is not None and req.pooling.pooling_type == "mean"


def step_weights(rows: Sequence[tuple[Request, int, int]], num_tokens: int,
                 num_rows: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The pooling inputs of one step, or None when no row pools (a generate-only step).

    Args:
      rows: (request, start position, new tokens) per row, in packed order.
      num_tokens, num_rows: the step's bucket T and R.
    Returns:
      (pool_rows [T] int32: the row each packed token adds to, ``num_rows`` (dropped) for
      none; pool_weights [T] float32: its weight, 0 for none).
    """
    if not any(req.pooling is not None for req, _, _ in rows):
        return None
    pool_rows = np.full(num_tokens, num_rows, np.int32)
    weights = np.zeros(num_tokens, np.float32)
    offset = 0
    for i, (req, start, n) in enumerate(rows):
        if req.pooling is not None:
            if req.pooling.pooling_type == "mean":
                pool_rows[offset:offset + n] = i
                weights[offset:offset + n] = 1.0
            elif start + n == req.num_prompt_tokens:  # last: the chunk that ends the prompt
                pool_rows[offset + n - 1] = i
                weights[offset + n - 1] = 1.0
        offset += n
    return pool_rows, weights


def record(req: Request, pooled_row: np.ndarray, start: int, n: int) -> None:
    """Add one step's pooled row (its chunk from ``start``, ``n`` tokens) to the request's
    running state (`Request.pooled`); a chunk from position 0 restarts it."""
    row = np.array(pooled_row, np.float64)
    if req.pooling.pooling_type == "last":
        if start + n == req.num_prompt_tokens:  # the chunk holding the last prompt token
            req.pooled = row
        return
    req.pooled = row if start == 0 or req.pooled is None else req.pooled + row


def finalize(req: Request) -> np.ndarray:
    """The request's vector [d] float32: the pooled state (divided by the prompt length for
    ``mean``), its first ``dimensions`` values, L2-normalized when ``normalize``."""
    p = req.pooling
    vec = req.pooled / (req.num_prompt_tokens if p.pooling_type == "mean" else 1)
    if p.dimensions is not None:
        vec = vec[:p.dimensions]
    if p.normalize:
        vec = vec / max(float(np.linalg.norm(vec)), NORM_EPS)
    return vec.astype(np.float32)
