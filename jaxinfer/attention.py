"""Paged attention inside the jitted step: the metadata pytree, the KV write, and the
switch point between the XLA (pure jnp) path and the Pallas kernel.

KV cache layout (per engine): ``k_cache, v_cache [L, num_blocks, block_size, K, H]``,
all layers stacked so the layer scan carries it in place (donated to the step); a
bfloat16 cache on CPU holds its uint16 bits (`kv_storage_dtype`, read through `kv_values`). Token
with slot ``s`` lives at ``[layer, s // block_size, s % block_size]``. Block 0 is the
null block that padding tokens write into.

XLA path (CPU default): attention of a token = softmax over
  A. the new keys of its own sequence in this step (causal, from the fresh K/V), and
  B. its sequence's *cached context* (positions < ctx_len, gathered from the pages):
     B1 for single-token rows (decodes): an online-softmax loop over each row's block
        table, a few blocks per iteration, only as far as the longest context reaches;
     B2 for multi-token rows with context (a continuing prefill chunk, or a prefix-cache
        hit): a loop over work items of up to ``Q_CHUNK`` queries of one row, each
        gathering that row's context once (no per-token gather),
merged with one shared max (log-sum-exp). A sliding-window layer (``window`` W, a traced
per-layer scalar) also masks keys with ``q_pos - k_pos >= W`` in all three parts (`_in_window`),
and B1 starts its block walk at the first block any row's window reaches. A step of fresh prefills reads no pages, a
decode token reads exactly its sequence's context once, and a fresh prefill mixed into
a decode batch costs no extra context reads.
Pallas path: writes the new K/V first, then calls ``pallas_kernels.ragged_paged_attention``
over the whole context (``kv_lens``), under ``shard_map`` over the heads when tensor-parallel.
Einsum letters: T tokens, K kv heads, G query heads per kv head, H head dim, S context.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh, PartitionSpec as P

from jaxinfer.batch import Q_CHUNK


@dataclasses.dataclass(frozen=True)
class AttentionBackend:
    """Which paged-attention implementation a model step uses (static and hashable, so it
    can be a linen module attribute).

    Attributes:
      name: "xla" (pure jnp, `xla_paged_attention`) or "pallas" (``pallas_kernels``).
      interpret: run the Pallas kernel in interpret mode (CPU).
      mesh: the replica's ``(data, model)`` mesh when tensor-parallel (the Pallas path
        shard-maps over it), else None.
    Raises:
      ValueError: an unknown name.
    """

    name: str = "xla"
    interpret: bool = False
    mesh: Mesh | None = None

    def __post_init__(self) -> None:
        if self.name not in ("xla", "pallas"):
            raise ValueError(f"unknown attention backend {self.name!r} (expected 'xla' or 'pallas')")


@struct.dataclass
class AttentionMetadata:
    """Per-step inputs of attention (a registered pytree; shapes are bucketed).

    Attributes:
      positions: [T] int32 absolute position of each token (padding 0).
      token_seq: [T] int32 row of each token's sequence; -1 for padding tokens.
      slot_mapping: [T] int32 cache slot each new K/V is written to (padding 0).
      row_ctx_len: [R] int32 cached context length of each row (padding 0).
      row_last: [R] int32 packed index of single-token rows' token (B1); T otherwise.
      item_row, item_start, item_len: [C] int32 B2 work items: row, first packed token,
        number of queries (<= Q_CHUNK); num_items: [] int32 items in use.
      block_tables: [R, W] int32 block table rows. XLA path: the cached context only;
        Pallas path: the whole context including this step's tokens. Padding 0.
      query_start_loc: [R+1] int32 first packed token of each row (Pallas path).
      kv_lens: [R] int32 context length including this step's tokens (Pallas path).
      num_seqs: [] int32 real rows (Pallas path).
    """

    positions: jax.Array
    token_seq: jax.Array
    slot_mapping: jax.Array
    row_ctx_len: jax.Array
    row_last: jax.Array
    item_row: jax.Array
    item_start: jax.Array
    item_len: jax.Array
    num_items: jax.Array
    block_tables: jax.Array
    query_start_loc: jax.Array
    kv_lens: jax.Array
    num_seqs: jax.Array


# bfloat16 caches on CPU are stored as their uint16 bits (`kv_storage_dtype`): XLA:CPU
# upcasts a bfloat16 update of the carried cache to float32 over the whole pool (plus a
# full copy) every layer of every step; an integer update stays in place.
BF16_BITS = jnp.uint16


def kv_storage_dtype(dtype, platform: str):
    """The array dtype of the KV cache for model ``dtype`` on ``platform``."""
    dtype = jnp.dtype(dtype)
    return jnp.dtype(BF16_BITS) if dtype == jnp.bfloat16 and platform == "cpu" else dtype


def kv_values(x: jax.Array) -> jax.Array:
    """Cache contents as floats (bit-stored bfloat16 reinterpreted; no conversion)."""
    return jax.lax.bitcast_convert_type(x, jnp.bfloat16) if x.dtype == BF16_BITS else x


def write_kv(cache: jax.Array, layer: jax.Array, slot_mapping: jax.Array, new: jax.Array) -> jax.Array:
    """Scatter new K or V ``[T, K, H]`` into ``cache [L, NB, bs, K, H]`` at the slots.

    One combined-index scatter on the carried cache: no per-layer slice is copied.
    """
    bs = cache.shape[2]
    if cache.dtype == BF16_BITS:
        new = jax.lax.bitcast_convert_type(new.astype(jnp.bfloat16), BF16_BITS)
    return cache.at[layer, slot_mapping // bs, slot_mapping % bs].set(new.astype(cache.dtype))


def _masked_scores(qg, kc, ctx_len):
    """qg [X,K,G,H] vs kc [X,S,K,H] -> scores [X,K,G,S] with positions >= ctx_len masked."""
    s = jnp.einsum("xkgh,xskh->xkgs", qg, kc.astype(jnp.float32))
    valid = jnp.arange(kc.shape[1])[None, :] < ctx_len[:, None]
    return jnp.where(valid[:, None, None, :], s, -jnp.inf)


def _partial_softmax(s, v):
    """Unnormalised pieces (max, sum, weighted values) of a softmax over the last axis.

    s: [X,K,G,S] scores; v: [X,S,K,H] or [S,K,H]. Rows with no valid key give
    (-inf, 0, 0) and merge as nothing.
    """
    m = s.max(-1)
    safe = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - safe[..., None])
    spec = "xkgs,xskh->xkgh" if v.ndim == 4 else "xkgu,ukh->xkgh"
    return m, p.sum(-1), jnp.einsum(spec, p, v.astype(jnp.float32))


def _merge(parts):
    """Combine (max, sum, acc) partial softmaxes into normalised outputs (log-sum-exp)."""
    m = parts[0][0]
    for pm, _, _ in parts[1:]:
        m = jnp.maximum(m, pm)
    denom, acc = 0.0, 0.0
    for pm, pl, pa in parts:
        w = jnp.where(jnp.isfinite(pm), jnp.exp(pm - m), 0.0)
        denom = denom + pl * w
        acc = acc + pa * w[..., None]
    return acc / denom[..., None]


def _in_window(q_pos, k_pos, window):
    """Whether keys at ``k_pos`` lie in the sliding window of queries at ``q_pos`` (broadcast):
    ``q_pos - k_pos < window`` (transformers' sliding-window mask). True when ``window`` is None."""
    return True if window is None else (q_pos - k_pos) < window


BLOCKS_PER_ITER = 8  # B1 reads this many blocks per row per loop iteration


def _row_context(qg, k_cache, v_cache, layer, meta, window=None):
    """B1: each row's last token against the row's context, scattered back to [T].

    Walks the block tables ``BLOCKS_PER_ITER`` blocks at a time with an online softmax
    (FlashAttention-style running max/sum), for only as many iterations as the longest
    context needs: each iteration gathers a small cache-resident slab instead of
    materialising the whole [R, W*bs, K, H] context, and padding width costs nothing.
    """
    T, K, G, H = qg.shape
    R, W = meta.block_tables.shape
    bs = k_cache.shape[2]
    c = min(BLOCKS_PER_ITER, W)
    tables = jnp.pad(meta.block_tables, ((0, 0), (0, -W % c)))  # null-block padding to a multiple of c
    q = qg[jnp.minimum(meta.row_last, T - 1)]  # [R, K, G, H]
    q_pos = meta.positions[jnp.minimum(meta.row_last, T - 1)]  # [R]
    span = c * bs

    def body(j, carry):
        m, l, acc = carry
        blocks = jax.lax.dynamic_slice_in_dim(tables, j * c, c, axis=1)  # [R, c]
        k = kv_values(k_cache[layer, blocks]).reshape(R, span, K, H)
        v = kv_values(v_cache[layer, blocks]).reshape(R, span, K, H)
        s = jnp.einsum("rkgh,rskh->rkgs", q, k.astype(jnp.float32))
        pos = j * span + jnp.arange(span)
        valid = (pos[None, :] < meta.row_ctx_len[:, None]) & _in_window(q_pos[:, None], pos[None, :], window)
        s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(-1))
        safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(s - safe[..., None])
        scale = jnp.where(jnp.isfinite(m), jnp.exp(m - safe), 0.0)
        return (m_new, l * scale + p.sum(-1),
                acc * scale[..., None] + jnp.einsum("rkgs,rskh->rkgh", p, v.astype(jnp.float32)))

    iters = (jnp.max(meta.row_ctx_len) + span - 1) // span
    first = 0
    if window is not None:  # skip the blocks below every real row's window
        real = (meta.row_last < T) & (meta.row_ctx_len > 0)
        first = jnp.min(jnp.where(real, jnp.maximum(q_pos - window + 1, 0), jnp.iinfo(jnp.int32).max)) // span
    init = (jnp.full((R, K, G), -jnp.inf), jnp.zeros((R, K, G)), jnp.zeros((R, K, G, H)))
    m, l, a = jax.lax.fori_loop(jnp.minimum(first, iters), iters, body, init)
    to = lambda init, x: init.at[meta.row_last].set(x, mode="drop")  # noqa: E731
    return (to(jnp.full((T, K, G), -jnp.inf), m), to(jnp.zeros((T, K, G)), l), to(jnp.zeros((T, K, G, H)), a))


