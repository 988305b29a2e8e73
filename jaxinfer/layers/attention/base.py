"""The interface every attention backend implements (`AttentionBackend`), after vLLM v1's
attention backends: a per-step ``prepare`` of the step's metadata, run once before the layer
loop, and a per-layer call that writes this step's K/V into the pages and attends.

Owns the order of a layer's attention (write first, then read: every backend reads the step's
own K/V from the pages or from ``k_new``/``v_new``), not any computation.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
from jax.sharding import Mesh

from jaxinfer.layers.attention.kv_storage import write_kv
from jaxinfer.layers.step_metadata import AttentionMetadata

# The step's attention contract as a pytree: it crosses jit boundaries as the step's input
# (registered here, where every backend and the XLA work plan import it; the host side that
# builds it imports no JAX).
jax.tree_util.register_dataclass(AttentionMetadata)


@dataclasses.dataclass(frozen=True)
class AttentionBackend:
    """One paged-attention implementation of the model step (static and hashable, so it can
    be a linen module attribute). Subclasses set `name` (their key in
    `jaxinfer.layers.attention.registry.ATTENTION_BACKENDS`) and implement `forward`.

    Attributes:
      mesh: the replica's ``(data, model)`` mesh when tensor-parallel, else None.
    """

    name: ClassVar[str] = ""
    mesh: Mesh | None = None

    def prepare(self, meta: AttentionMetadata, block_size: int) -> Any:
        """What every layer of one step reads besides ``meta``, derived from it inside the
        jitted step (traceable), once before the layer loop; None when nothing is needed."""
        return None

    def forward(self, q, k_new, v_new, k_cache, v_cache, layer, meta: AttentionMetadata, sm_scale: float,
                window, prepared):
        """Attention of this step's queries over their rows' contexts, the step's K/V already
        written into the pages (`__call__` does that first).

        Args:
          q: [T, N, H] queries. k_new, v_new: [T, K, H] this step's keys/values.
          k_cache, v_cache: [L, NB, bs, K, H] pages (`jaxinfer.layers.attention.kv_storage`).
          layer: [] int32 layer index. meta: the step's `AttentionMetadata`.
          sm_scale: softmax scale (``H ** -0.5``).
          window: [] int32 sliding window of this layer, or None (static) for full causal attention.
          prepared: `prepare` (meta, block_size) of this step.

        Returns:
          [T, N, H] in q's dtype.
        """
        raise NotImplementedError

    def keep_layout(self, pages):
        """The step's new keys / values and the written pages constrained to the cache's own
        layout on `mesh` (`jaxinfer.distributed.sharding.kv_pages_sharding`: split by KV head where
        TP divides K, else replicated). Without it, where TP does not divide the KV heads, XLA
        split them like the grouped queries and gathered the whole cache at the end of every
        step (found by ``python -m jaxinfer.plan --compile``)."""
        if self.mesh is None:
            return pages
        from jaxinfer.distributed.sharding import kv_pages_sharding

        return jax.lax.with_sharding_constraint(pages, kv_pages_sharding(pages, self.mesh))

    def __call__(self, q, k_new, v_new, k_cache, v_cache, layer, meta: AttentionMetadata, sm_scale: float,
                 window=None, prepared=None):
        """Write this step's K/V into the pages (`kv_storage.write_kv`), then `forward`.

        Returns:
          (out [T, N, H], k_cache, v_cache) with the new K/V written.
        """
        k_new, v_new = self.keep_layout(k_new), self.keep_layout(v_new)
        k_cache = self.keep_layout(write_kv(k_cache, layer, meta.slot_mapping, k_new))
        v_cache = self.keep_layout(write_kv(v_cache, layer, meta.slot_mapping, v_new))
        out = self.forward(q, k_new, v_new, k_cache, v_cache, layer, meta, sm_scale, window, prepared)
        return out, k_cache, v_cache


def paged_attention(backend: AttentionBackend, q, k_new, v_new, k_cache, v_cache, layer, meta: AttentionMetadata,
                    sm_scale: float, window=None, plan=None):
    """``backend(q, k_new, v_new, k_cache, v_cache, layer, meta, sm_scale, window, plan)``: write this
    step's K/V into the pages and attend (`AttentionBackend.__call__`).

    Args:
      backend: a registered backend (`get_attention_backend`).
      q: [T, N, H]; k_new, v_new: [T, K, H]; k_cache, v_cache: [L, NB, bs, K, H]; layer: [] int32;
      sm_scale: softmax scale (``H ** -0.5``); window: [] int32 sliding window or None.
      plan: ``backend.prepare(meta, block_size)`` of this step (None for the Pallas backend).

    Returns:
      (out [T, N, H], k_cache, v_cache) with the new K/V written.

    Raises:
      ValueError: the XLA backend without a plan.
    """
    return backend(q, k_new, v_new, k_cache, v_cache, layer, meta, sm_scale, window, plan)
