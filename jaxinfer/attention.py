"""The names that older imports read from ``jaxinfer.attention``, re-exported from their homes
under `jaxinfer.layers.attention` (the backend registry, the backends, the KV storage). Owns
nothing itself but `paged_attention`, the call form of a backend that takes its plan by keyword.
"""
from __future__ import annotations

from jaxinfer.layers.attention.base import AttentionBackend
from jaxinfer.layers.attention.kv_storage import (BF16_BITS, KVStorage, gather_pages, kv_storage_dtype, kv_values,
                                                  write_kv)
from jaxinfer.layers.attention.pallas import PallasAttention, pallas_paged_attention
from jaxinfer.layers.attention.registry import ATTENTION_BACKENDS, get_attention_backend
from jaxinfer.layers.attention.xla import XlaAttention, xla_paged_attention
from jaxinfer.step_metadata import AttentionMetadata
from jaxinfer.xla_work_plan import XlaWorkPlan  # registers AttentionMetadata as a pytree

__all__ = ["ATTENTION_BACKENDS", "AttentionBackend", "AttentionMetadata", "BF16_BITS", "KVStorage", "PallasAttention",
           "XlaAttention", "gather_pages", "get_attention_backend", "kv_storage_dtype", "kv_values", "paged_attention",
           "pallas_paged_attention", "write_kv", "xla_paged_attention"]


def paged_attention(backend: AttentionBackend, q, k_new, v_new, k_cache, v_cache, layer, meta: AttentionMetadata,
                    sm_scale: float, window=None, plan: XlaWorkPlan | None = None):
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