def _chunk_context(qg, k_cache, v_cache, layer, meta, q_chunk: int, window=None):
    """B2: loop over work items; each is <= q_chunk queries of one row vs that row's context."""
    T, K, G, H = qg.shape
    pad = lambda x, v: jnp.concatenate([x, jnp.full((q_chunk,) + x.shape[1:], v, x.dtype)])  # noqa: E731
    qp = pad(qg, 0.0)
    pos_p = pad(meta.positions, 0)
    init = (jnp.full((T + q_chunk, K, G), -jnp.inf), jnp.zeros((T + q_chunk, K, G)), jnp.zeros((T + q_chunk, K, G, H)))

    def body(i, acc):
        row, start, n = meta.item_row[i], meta.item_start[i], meta.item_len[i]
        q = jax.lax.dynamic_slice_in_dim(qp, start, q_chunk)
        kc = kv_values(k_cache[layer, meta.block_tables[row]]).reshape(-1, K, H)  # [S, K, H]
        vc = kv_values(v_cache[layer, meta.block_tables[row]]).reshape(-1, K, H)
        s = jnp.einsum("qkgh,skh->qkgs", q, kc.astype(jnp.float32))
        k_pos = jnp.arange(kc.shape[0])[None, :]
        q_pos = jax.lax.dynamic_slice_in_dim(pos_p, start, q_chunk)[:, None]
        valid = ((k_pos < meta.row_ctx_len[row]) & (jnp.arange(q_chunk) < n)[:, None]
                 & _in_window(q_pos, k_pos, window))
        m, l, a = _partial_softmax(jnp.where(valid[:, None, None, :], s, -jnp.inf), vc)
        keep = (jnp.arange(q_chunk) < n)[:, None, None]
        out = []
        for old, new in zip(acc, (m, l, a)):
            cur = jax.lax.dynamic_slice_in_dim(old, start, q_chunk)
            k = keep if new.ndim == 3 else keep[..., None]
            out.append(jax.lax.dynamic_update_slice_in_dim(old, jnp.where(k, new, cur), start, 0))
        return tuple(out)

    m, l, a = jax.lax.fori_loop(0, meta.num_items, body, init)
    return m[:T], l[:T], a[:T]


