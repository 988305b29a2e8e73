"""Pure-jnp ragged paged attention, and the query-block plan the kernel shares.

This module owns two things:

* ``plan_query_blocks`` / ``gather_query_blocks`` / ``scatter_query_blocks``: how a
  ragged batch of packed query rows is cut into fixed-size *work items* (at most
  ``q_block`` consecutive rows of one sequence each). Both the Pallas kernel in
  ``ragged_paged_attention.py`` and the reference below walk the same plan.
* ``ragged_paged_attention_reference``: the XLA implementation of the contract in
  ``README.md``. It gathers the KV pages once per work item (so once per sequence
  for decode, once per ``q_block`` rows for prefill), never once per token, and
  computes in float32. The engine may use it as its non-Pallas attention path.

Sources: PagedAttention (Kwon et al., SOSP 2023) for the block-table KV layout;
ragged paged attention as in tpu-inference for the packed ragged query layout.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

# Rows a real query can never see are given this score. Finite (not -inf) so that a
# fully masked row never computes inf - inf.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


class QueryBlockPlan(NamedTuple):
    """Fixed-size work items covering every real packed query row once.

    Work item ``w`` holds rows ``q_start[w] .. q_start[w] + num_rows[w] - 1`` of
    sequence ``seq[w]``; its first row sits at position ``q_pos[w]`` of that sequence.
    Items past the real ones have ``num_rows == 0`` and ``kv_len == 0``.
    """

    seq: jax.Array  # [W] int32, clamped to a valid sequence index
    q_start: jax.Array  # [W] int32, first packed row of the item
    num_rows: jax.Array  # [W] int32, real rows in the item (0..q_block)
    q_pos: jax.Array  # [W] int32, position of the item's first row
    kv_len: jax.Array  # [W] int32, context length of the item's sequence
    row_slot: jax.Array  # [T] int32, flat index w * q_block + r of each packed row
    row_valid: jax.Array  # [T] bool, row belongs to a real sequence


def check_inputs(q, k_pages, v_pages, kv_lens, block_tables, query_start_loc,
                 num_seqs, layer, k_scales=None, v_scales=None) -> None:
    """Static shape/dtype checks of the ragged paged attention contract (with scales:
    8-bit int8 / float8_e4m3fn pages and float ``[..., K]`` scales of the pages' shape
    without H).

    Raises:
      ValueError: a rank or a dimension disagrees with the contract.
      TypeError: a dtype disagrees (float q/pages of one dtype, integer metadata).
    """
    want_rank = 4 if layer is None else 5
    if q.ndim != 3:
        raise ValueError(f"q must be [T, N, H], got shape {q.shape}")
    if k_pages.ndim != want_rank or k_pages.shape != v_pages.shape:
        raise ValueError(
            f"k_pages/v_pages must both be {'[L, ' if layer is not None else '['}"
            f"num_blocks, block_size, K, H] (layer={'set' if layer is not None else 'None'}),"
            f" got {k_pages.shape} and {v_pages.shape}")
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_pages.shape[-2]
    if k_pages.shape[-1] != head_dim:
        raise ValueError(f"head dim of q ({head_dim}) != pages ({k_pages.shape[-1]})")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"query heads {num_q_heads} not a multiple of KV heads {num_kv_heads}")
    if (k_scales is None) != (v_scales is None):
        raise ValueError("pass both k_scales and v_scales, or neither")
    if k_scales is not None:
        if k_scales.shape != k_pages.shape[:-1] or v_scales.shape != k_scales.shape:
            raise ValueError(f"k_scales/v_scales must be {k_pages.shape[:-1]}, got "
                             f"{k_scales.shape} and {v_scales.shape}")
        eight = (jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn))
        if (k_pages.dtype not in eight or v_pages.dtype != k_pages.dtype
                or not jnp.issubdtype(q.dtype, jnp.floating)
                or not jnp.issubdtype(k_scales.dtype, jnp.floating)):
            raise TypeError(f"with scales, pages must be int8 or float8_e4m3fn and q, scales float; got "
                            f"{q.dtype}, {k_pages.dtype}, {v_pages.dtype}, {k_scales.dtype}")
    elif not (jnp.issubdtype(q.dtype, jnp.floating) and q.dtype == k_pages.dtype == v_pages.dtype):
        raise TypeError(f"q, k_pages, v_pages must share one float dtype, got "
                        f"{q.dtype}, {k_pages.dtype}, {v_pages.dtype}")
    if num_tokens < 1:
        raise ValueError("q must have at least one row")
    num_seqs_max = kv_lens.shape[0] if kv_lens.ndim == 1 else -1
    if kv_lens.ndim != 1 or block_tables.ndim != 2 or block_tables.shape[0] != num_seqs_max:
        raise ValueError(f"kv_lens must be [S] and block_tables [S, max_blocks], got "
                         f"{kv_lens.shape} and {block_tables.shape}")
    if query_start_loc.shape != (num_seqs_max + 1,):
        raise ValueError(f"query_start_loc must be [S+1] = [{num_seqs_max + 1}], got "
                         f"{query_start_loc.shape}")
    for name, x in (("kv_lens", kv_lens), ("block_tables", block_tables),
                    ("query_start_loc", query_start_loc), ("num_seqs", num_seqs),
                    ("layer", layer)):
        if x is not None and not jnp.issubdtype(jnp.result_type(x), jnp.integer):
            raise TypeError(f"{name} must be an integer array, got {jnp.result_type(x)}")
    if jnp.ndim(num_seqs) != 0 or (layer is not None and jnp.ndim(layer) != 0):
        raise ValueError("num_seqs and layer must be scalars")


def num_work_items(num_tokens: int, num_seqs_max: int, q_block: int, *,
                   decode: bool = False) -> int:
    """Static upper bound W on the work items of any ragged batch.

    A real sequence with ``n`` rows needs ``ceil(n / q_block)`` items, at most ``n``
    and at most ``(n + q_block - 1) / q_block``; summed over sequences that is at most
    ``T`` and at most ``(T + S * (q_block - 1)) // q_block``. A decode-only batch
    (every ``n <= 1``) needs at most ``min(T, S)``.
    """
    if decode:
        return max(1, min(num_tokens, num_seqs_max))
    return max(1, min(num_tokens, (num_tokens + num_seqs_max * (q_block - 1)) // q_block))


def plan_query_blocks(kv_lens, query_start_loc, num_seqs, *, num_tokens: int,
                      q_block: int, num_work: int) -> QueryBlockPlan:
    """Cuts the packed rows of each real sequence into items of ``q_block`` rows.

    Args:
      kv_lens: [S] int32, context length of each sequence (new tokens included).
      query_start_loc: [S+1] int32, packed row offsets.
      num_seqs: int32 scalar, sequences at or past it are padding.
      num_tokens: static T, packed rows.
      q_block: static rows per item.
      num_work: static number of items W (see ``num_work_items``).

    Returns:
      A ``QueryBlockPlan``.
    """
    kv_lens = kv_lens.astype(jnp.int32)
    qsl = query_start_loc.astype(jnp.int32)
    num_seqs_max = kv_lens.shape[0]
    real_seq = jnp.arange(num_seqs_max, dtype=jnp.int32) < num_seqs
    q_lens = jnp.where(real_seq, jnp.maximum(qsl[1:] - qsl[:-1], 0), 0)
    blocks = (q_lens + q_block - 1) // q_block
    ends = jnp.cumsum(blocks, dtype=jnp.int32)
    starts = ends - blocks

    w = jnp.arange(num_work, dtype=jnp.int32)
    seq = jnp.minimum(jnp.searchsorted(ends, w, side="right").astype(jnp.int32),
                      num_seqs_max - 1)
    j = w - starts[seq]
    valid = w < ends[-1]
    num_rows = jnp.where(valid, jnp.clip(q_lens[seq] - j * q_block, 0, q_block), 0)
    kv_len = jnp.where(valid, kv_lens[seq], 0)
    q_pos = jnp.where(valid, kv_lens[seq] - q_lens[seq] + j * q_block, 0)
    q_start = qsl[seq] + j * q_block

    t = jnp.arange(num_tokens, dtype=jnp.int32)
    num_real = jnp.clip(num_seqs, 0, num_seqs_max)
    row_valid = t < qsl[num_real]
    row_seq = jnp.minimum(jnp.searchsorted(qsl[1:], t, side="right").astype(jnp.int32),
                          num_seqs_max - 1)
    offset = jnp.maximum(t - qsl[row_seq], 0)
    row_work = starts[row_seq] + offset // q_block
    row_slot = row_work * q_block + offset % q_block
    row_slot = jnp.where(row_valid, jnp.clip(row_slot, 0, num_work * q_block - 1), 0)
    return QueryBlockPlan(seq, q_start, num_rows, q_pos, kv_len, row_slot, row_valid)


def gather_query_blocks(q, plan: QueryBlockPlan, q_block: int):
    """[T, N, H] packed rows -> [W, q_block, N, H] rows of each work item."""
    rows = plan.q_start[:, None] + jnp.arange(q_block, dtype=jnp.int32)[None, :]
    return q[jnp.clip(rows, 0, q.shape[0] - 1)]


def scatter_query_blocks(out_blocks, plan: QueryBlockPlan):
    """[W, q_block, N, H] item outputs -> [T, N, H] packed rows (padding rows 0)."""
    num_work, q_block = out_blocks.shape[:2]
    flat = out_blocks.reshape(num_work * q_block, *out_blocks.shape[2:])
    out = flat[plan.row_slot]
    return jnp.where(plan.row_valid[:, None, None], out, jnp.zeros((), out.dtype))


def decode_only(query_start_loc, num_seqs):
    """True when every real sequence has at most one new row (traced bool)."""
    qsl = query_start_loc.astype(jnp.int32)
    real = jnp.arange(qsl.shape[0] - 1) < num_seqs
    return jnp.all(jnp.where(real, qsl[1:] - qsl[:-1], 0) <= 1)


def stack_layer_view(k_pages, v_pages, layer):
    """Returns ``(k5, v5, layer)`` with pages as [L, num_blocks, block_size, K, H].

    An unstacked [num_blocks, block_size, K, H] cache becomes a one-layer stack (a
    reshape, no copy). ``layer`` is clamped to ``[0, L - 1]``.
    """
    if layer is None:
        return k_pages[None], v_pages[None], jnp.zeros((), jnp.int32)
    num_layers = k_pages.shape[0]
    return k_pages, v_pages, jnp.clip(jnp.asarray(layer, jnp.int32), 0, num_layers - 1)


def _attend_blocks(q_blk, k5, v5, layer, block_tables, plan, sm_scale, window=None):
    """Attention of every work item against its own sequence's pages (float32).

    q_blk: [W, B, N, H]; returns [W, B, N, H] float32.
    """
    num_work, q_block, num_q_heads, head_dim = q_blk.shape
    _, _, block_size, num_kv_heads, _ = k5.shape
    group = num_q_heads // num_kv_heads
    max_keys = block_tables.shape[1] * block_size

    pages = block_tables[plan.seq]  # [W, MB]
    k = k5[layer, pages].reshape(num_work, max_keys, num_kv_heads, head_dim)
    v = v5[layer, pages].reshape(num_work, max_keys, num_kv_heads, head_dim)
    key_pos = jnp.arange(max_keys, dtype=jnp.int32)
    key_ok = key_pos[None, :] < plan.kv_len[:, None]  # [W, C]
    v = jnp.where(key_ok[:, :, None, None], v, jnp.zeros((), v.dtype))

    q = q_blk.reshape(num_work, q_block, num_kv_heads, group, head_dim)
    s = jnp.einsum("wbkgh,wckh->wkgbc", q, k, precision=lax.Precision.HIGHEST,
                   preferred_element_type=jnp.float32) * sm_scale
    row = jnp.arange(q_block, dtype=jnp.int32)
    row_pos = plan.q_pos[:, None] + row[None, :]  # [W, B]
    row_ok = row[None, :] < plan.num_rows[:, None]
    mask = ((key_pos[None, None, :] <= row_pos[:, :, None])
            & key_ok[:, None, :] & row_ok[:, :, None])  # [W, B, C]
    if window is not None:
        mask = mask & (row_pos[:, :, None] - key_pos[None, None, :] < window)
    mask = mask[:, None, None]  # [W, 1, 1, B, C]
    s = jnp.where(mask, s, MASK_VALUE)
    p = jnp.where(mask, jnp.exp(s - s.max(axis=-1, keepdims=True)), 0.0)
    denom = p.sum(axis=-1, keepdims=True)
    p = p / jnp.where(denom > 0, denom, 1.0)
    out = jnp.einsum("wkgbc,wckh->wbkgh", p, v.astype(jnp.float32),
                     precision=lax.Precision.HIGHEST,
                     preferred_element_type=jnp.float32)
    return out.reshape(num_work, q_block, num_q_heads, head_dim)


def _reference_path(q, k5, v5, layer, kv_lens, block_tables, query_start_loc,
                    num_seqs, window, sm_scale, q_block, decode):
    num_tokens = q.shape[0]
    num_work = num_work_items(num_tokens, kv_lens.shape[0], q_block, decode=decode)
    plan = plan_query_blocks(kv_lens, query_start_loc, num_seqs,
                             num_tokens=num_tokens, q_block=q_block, num_work=num_work)
    out = _attend_blocks(gather_query_blocks(q, plan, q_block), k5, v5, layer,
                         block_tables, plan, sm_scale, window)
    return scatter_query_blocks(out.astype(q.dtype), plan)


@functools.partial(jax.jit, static_argnames=("sm_scale", "q_block_size"))
def ragged_paged_attention_reference(q, k_pages, v_pages, kv_lens, block_tables,
                                     query_start_loc, num_seqs, *, sm_scale=None,
                                     layer=None, sliding_window=None, q_block_size: int = 16):
    """Causal GQA attention of packed ragged queries over a paged KV cache, in jnp.

    Same contract as ``jaxinfer.kernels.pallas.ragged_paged_attention`` (see README.md).
    Decode-only batches (every real sequence has at most one new row) take a path
    with one row per work item; others use ``q_block_size`` rows per item. Memory:
    the K/V pages of each work item's sequence are gathered at the full block-table
    width, i.e. ``W * max_blocks * block_size * K * H`` elements for K and for V,
    with ``W <= min(T, (T + S * (q_block_size - 1)) // q_block_size)`` (``min(T, S)``
    for decode). Time and memory scale with ``max_blocks``: pass block tables only as
    wide as the batch's longest context needs (e.g. a bucket of widths).

    Args:
      q: [T, N, H] float, packed new rows of all sequences.
      k_pages, v_pages: [num_blocks, block_size, K, H] (or [L, ...] with ``layer``).
      kv_lens: [S] int32, context length of each sequence, new rows included.
      block_tables: [S, max_blocks] int32, page ids of each sequence.
      query_start_loc: [S+1] int32, packed row offsets of each sequence.
      num_seqs: int32 scalar; sequences at or past it are padding.
      sm_scale: static float, default ``H ** -0.5``.
      layer: optional int32 scalar selecting the layer of stacked pages.
      sliding_window: optional int32 scalar: a row at position p sees keys
        ``p - sliding_window + 1 .. p``; None: all keys up to p.
      q_block_size: static rows per work item for non-decode batches.

    Returns:
      [T, N, H] in q's dtype; rows past ``query_start_loc[num_seqs]`` are zero.

    Raises:
      ValueError, TypeError: as ``check_inputs``.
    """
    check_inputs(q, k_pages, v_pages, kv_lens, block_tables, query_start_loc,
                 num_seqs, layer)
    if sm_scale is None:
        sm_scale = q.shape[-1] ** -0.5
    k5, v5, layer_idx = stack_layer_view(k_pages, v_pages, layer)
    arrays = (q, k5, v5, layer_idx, kv_lens.astype(jnp.int32),
              block_tables.astype(jnp.int32), query_start_loc.astype(jnp.int32),
              jnp.asarray(num_seqs, jnp.int32),
              None if sliding_window is None else jnp.asarray(sliding_window, jnp.int32))
    scale = float(sm_scale)
    return lax.cond(decode_only(query_start_loc, num_seqs),
                    lambda *a: _reference_path(*a, scale, 1, True),
                    lambda *a: _reference_path(*a, scale, q_block_size, False),
                    *arrays)
