"""The XLA attention backend ("xla", the CPU default): ragged paged attention in pure jnp, or,
on one CPU device with the C++ kernel built (``native``), every token by
`jaxinfer.kernels.cpu.attention`. Owns the path's jnp parts and its per-step preparation, the work
lists of `jaxinfer.layers.attention.xla_work_plan` (`XlaAttention.prepare`, once per step before the layer loop).

With the kernel, after the write every token's query reads its row's pages up to its own
position (a work item is one query, or up to 16 consecutive queries of a prompt chunk sharing
each page read), decode and prefill alike, so a step costs what its tokens' real contexts cost.
Otherwise (a mesh, or no compiler) attention of a token = softmax over
  A. the new keys of its own sequence in this step (causal, from the fresh K/V; a dense
     [T, T] score matrix masked to the token's own row), and
  B. its sequence's *cached context* (positions < ctx_len, gathered from the pages):
     B1 for single-token rows (decodes): an online-softmax loop over a ragged list of
        context groups (a few blocks of one row each), only the groups each row fills;
     B2 for multi-token rows with context (a continuing prefill chunk, or a prefix-cache
        hit): a loop over work items of up to ``Q_CHUNK`` queries of one row, each
        walking that row's context once, only as far as it reaches (no per-token gather),
merged with one shared max (log-sum-exp, `jaxinfer.layers.attention.softmax`). A
sliding-window layer (``window`` W, a traced per-layer scalar) also masks keys with
``q_pos - k_pos >= W`` in every part; in B1 and B2 its pages below the window are still walked
(masked), as the work lists (one plan per step) are shared by all layers. Part A grows with
the square of the step's tokens (a 512-token prefill step spent most of its time there:
`benchmarks/results/2026-12-02-cpu2-bf16-default/`), which is why the kernel takes every token.
Same semantics as the Pallas kernel (vLLM's ragged paged attention). Einsum letters: T tokens,
K kv heads, G query heads per kv head, H head dim, S context.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jaxinfer.kernels.cpu import attention as native_attention
from jaxinfer.layers.attention.base import AttentionBackend
from jaxinfer.layers.attention.kv_storage import KVStorage
from jaxinfer.layers.attention.softmax import fold, fold_segments, in_window, init_state, merge, partial_softmax
from jaxinfer.layers.step_metadata import AttentionMetadata
from jaxinfer.layers.attention.xla_work_plan import (GROUP_BLOCKS, Q_CHUNK, XlaWorkPlan, groups_per_iter,  # registers AttentionMetadata
                                    plan_xla_work)


@dataclasses.dataclass(frozen=True)
class XlaAttention(AttentionBackend):
    """The XLA path (`xla_paged_attention`); works on any platform and under a mesh (XLA's
    SPMD partitioner splits it).

    Attributes:
      native: every token's attention by the C++ kernel (`jaxinfer.kernels.cpu.attention`) instead
        of the jnp parts; one CPU device only (any cache format: float32, bit-stored bfloat16,
        int8 or fp8 with their scales).
    """

    name: ClassVar[str] = "xla"
    native: bool = False

    def prepare(self, meta: AttentionMetadata, block_size: int) -> XlaWorkPlan:
        """The step's work lists, `jaxinfer.layers.attention.xla_work_plan.plan_xla_work` of ``meta``."""
        return plan_xla_work(meta, block_size)

    def forward(self, q, k_new, v_new, k_cache, v_cache, layer, meta, sm_scale, window, prepared):
        """`xla_paged_attention` with this step's plan (``prepared``).

        Raises:
          ValueError: no plan (``prepared`` is None).
        """
        if prepared is None:
            raise ValueError("the XLA attention path needs the step's XlaWorkPlan (XlaAttention.prepare)")
        return xla_paged_attention(q, k_new, v_new, k_cache, v_cache, layer, meta, prepared, sm_scale, window,
                                   self.native, pin=self.keep_layout)


def _pinned(pin, pages):
    """``pin(pages)``, or the pages as read where there is no pin (one device)."""
    return pages if pin is None else pin(pages)