def xla_paged_attention(q, k_new, v_new, k_cache, v_cache, layer, meta: AttentionMetadata, sm_scale: float,
                        window=None):
    """Ragged paged attention in pure jnp (same semantics as the Pallas kernel).

    Args:
      q: [T, N, H] queries. k_new, v_new: [T, K, H] this step's keys/values.
      k_cache, v_cache: [L, NB, bs, K, H] pages (the cached context is read from them).
      layer: [] int32 layer index. meta: `AttentionMetadata` (XLA-path fields).
      sm_scale: softmax scale (H ** -0.5).
      window: [] int32 sliding window of this layer (keys with ``q_pos - k_pos < window``
        are seen), or None (static) for full causal attention.

    Returns:
      [T, N, H] in q's dtype; float32 accumulation.
    """
    T, N, H = q.shape
    K = k_new.shape[1]
    qg = q.astype(jnp.float32).reshape(T, K, N // K, H) * sm_scale
    s_new = jnp.einsum("tkgh,ukh->tkgu", qg, k_new.astype(jnp.float32))
    same = (meta.token_seq[:, None] == meta.token_seq[None, :]) & (meta.positions[None, :] <= meta.positions[:, None])
    same = same & _in_window(meta.positions[:, None], meta.positions[None, :], window)
    parts = [_partial_softmax(jnp.where(same[:, None, None, :], s_new, -jnp.inf), v_new)]  # diagonal kept
    if meta.block_tables.shape[1] > 0:  # static: the bucket has a context width
        parts.append(_row_context(qg, k_cache, v_cache, layer, meta, window))
        parts.append(_chunk_context(qg, k_cache, v_cache, layer, meta, min(Q_CHUNK, T), window))
    return _merge(parts).reshape(T, N, H).astype(q.dtype)


def pallas_paged_attention(q, k_cache, v_cache, layer, meta: AttentionMetadata, sm_scale: float,
                           interpret: bool = False, mesh: Mesh | None = None, window=None):
    """``pallas_kernels.ragged_paged_attention`` over the whole context, per TP shard.

    The kernel is an opaque custom call that XLA's SPMD partitioner cannot split (it would
    gather its operands, the whole KV cache, onto every device). With a ``model`` mesh
    axis of size > 1 it therefore runs under ``jax.shard_map``: each device attends with
    its own query heads over its own KV heads (Megatron's head split; no communication).
    When the KV heads do not divide by the TP degree the cache is replicated
    (`jaxinfer.sharding`), and so is this computation, as on the XLA path.

    Args:
      q: [T, N, H]; k_cache, v_cache: [L, NB, bs, K, H]; layer: [] int32.
      mesh: the replica's ``(data, model)`` mesh, or None on one device.
      window: [] int32 sliding window of this layer, or None (full causal attention).
    Returns:
      [T, N, H] in q's dtype.
    """
    from pallas_kernels import ragged_paged_attention

    def attend(q, k_cache, v_cache, layer, kv_lens, block_tables, query_start_loc, num_seqs, *win):
        # The kernel takes q in the cache dtype (bfloat16 models keep q in float32 up to here).
        return ragged_paged_attention(q.astype(k_cache.dtype), k_cache, v_cache, kv_lens, block_tables,
                                      query_start_loc, num_seqs, sm_scale=sm_scale, layer=layer,
                                      interpret=interpret, sliding_window=win[0] if win else None).astype(q.dtype)

    args = (q, kv_values(k_cache), kv_values(v_cache), layer, meta.kv_lens, meta.block_tables, meta.query_start_loc,
            meta.num_seqs) + (() if window is None else (window,))
    tp = 1 if mesh is None else mesh.shape["model"]
    if tp == 1:
        return attend(*args)
    heads = "model" if k_cache.shape[3] % tp == 0 else None  # the cache's own K split (sharding.kv_cache_spec)
    q_spec, kv_spec = P(None, heads, None), P(None, None, None, heads, None)
    sharded = jax.shard_map(attend, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec) + (P(),) * (len(args) - 3),
                            out_specs=q_spec, check_vma=False)
    return sharded(*args)


def paged_attention(backend: AttentionBackend, q, k_new, v_new, k_cache, v_cache, layer,
                    meta: AttentionMetadata, sm_scale: float, window=None):
    """Write this step's K/V into the pages and attend: the one switch point.

    Args:
      backend: which implementation (`AttentionBackend`).
      q: [T, N, H]; k_new, v_new: [T, K, H]; k_cache, v_cache: [L, NB, bs, K, H];
      layer: [] int32; sm_scale: softmax scale (``H ** -0.5``).
      window: [] int32 sliding window of this layer, or None (static) for full causal attention.

    Returns:
      (out [T, N, H], k_cache, v_cache) with the new K/V written.
    """
    k_cache = write_kv(k_cache, layer, meta.slot_mapping, k_new)
    v_cache = write_kv(v_cache, layer, meta.slot_mapping, v_new)
    if backend.name == "xla":
        out = xla_paged_attention(q, k_new, v_new, k_cache, v_cache, layer, meta, sm_scale, window)
    else:
        out = pallas_paged_attention(q, k_cache, v_cache, layer, meta, sm_scale, backend.interpret, backend.mesh,
                                     window)
    return out, k_cache, v_cache
