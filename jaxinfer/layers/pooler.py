"""The pooling pass: per-row weighted sums of a step's final hidden states (embeddings).

vLLM's ``Pooler`` idea over a packed, ragged step: the host says which packed tokens belong to
which row and with what weight (`jaxinfer.core.pooling.step_weights`: the last prompt token
for ``last`` pooling, every prompt token of the chunk for ``mean``), so one fixed-shape
function serves both types and chunked prefills (the host adds the chunks' sums). Division by
the prompt length, truncation and L2 normalization happen on the host at the end
(`jaxinfer.core.pooling.finalize`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def pool(hidden: jax.Array, rows: jax.Array, weights: jax.Array, num_rows: int) -> jax.Array:
    """Per-row weighted sums of the packed hidden states.

    Args:
      hidden: [T, D] float32 final hidden states (after the model's final norm) of the step's
        packed tokens (`jaxinfer.models.llama.HIDDEN`).
      rows: [T] int32 the row each token adds to; ``num_rows`` or more: none (dropped).
      weights: [T] float32 each token's weight.
      num_rows: R, the step bucket's rows (static).
    Returns:
      [R, D] float32: ``sum_t weights[t] * hidden[t]`` over the tokens of each row.
    """
    x = hidden.astype(jnp.float32) * weights[:, None]
    return jax.ops.segment_sum(x, rows, num_segments=num_rows)
