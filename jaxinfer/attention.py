"""Paged attention inside the jitted step: the metadata pytree, the KV write, and the
switch point between the XLA (pure jnp) path and the Pallas kernel.

KV cache layout (per engine): ``k_cache, v_cache [L, num_blocks, block_size, K, H]``,
all layers stacked so the layer scan carries it in place (donated to the step). Token
with slot ``s`` lives at ``[layer, s // block_size, s % block_size]``. Block 0 is the
null block that padding tokens write into.

XLA path (CPU default): attention of a token = softmax over
  A. the new keys of its own sequence in this step (causal, from the fresh K/V), and
  B. its sequence's *cached context* (positions < ctx_len, gathered from the pages),
merged with one shared max (log-sum-exp), so a step of fresh prefills reads no pages at
all and a decode token reads exactly its sequence's context once.
Pallas path: writes the new K/V first, then calls ``pallas_kernels.ragged_paged_attention``
over the whole context (``kv_lens``).
Einsum letters: T tokens, K kv heads, G query heads per kv head, H head dim, S context.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class AttentionMetadata:
    """Per-step inputs of attention (a registered pytree; shapes are bucketed).

    Attributes:
      positions: [T] int32 absolute position of each token (padding 0).
      token_seq: [T] int32 row of each token's sequence; -1 for padding tokens.
      slot_mapping: [T] int32 cache slot each new K/V is written to (padding 0).
      token_ctx_len: [T] int32 cached context length of the token's sequence (XLA path).
      block_tables: [R, W] int32 block table rows. XLA path: the cached context only;
        Pallas path: the whole context including this step's tokens. Padding 0.
      query_start_loc: [R+1] int32 first packed token of each row (Pallas path).
      kv_lens: [R] int32 context length including this step's tokens (Pallas path).
      num_seqs: [] int32 real rows (Pallas path).
    """

    positions: jax.Array
    token_seq: jax.Array
    slot_mapping: jax.Array
    token_ctx_len: jax.Array
    block_tables: jax.Array
    query_start_loc: jax.Array
    kv_lens: jax.Array
    num_seqs: jax.Array


def write_kv(cache: jax.Array, layer: jax.Array, slot_mapping: jax.Array, new: jax.Array) -> jax.Array:
    """Scatter new K or V ``[T, K, H]`` into ``cache [L, NB, bs, K, H]`` at the slots.

    One combined-index scatter on the carried cache: no per-layer slice is copied.
    """
    bs = cache.shape[2]
    return cache.at[layer, slot_mapping // bs, slot_mapping % bs].set(new.astype(cache.dtype))


def _context_part(qg, k_cache, v_cache, layer, meta):
    """Scores and values of the cached context: [T,K,G,S] and [T,S,K,H]."""
    T = qg.shape[0]
    bs = k_cache.shape[2]
    rows = jnp.maximum(meta.token_seq, 0)
    table = meta.block_tables[rows]  # [T, W]
    kc = k_cache[layer, table].reshape(T, -1, *k_cache.shape[3:])  # [T, S, K, H]
    vc = v_cache[layer, table].reshape(T, -1, *v_cache.shape[3:])
    s = jnp.einsum("tkgh,tskh->tkgs", qg, kc.astype(jnp.float32))
    valid = jnp.arange(table.shape[1] * bs)[None, :] < meta.token_ctx_len[:, None]  # [T, S]
    return jnp.where(valid[:, None, None, :], s, -jnp.inf), vc


def xla_paged_attention(q, k_new, v_new, k_cache, v_cache, layer, meta: AttentionMetadata, sm_scale: float):
    """Ragged paged attention in pure jnp (reference semantics of the Pallas kernel).

    Args:
      q: [T, N, H] queries. k_new, v_new: [T, K, H] this step's keys/values.
      k_cache, v_cache: [L, NB, bs, K, H] pages (the cached context is read from them).
      layer: [] int32 layer index. meta: `AttentionMetadata` (XLA-path fields).
      sm_scale: softmax scale (H ** -0.5).

    Returns:
      [T, N, H] in q's dtype; float32 accumulation.
    """
    T, N, H = q.shape
    K = k_new.shape[1]
    qg = q.astype(jnp.float32).reshape(T, K, N // K, H) * sm_scale
    s_new = jnp.einsum("tkgh,ukh->tkgu", qg, k_new.astype(jnp.float32))
    same = (meta.token_seq[:, None] == meta.token_seq[None, :]) & (meta.positions[None, :] <= meta.positions[:, None])
    s_new = jnp.where(same[:, None, None, :], s_new, -jnp.inf)  # the diagonal is always kept
    m = s_new.max(-1)
    has_ctx = meta.block_tables.shape[1] > 0
    if has_ctx:
        s_ctx, vc = _context_part(qg, k_cache, v_cache, layer, meta)
        m = jnp.maximum(m, s_ctx.max(-1))
    p_new = jnp.exp(s_new - m[..., None])
    denom = p_new.sum(-1)
    out = jnp.einsum("tkgu,ukh->tkgh", p_new, v_new.astype(jnp.float32))
    if has_ctx:
        p_ctx = jnp.exp(s_ctx - m[..., None])
        denom = denom + p_ctx.sum(-1)
        out = out + jnp.einsum("tkgs,tskh->tkgh", p_ctx, vc.astype(jnp.float32))
    out = out / denom[..., None]
    return out.reshape(T, N, H).astype(q.dtype)


def paged_attention(backend: str, q, k_new, v_new, k_cache, v_cache, layer, meta: AttentionMetadata,
                    sm_scale: float, interpret: bool = False):
    """Write this step's K/V into the pages and attend: the one switch point.

    Args:
      backend: "xla" (pure jnp, above) or "pallas" (``pallas_kernels``).
      interpret: run the Pallas kernel in interpret mode (CPU).

    Returns:
      (out [T, N, H], k_cache, v_cache) with the new K/V written.
    """
    k_cache = write_kv(k_cache, layer, meta.slot_mapping, k_new)
    v_cache = write_kv(v_cache, layer, meta.slot_mapping, v_new)
    if backend == "xla":
        out = xla_paged_attention(q, k_new, v_new, k_cache, v_cache, layer, meta, sm_scale)
    elif backend == "pallas":
        from pallas_kernels import ragged_paged_attention

        out = ragged_paged_attention(q, k_cache, v_cache, meta.kv_lens, meta.block_tables, meta.query_start_loc,
                                     meta.num_seqs, sm_scale=sm_scale, layer=layer, interpret=interpret)
    else:
        raise ValueError(f"unknown attention backend {backend!r} (expected 'xla' or 'pallas')")
    return out, k_cache, v_cache
