"""Pallas kernels for jaxinfer (imports nothing from ``jaxinfer``).

``ragged_paged_attention``: causal GQA attention of packed ragged queries (prefill
chunks and decode rows mixed) over a paged KV cache; ``ragged_paged_attention_reference``
is the pure-jnp version of the same contract. See README.md.
"""

from jaxinfer.kernels.pallas.ragged_paged_attention import ragged_paged_attention
from jaxinfer.kernels.pallas.reference import ragged_paged_attention_reference

__all__ = ["ragged_paged_attention", "ragged_paged_attention_reference"]