def _group_context(qg, k_cache, v_cache, layer, meta, plan, kv: KVStorage, window=None, pin=None):
    """B1: each single-token row's query against its cached context, scattered back to [T].

    The context is cut into groups of `GROUP_BLOCKS` blocks; the step's plan lists only the
    groups each row's context fills (``plan.group_row``, ``plan.group_index``, sorted by
    row), so a row of 200 tokens next to one of 2,000 reads 200, not 2,000, and bucket
    padding is never read. A loop iteration takes ``groups_per_iter`` groups of any rows,
    gathers their blocks (one gather by (layer, block), no per-layer copy) and folds their
    scores into each row's running (max, sum, weighted values) with segment reductions
    (`softmax.fold_segments`): the online softmax of FlashAttention (Dao et al., 2022), over a
    ragged work list as in vLLM's ragged paged attention. Iterations run only up to ``plan.num_groups``.
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

    def body(j, carry):
        rows = jax.lax.dynamic_slice_in_dim(plan.group_row, j * P, P)
        grp = jax.lax.dynamic_slice_in_dim(plan.group_index, j * P, P)
        blocks = tables[rows[:, None], grp[:, None] * c + jnp.arange(c)]  # [P, c]
        k = _pinned(pin, kv.gather_pages(k_cache, layer, blocks)).reshape(P, span, K, H)
        v = _pinned(pin, kv.gather_pages(v_cache, layer, blocks)).reshape(P, span, K, H)
        s = jnp.einsum("pkgh,pskh->pkgs", q[rows], k.astype(jnp.float32))
        pos = grp[:, None] * span + jnp.arange(span)
        valid = (pos < ctx_len[rows][:, None]) & in_window(q_pos[rows][:, None], pos, window)
        return fold_segments(carry, jnp.where(valid[:, None, None, :], s, -jnp.inf), v, rows, R + 1)

    init = init_state((R + 1, K, G), H)
    m, l, a = jax.lax.fori_loop(0, (plan.num_groups + P - 1) // P, body, init)
    to = lambda init, x: init.at[plan.row_last].set(x[:R], mode="drop")  # noqa: E731
    return (to(jnp.full((T, K, G), -jnp.inf), m), to(jnp.zeros((T, K, G)), l), to(jnp.zeros((T, K, G, H)), a))


CHUNK_CTX_BLOCKS = 16  # blocks of context one B2 inner iteration reads


def _chunk_context(qg, k_cache, v_cache, layer, meta, plan, kv: KVStorage, q_chunk: int, window=None,
                   pin=None):
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
    init = init_state((T + q_chunk, K, G), H)

    def item(i, acc):
        row, start, n = plan.item_row[i], plan.item_start[i], plan.item_len[i]
        q = jax.lax.dynamic_slice_in_dim(qp, start, q_chunk)
        live = jnp.arange(q_chunk) < n
        q_pos = jax.lax.dynamic_slice_in_dim(pos_p, start, q_chunk)[:, None]

        def step(j, carry):
            blocks = jax.lax.dynamic_slice_in_dim(tables[row], j * c, c)
            kc = _pinned(pin, kv.gather_pages(k_cache, layer, blocks)).reshape(span, K, H)
            vc = _pinned(pin, kv.gather_pages(v_cache, layer, blocks)).reshape(span, K, H)
            s = jnp.einsum("qkgh,skh->qkgs", q, kc.astype(jnp.float32))
            k_pos = (j * span + jnp.arange(span))[None, :]
            valid = (k_pos < plan.row_ctx_len[row]) & live[:, None] & in_window(q_pos, k_pos, window)
            return fold(carry, jnp.where(valid[:, None, None, :], s, -jnp.inf), vc)

        part = jax.lax.fori_loop(0, (plan.row_ctx_len[row] + span - 1) // span, step, init_state((q_chunk, K, G), H))
        out = []
        for old, new in zip(acc, part):
            cur = jax.lax.dynamic_slice_in_dim(old, start, q_chunk)
            keep = live.reshape((q_chunk,) + (1,) * (new.ndim - 1))
            out.append(jax.lax.dynamic_update_slice_in_dim(old, jnp.where(keep, new, cur), start, 0))
        return tuple(out)

    m, l, a = jax.lax.fori_loop(0, plan.num_items, item, init)
    return m[:T], l[:T], a[:T]


def _native_paged_attention(qg, k_cache, v_cache, layer, meta, plan, kv: KVStorage, window=None):
    """Every packed token against its row's pages by the C++ kernel
    (`jaxinfer.kernels.cpu.attention.paged_context`): each token's query sees the keys at positions
    ``<= positions[t]`` of row ``plan.token_seq[t]``. The step's own K/V must already be in the
    pages (`AttentionBackend.__call__` writes them first), so the new tokens need no separate part and
    nothing is merged; padding tokens (row -1) read nothing and give 0.

    Returns [T, K, G, H] float32, normalised."""
    R = meta.block_tables.shape[0]
    live = plan.token_seq >= 0
    tables = meta.block_tables[jnp.clip(plan.token_seq, 0, R - 1)]  # [T, W]: each token's row's table
    ctx = jnp.where(live, meta.positions + 1, 0)
    (k_pages, k_scales), (v_pages, v_scales) = kv.kernel_operands(k_cache), kv.kernel_operands(v_cache)
    _, l, acc = native_attention.paged_context(qg, k_pages, v_pages, layer, tables, ctx, meta.positions, window,
                                               k_scales=k_scales, v_scales=v_scales)
    return acc / jnp.where(l > 0, l, 1.0)[..., None]


def xla_paged_attention(q, k_new, v_new, k_cache, v_cache, layer, meta: AttentionMetadata, plan: XlaWorkPlan,
                        sm_scale: float, window=None, native: bool = False, pin=None):
    """Ragged paged attention on the XLA path, by the C++ kernel (``native``) or in pure jnp
    (same semantics as the Pallas kernel).

    Args:
      q: [T, N, H] queries. k_new, v_new: [T, K, H] this step's keys/values.
      k_cache, v_cache: [L, NB, bs, K, H] pages (the cached context is read from them).
      layer: [] int32 layer index. meta: `AttentionMetadata` (positions, block tables).
      plan: the step's `jaxinfer.layers.attention.xla_work_plan.XlaWorkPlan` (`XlaAttention.prepare` of ``meta``): the
        cached context (positions below ``plan.row_ctx_len``) is read through its work lists.
      sm_scale: softmax scale (H ** -0.5).
      window: [] int32 sliding window of this layer (keys with ``q_pos - k_pos < window``
        are seen), or None (static) for full causal attention.
      native: every token by the C++ kernel (`_native_paged_attention`), which reads the
        step's new K/V from the pages: call it only after `write_kv` (as `XlaAttention.__call__` does).
      pin: applied to every block of pages read from the cache ([..., K, H], before any reshape);
        under a mesh `AttentionBackend.keep_layout`, so the pages are read in the cache's own
        layout. Without it, where TP does not divide the KV heads (the cache replicated), XLA
        split the read pages by KV head like the grouped queries and did so by slicing each
        device's heads out of the whole cache, every layer: a temporary of L x NB pages x
        (the heads per device) per device (17 GB of Qwen3-30B-A3B's 69 GB cache at TP 8, K 4;
        found by ``python -m jaxinfer.plan --compile``). None: as read.

    Returns:
      [T, N, H] in q's dtype; float32 accumulation.
    """
    T, N, H = q.shape
    K = k_new.shape[1]
    kv = KVStorage.of(k_cache)
    qg = q.astype(jnp.float32).reshape(T, K, N // K, H) * sm_scale
    if native and meta.block_tables.shape[1] > 0:  # a table with no columns: model init
        out = _native_paged_attention(qg, k_cache, v_cache, layer, meta, plan, kv, window)
        return out.reshape(T, N, H).astype(q.dtype)
    # the new tokens as the pages hold them (an 8-bit cache's rounding), like the kernel and later steps
    k_new, v_new = kv.as_stored(k_new), kv.as_stored(v_new)
    s_new = jnp.einsum("tkgh,ukh->tkgu", qg, k_new.astype(jnp.float32))
    same = (plan.token_seq[:, None] == plan.token_seq[None, :]) & (meta.positions[None, :] <= meta.positions[:, None])
    same = same & in_window(meta.positions[:, None], meta.positions[None, :], window)
    parts = [partial_softmax(jnp.where(same[:, None, None, :], s_new, -jnp.inf), v_new)]  # diagonal kept
    if meta.block_tables.shape[1] > 0:  # static: a table with no columns has no context (model init)
        parts.append(_group_context(qg, k_cache, v_cache, layer, meta, plan, kv, window, pin))
        if T > 1:  # a one-token bucket's only row is single-token: it never has B2 work items
            parts.append(_chunk_context(qg, k_cache, v_cache, layer, meta, plan, kv, min(Q_CHUNK, T), window, pin))
    return merge(parts).reshape(T, N, H).astype(q.dtype)
