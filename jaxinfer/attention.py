"""Paged attention inside the jitted step: the KV write, and the switch point between the
XLA (pure jnp) path and the Pallas kernel, both reading the step's standard ragged contract
`jaxinfer.step_metadata.AttentionMetadata` (registered as a pytree by `jaxinfer.xla_work_plan`,
imported here). The XLA path also walks work lists that the step derives from that contract
once, before the layer loop (`jaxinfer.xla_work_plan.XlaWorkPlan`, with the path's tiling
constants); the host sends none.

KV cache layout (per engine): ``k_cache, v_cache [L, num_blocks, block_size, K, H]``,
all layers stacked so the layer scan carries it in place (donated to the step); a
bfloat16 cache on CPU holds its uint16 bits (`kv_storage_dtype`, read through `kv_values`); an
8-bit cache (``--kv-cache-dtype int8|fp8``) is a `jaxinfer.kv_quant.QuantKV` of values and
per-token scales, quantized in `write_kv` and dequantized in `gather_pages` / the kernel. Token
with slot ``s`` lives at ``[layer, s // block_size, s % block_size]``. Block 0 is the
null block that padding tokens write into.

XLA path (CPU default): on one CPU device with the C++ kernel built
(``AttentionBackend.native``), after the write every token's query reads its row's pages up to
its own position (`jaxinfer.native_attention`: a work item is one query, or up to 16 consecutive
queries of a prompt chunk sharing each page read), decode and prefill alike, so a step costs what its tokens' real
contexts cost. Otherwise (a mesh, or no compiler) attention of a token = softmax over
  A. the new keys of its own sequence in this step (causal, from the fresh K/V; a dense
     [T, T] score matrix masked to the token's own row), and
  B. its sequence's *cached context* (positions < ctx_len, gathered from the pages):
     B1 for single-token rows (decodes): an online-softmax loop over a ragged list of
        context groups (a few blocks of one row each), only the groups each row fills;
     B2 for multi-token rows with context (a continuing prefill chunk, or a prefix-cache
        hit): a loop over work items of up to ``Q_CHUNK`` queries of one row, each
        walking that row's context once, only as far as it reaches (no per-token gather),
merged with one shared max (log-sum-exp). A sliding-window layer (``window`` W, a traced
per-layer scalar) also masks keys with ``q_pos - k_pos >= W`` in every part
(`_in_window`); in B1 and B2 its pages below the window are still walked (masked), as the
work lists (one plan per step) are shared by all layers. The jnp path's part A grows with
the square of the step's tokens (a 512-token prefill step spent most of its time there:
`benchmarks/results/2026-12-02-cpu2-bf16-default/`), which is why the kernel takes every token.
Pallas path: writes the new K/V first, then calls ``pallas_kernels.ragged_paged_attention``
over the whole context (``kv_lens``), under ``shard_map`` over the heads when tensor-parallel.
Both read the same block tables (each row's context including this step's tokens); the
jnp path uses only their cached part.
Einsum letters: T tokens, K kv heads, G query heads per kv head, H head dim, S context.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from jaxinfer import kv_quant, native_attention
from jaxinfer.kv_quant import QuantKV
from jaxinfer.step_metadata import AttentionMetadata
from jaxinfer.xla_work_plan import GROUP_BLOCKS, Q_CHUNK, XlaWorkPlan, groups_per_iter  # registers AttentionMetadata


@dataclasses.dataclass(frozen=True)
class AttentionBackend:
    """Which paged-attention implementation a model step uses (static and hashable, so it
    can be a linen module attribute).

    Attributes:
      name: "xla" (pure jnp, `xla_paged_attention`) or "pallas" (``pallas_kernels``).
      interpret: run the Pallas kernel in interpret mode (CPU).
      mesh: the replica's ``(data, model)`` mesh when tensor-parallel (the Pallas path
        shard-maps over it), else None.
      native: on the XLA path, every token's attention by the C++ kernel
        (`jaxinfer.native_attention`) instead of the jnp parts; one device only (any cache
        dtype: float32, bit-stored bfloat16, int8 or fp8 with their scales).
    Raises:
      ValueError: an unknown name.
    """

    name: str = "xla"
    interpret: bool = False
    mesh: Mesh | None = None
    native: bool = False

    def __post_init__(self) -> None:
        if self.name not in ("xla", "pallas"):
            raise ValueError(f"unknown attention backend {self.name!r} (expected 'xla' or 'pallas')")


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


def write_kv(cache, layer: jax.Array, slot_mapping: jax.Array, new: jax.Array):
    """Scatter new K or V ``[T, K, H]`` into ``cache [L, NB, bs, K, H]`` at the slots.

    One combined-index scatter on the carried cache: no per-layer slice is copied. A
    one-token step also writes its token to the null slot 0 (block 0, never read as
    context), so that the write stays a scatter: XLA:CPU turns a one-index scatter into a
    dynamic-update-slice, and in the tensor-parallel decode step it then fused that update
    a second time into the attention's page gather, so copy insertion copied the whole
    carried V cache twice per layer (SmolLM2 at TP 2, 600 blocks: 6.6 s decode steps, 81 ms
    with the scatter; a tiny model at TP 2 grew from 2 ms at 2,000 blocks to 400 ms at 50,000).
    An 8-bit cache (`jaxinfer.kv_quant.QuantKV`) quantizes per token and KV head first.
    """
    if slot_mapping.shape[0] == 1:  # see above: keep a scatter
        slot_mapping = jnp.concatenate([slot_mapping, jnp.zeros((1,), slot_mapping.dtype)])
        new = jnp.concatenate([new, new])
    if isinstance(cache, QuantKV):
        return kv_quant.write(cache, layer, slot_mapping, new)
    bs = cache.shape[2]
    if cache.dtype == BF16_BITS:
        new = jax.lax.bitcast_convert_type(new.astype(jnp.bfloat16), BF16_BITS)
    return cache.at[layer, slot_mapping // bs, slot_mapping % bs].set(new.astype(cache.dtype))


def gather_pages(cache, layer: jax.Array, blocks: jax.Array) -> jax.Array:
    """The pages ``blocks`` (int32, any shape B) of ``layer`` from a cache ``[L, NB, bs, K, H]``:
    [*B, bs, K, H] floats (bit-stored bfloat16 reinterpreted; an 8-bit cache dequantized to
    float32). One gather indexed by (layer, block) on the carried cache, no per-layer copy.
    Not through a flattened ``[L*NB, ...]`` view: XLA:CPU then rewrote the cache's in-place
    K/V update into a second update of the reshaped view, which cost full copies of the whole
    pool per layer (seen as ~1.5 s decode steps on 260-block pools)."""
    if isinstance(cache, QuantKV):
        return kv_quant.gather_pages(cache, layer, blocks)
    return kv_values(cache.at[layer, blocks].get(mode="promise_in_bounds"))


def _partial_softmax(s, v):
    """Unnormalised pieces (max, sum, weighted values) of a softmax over the last axis.

    s: [X,K,G,S] scores; v: [S,K,H]. Rows with no valid key give (-inf, 0, 0) and merge
    as nothing.
    """
    return _fold((jnp.full(s.shape[:-1], -jnp.inf), jnp.zeros(s.shape[:-1]), jnp.zeros(s.shape[:-1] + v.shape[-1:])),
                 s, v)


def _fold(carry, s, v):
    """One online-softmax step (FlashAttention's running max/sum/accumulator update):
    fold scores ``s [X,K,G,S]`` over values ``v [S,K,H]`` into ``carry`` = (max [X,K,G],
    sum [X,K,G], acc [X,K,G,H])."""
    m, l, acc = carry
    m_new = jnp.maximum(m, s.max(-1))
    safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    p = jnp.exp(s - safe[..., None])
    scale = jnp.where(jnp.isfinite(m), jnp.exp(m - safe), 0.0)
    return (m_new, l * scale + p.sum(-1),
            acc * scale[..., None] + jnp.einsum("xkgs,skh->xkgh", p, v.astype(jnp.float32)))


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


def _group_context(qg, k_cache, v_cache, layer, meta, plan, window=None):
    """B1: each single-token row's query against its cached context, scattered back to [T].

    The context is cut into groups of `GROUP_BLOCKS` blocks; the step's plan lists only the
    groups each row's context fills (``plan.group_row``, ``plan.group_index``, sorted by
    row), so a row of 200 tokens next to one of 2,000 reads 200, not 2,000, and bucket
    padding is never read. A loop iteration takes ``groups_per_iter`` groups of any rows,
    gathers their blocks (one gather by (layer, block), no per-layer copy) and folds their
    scores into each row's running (max, sum, weighted values) with segment reductions:
    the online softmax of FlashAttention (Dao et al., 2022), over a ragged work list as in
    vLLM's ragged paged attention. Iterations run only up to ``plan.num_groups``.
    """
    T, K, G, H = qg.shape
    R, W = meta.block_tables.shape
    bs = k_cache.shape[2]
    c, P = GROUP_BLOCKS, groups_per_iter(R)
    span = c * bs
    tables = jnp.pad(meta.block_tables, ((0, 1), (0, -W % c)))  # row R: the padding groups' null row
    last = jnp.minimum(plan.row_last, T - 1)
    q = jnp.concatenate([qg[last], jnp.zeros((1, K, G, H), qg.dtype)])
    ctx_len = jnp.concatenate([plan.row_ctx_len, jnp.zeros((1,), jnp.int32)])
    q_pos = jnp.concatenate([meta.positions[last], jnp.zeros((1,), jnp.int32)])
    segs = dict(num_segments=R + 1, indices_are_sorted=True)

    def body(j, carry):
        m, l, acc = carry
        rows = jax.lax.dynamic_slice_in_dim(plan.group_row, j * P, P)
        grp = jax.lax.dynamic_slice_in_dim(plan.group_index, j * P, P)
        blocks = tables[rows[:, None], grp[:, None] * c + jnp.arange(c)]  # [P, c]
        k = gather_pages(k_cache, layer, blocks).reshape(P, span, K, H)
        v = gather_pages(v_cache, layer, blocks).reshape(P, span, K, H)
        s = jnp.einsum("pkgh,pskh->pkgs", q[rows], k.astype(jnp.float32))
        pos = grp[:, None] * span + jnp.arange(span)
        valid = (pos < ctx_len[rows][:, None]) & _in_window(q_pos[rows][:, None], pos, window)
        s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
        m_new = jnp.maximum(m, jax.ops.segment_max(s.max(-1), rows, **segs))
        safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(s - safe[rows][..., None])
        scale = jnp.where(jnp.isfinite(m), jnp.exp(m - safe), 0.0)
        pv = jnp.einsum("pkgs,pskh->pkgh", p, v.astype(jnp.float32))
        return (m_new, l * scale + jax.ops.segment_sum(p.sum(-1), rows, **segs),
                acc * scale[..., None] + jax.ops.segment_sum(pv, rows, **segs))

    init = (jnp.full((R + 1, K, G), -jnp.inf), jnp.zeros((R + 1, K, G)), jnp.zeros((R + 1, K, G, H)))
    m, l, a = jax.lax.fori_loop(0, (plan.num_groups + P - 1) // P, body, init)
    to = lambda init, x: init.at[plan.row_last].set(x[:R], mode="drop")  # noqa: E731
    return (to(jnp.full((T, K, G), -jnp.inf), m), to(jnp.zeros((T, K, G)), l), to(jnp.zeros((T, K, G, H)), a))


CHUNK_CTX_BLOCKS = 16  # blocks of context one B2 inner iteration reads


def _chunk_context(qg, k_cache, v_cache, layer, meta, plan, q_chunk: int, window=None):
    """B2: loop over work items; each is <= q_chunk queries of one row vs that row's context.

    An item walks its row's context `CHUNK_CTX_BLOCKS` blocks at a time with an online
    softmax, only as far as that row's context reaches (not the bucket's table width).
    """
    T, K, G, H = qg.shape
    R, W = meta.block_tables.shape
    bs = k_cache.shape[2]
    c = min(CHUNK_CTX_BLOCKS, W)
    span = c * bs
    tables = jnp.pad(meta.block_tables, ((0, 0), (0, -W % c)))
    pad = lambda x, v: jnp.concatenate([x, jnp.full((q_chunk,) + x.shape[1:], v, x.dtype)])  # noqa: E731
    qp = pad(qg, 0.0)
    pos_p = pad(meta.positions, 0)
    init = (jnp.full((T + q_chunk, K, G), -jnp.inf), jnp.zeros((T + q_chunk, K, G)), jnp.zeros((T + q_chunk, K, G, H)))

    def item(i, acc):
        row, start, n = plan.item_row[i], plan.item_start[i], plan.item_len[i]
        q = jax.lax.dynamic_slice_in_dim(qp, start, q_chunk)
        live = jnp.arange(q_chunk) < n
        q_pos = jax.lax.dynamic_slice_in_dim(pos_p, start, q_chunk)[:, None]

        def step(j, carry):
            blocks = jax.lax.dynamic_slice_in_dim(tables[row], j * c, c)
            kc = gather_pages(k_cache, layer, blocks).reshape(span, K, H)
            vc = gather_pages(v_cache, layer, blocks).reshape(span, K, H)
            s = jnp.einsum("qkgh,skh->qkgs", q, kc.astype(jnp.float32))
            k_pos = (j * span + jnp.arange(span))[None, :]
            valid = (k_pos < plan.row_ctx_len[row]) & live[:, None] & _in_window(q_pos, k_pos, window)
            return _fold(carry, jnp.where(valid[:, None, None, :], s, -jnp.inf), vc)

        part = jax.lax.fori_loop(0, (plan.row_ctx_len[row] + span - 1) // span, step,
                                 (jnp.full((q_chunk, K, G), -jnp.inf), jnp.zeros((q_chunk, K, G)),
                                  jnp.zeros((q_chunk, K, G, H))))
        out = []
        for old, new in zip(acc, part):
            cur = jax.lax.dynamic_slice_in_dim(old, start, q_chunk)
            keep = live.reshape((q_chunk,) + (1,) * (new.ndim - 1))
            out.append(jax.lax.dynamic_update_slice_in_dim(old, jnp.where(keep, new, cur), start, 0))
        return tuple(out)

    m, l, a = jax.lax.fori_loop(0, plan.num_items, item, init)
    return m[:T], l[:T], a[:T]


def _native_paged_attention(qg, k_cache, v_cache, layer, meta, plan, window=None):
    """Every packed token against its row's pages by the C++ kernel
    (`jaxinfer.native_attention.paged_context`): each token's query sees the keys at positions
    ``<= positions[t]`` of row ``plan.token_seq[t]``. The step's own K/V must already be in the
    pages (`paged_attention` writes them first), so the new tokens need no separate part and
    nothing is merged; padding tokens (row -1) read nothing and give 0.

    Returns [T, K, G, H] float32, normalised."""
    R = meta.block_tables.shape[0]
    live = plan.token_seq >= 0
    tables = meta.block_tables[jnp.clip(plan.token_seq, 0, R - 1)]  # [T, W]: each token's row's table
    ctx = jnp.where(live, meta.positions + 1, 0)
    if isinstance(k_cache, QuantKV):
        pages = dict(k_cache=k_cache.values, v_cache=v_cache.values, k_scales=k_cache.scales, v_scales=v_cache.scales)
    else:
        pages = dict(k_cache=k_cache, v_cache=v_cache)
    _, l, acc = native_attention.paged_context(qg, layer=layer, tables=tables, ctx_len=ctx, q_pos=meta.positions,
                                               window=window, **pages)
    return acc / jnp.where(l > 0, l, 1.0)[..., None]


def xla_paged_attention(q, k_new, v_new, k_cache, v_cache, layer, meta: AttentionMetadata, plan: XlaWorkPlan,
                        sm_scale: float, window=None, native: bool = False):
    """Ragged paged attention on the XLA path, by the C++ kernel (``native``) or in pure jnp
    (same semantics as the Pallas kernel).

    Args:
      q: [T, N, H] queries. k_new, v_new: [T, K, H] this step's keys/values.
      k_cache, v_cache: [L, NB, bs, K, H] pages (the cached context is read from them).
      layer: [] int32 layer index. meta: `AttentionMetadata` (positions, block tables).
      plan: the step's `jaxinfer.xla_work_plan.XlaWorkPlan` (`plan_xla_work` of ``meta``): the
        cached context (positions below ``plan.row_ctx_len``) is read through its work lists.
      sm_scale: softmax scale (H ** -0.5).
      window: [] int32 sliding window of this layer (keys with ``q_pos - k_pos < window``
        are seen), or None (static) for full causal attention.
      native: every token by the C++ kernel (`_native_paged_attention`), which reads the
        step's new K/V from the pages: call it only after `write_kv` (as `paged_attention` does).

    Returns:
      [T, N, H] in q's dtype; float32 accumulation.
    """
    T, N, H = q.shape
    K = k_new.shape[1]
    qg = q.astype(jnp.float32).reshape(T, K, N // K, H) * sm_scale
    if native and meta.block_tables.shape[1] > 0:  # a table with no columns: model init
        return _native_paged_attention(qg, k_cache, v_cache, layer, meta, plan, window).reshape(T, N, H).astype(q.dtype)
    if isinstance(k_cache, QuantKV):  # the new tokens as the pages hold them, like the kernel and later steps
        k_new, v_new = kv_quant.as_stored(k_new, k_cache.kind), kv_quant.as_stored(v_new, v_cache.kind)
    s_new = jnp.einsum("tkgh,ukh->tkgu", qg, k_new.astype(jnp.float32))
    same = (plan.token_seq[:, None] == plan.token_seq[None, :]) & (meta.positions[None, :] <= meta.positions[:, None])
    same = same & _in_window(meta.positions[:, None], meta.positions[None, :], window)
    parts = [_partial_softmax(jnp.where(same[:, None, None, :], s_new, -jnp.inf), v_new)]  # diagonal kept
    if meta.block_tables.shape[1] > 0:  # static: a table with no columns has no context (model init)
        parts.append(_group_context(qg, k_cache, v_cache, layer, meta, plan, window))
        if T > 1:  # a one-token bucket's only row is single-token: it never has B2 work items
            parts.append(_chunk_context(qg, k_cache, v_cache, layer, meta, plan, min(Q_CHUNK, T), window))
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
      q: [T, N, H]; k_cache, v_cache: [L, NB, bs, K, H] arrays, or 8-bit `QuantKV` caches
        (values and per-token scales handed to the kernel, which dequantizes per page); layer: [] int32.
      mesh: the replica's ``(data, model)`` mesh, or None on one device.
      window: [] int32 sliding window of this layer, or None (full causal attention).
    Returns:
      [T, N, H] in q's dtype.
    """
    from pallas_kernels import ragged_paged_attention

    quant = isinstance(k_cache, QuantKV)

    def attend(q, k_cache, v_cache, layer, kv_lens, block_tables, query_start_loc, num_seqs, *extra):
        scales, win = (extra[:2], extra[2:]) if quant else ((), extra)
        # The kernel takes q in the cache dtype (bfloat16 models keep q in float32 up to here);
        # 8-bit pages are dequantized to q's float32 inside it.
        q_in = q if quant else q.astype(k_cache.dtype)
        kw = dict(k_scales=scales[0], v_scales=scales[1]) if quant else {}
        return ragged_paged_attention(q_in, k_cache, v_cache, kv_lens, block_tables,
                                      query_start_loc, num_seqs, sm_scale=sm_scale, layer=layer,
                                      interpret=interpret, sliding_window=win[0] if win else None, **kw).astype(q.dtype)

    if quant:
        pages = (k_cache.values, v_cache.values)
        scales = tuple(jax.lax.bitcast_convert_type(c.scales, jnp.bfloat16) for c in (k_cache, v_cache))
    else:
        pages, scales = (kv_values(k_cache), kv_values(v_cache)), ()
    args = (q,) + pages + (layer, meta.kv_lens, meta.block_tables, meta.query_start_loc,
                           meta.num_seqs) + scales + (() if window is None else (window,))
    tp = 1 if mesh is None else mesh.shape["model"]
    if tp == 1:
        return attend(*args)
    heads = "model" if k_cache.shape[3] % tp == 0 else None  # the cache's own K split (sharding.kv_cache_spec)
    q_spec, kv_spec = P(None, heads, None), P(None, None, None, heads, None)
    scale_specs = (P(None, None, None, heads),) * len(scales)
    in_specs = (q_spec, kv_spec, kv_spec) + (P(),) * 5 + scale_specs + (P(),) * (window is not None)
    sharded = jax.shard_map(attend, mesh=mesh, in_specs=in_specs, out_specs=q_spec, check_vma=False)
    return sharded(*args)


def paged_attention(backend: AttentionBackend, q, k_new, v_new, k_cache, v_cache, layer,
                    meta: AttentionMetadata, sm_scale: float, window=None, plan: XlaWorkPlan | None = None):
    """Write this step's K/V into the pages and attend: the one switch point.

    Args:
      backend: which implementation (`AttentionBackend`).
      q: [T, N, H]; k_new, v_new: [T, K, H]; k_cache, v_cache: [L, NB, bs, K, H];
      layer: [] int32; sm_scale: softmax scale (``H ** -0.5``).
      window: [] int32 sliding window of this layer, or None (static) for full causal attention.
      plan: the step's `jaxinfer.xla_work_plan.XlaWorkPlan`, computed once per step by the
        caller; the XLA backend needs it, the Pallas backend takes None (its kernel reads
        ``meta`` as it is).

    Returns:
      (out [T, N, H], k_cache, v_cache) with the new K/V written.

    Raises:
      ValueError: the XLA backend without a plan.
    """
    if backend.name == "xla" and plan is None:
        raise ValueError("the XLA attention path needs the step's XlaWorkPlan (jaxinfer.xla_work_plan)")
    k_cache = write_kv(k_cache, layer, meta.slot_mapping, k_new)
    v_cache = write_kv(v_cache, layer, meta.slot_mapping, v_new)
    if backend.name == "xla":
        out = xla_paged_attention(q, k_new, v_new, k_cache, v_cache, layer, meta, plan, sm_scale, window,
                                  backend.native)
    else:
        out = pallas_paged_attention(q, k_cache, v_cache, layer, meta, sm_scale, backend.interpret, backend.mesh,
                                     window)
    return out, k_cache, v_cache
