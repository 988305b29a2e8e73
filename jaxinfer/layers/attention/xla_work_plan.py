"""The XLA attention path's work lists, derived inside the jitted step.

The host sends only the standard ragged step contract (`jaxinfer.layers.step_metadata.AttentionMetadata`:
``query_start_loc``, ``kv_lens``, ``num_seqs``, ``block_tables``, ...). This module owns what
`jaxinfer.layers.attention.xla.xla_paged_attention` additionally walks, the `XlaWorkPlan`, and
`plan_xla_work`, the jnp function that computes it from the contract. The model computes it
once per step, before its layer loop (`jaxinfer.layers.attention.xla.XlaAttention.prepare`, called
by `jaxinfer.models.llama.LlamaForCausalLM`), and every layer reads the same plan.

Also the XLA path's tiling constants (`Q_CHUNK`, `GROUP_BLOCKS`, `GROUPS_PER_ITER`,
`MIN_GROUPS_PER_ITER`), read by `jaxinfer.layers.attention.xla` at trace time, and the pytree registration
of `AttentionMetadata` (the host-side `jaxinfer.layers.step_metadata` imports no JAX).

With the C++ kernel (`jaxinfer.layers.attention.xla.XlaAttention.native`), attention reads only
``token_seq``; the other lists serve the jnp path (small int32 work lists, built either way).

The plan's array lengths follow the bucket only (T tokens, R rows, W table columns): the static
bounds `num_work_items` and `num_context_groups`, so a step's executable depends on its bucket
and nothing else.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.layers.attention import base  # noqa: F401 - registers AttentionMetadata as a pytree
from jaxinfer.layers.step_metadata import AttentionMetadata

Q_CHUNK = 64  # queries per context work item of the XLA attention path (B2)
GROUP_BLOCKS = 4  # blocks per context group of a single-token row (XLA path, B1)
GROUPS_PER_ITER = 32  # context groups one B1 loop iteration reads at most
# ... and at least, however few rows the bucket has. More than 1 measured no faster for a
# lone stream (benchmarks/onestream_probe.py: the gathered blocks cost, not the loop's
# iterations); kept as the probe's knob.
MIN_GROUPS_PER_ITER = 1



def num_work_items(num_tokens: int, num_rows: int) -> int:
    """Static bound on context work items of a bucket (each row may add a partial one)."""
    return -(-num_tokens // min(Q_CHUNK, num_tokens)) + num_rows


def groups_per_iter(num_rows: int) -> int:
    """Context groups per B1 loop iteration for a bucket of ``num_rows`` rows: one per row,
    within [`MIN_GROUPS_PER_ITER`, `GROUPS_PER_ITER`]."""
    return min(GROUPS_PER_ITER, max(MIN_GROUPS_PER_ITER, num_rows))


def num_context_groups(num_rows: int, ctx_blocks: int) -> int:
    """Static bound on B1 context groups of a bucket: every row's whole table width in
    groups of `GROUP_BLOCKS`, rounded up to whole loop iterations."""
    n = num_rows * -(-ctx_blocks // GROUP_BLOCKS)
    p = groups_per_iter(num_rows)
    return max(p, -(-n // p) * p)


@dataclasses.dataclass(frozen=True)
class XlaWorkPlan:
    """Per-step work lists of the XLA attention path (all int32 ``jax.Array``; a pytree).

    Attributes:
      token_seq: [T] row of each packed token; -1 past ``query_start_loc[num_seqs]``.
      row_ctx_len: [R] cached context length of each row, ``kv_lens - n`` for a row of n new
        tokens (0 for padding rows).
      row_last: [R] packed index of a single-token row's token (B1 query); T for other rows.
      item_row, item_start, item_len: [C] B2 work items (C = `num_work_items`)
        of the multi-token rows with context, in row order: row, first packed token, number of
        queries (<= ``min(Q_CHUNK, T)``); 0, 0, 0 past num_items.
      num_items: [] B2 items in use.
      group_row, group_index: [NG] B1 context groups (NG = `num_context_groups`)
        of the single-token rows, sorted by row: group g of a row covers its table columns
        [g * GROUP_BLOCKS, (g + 1) * GROUP_BLOCKS); row R and index 0 past num_groups.
      num_groups: [] B1 groups in use.
    """

    token_seq: jax.Array
    row_ctx_len: jax.Array
    row_last: jax.Array
    item_row: jax.Array
    item_start: jax.Array
    item_len: jax.Array
    num_items: jax.Array
    group_row: jax.Array
    group_index: jax.Array
    num_groups: jax.Array


jax.tree_util.register_dataclass(XlaWorkPlan)


def plan_xla_work(meta: AttentionMetadata, block_size: int) -> XlaWorkPlan:
    """The XLA path's work lists of one step, from its ragged contract (traceable; one call per step).

    Args:
      meta: the step's `AttentionMetadata` (reads ``query_start_loc`` [R+1], ``kv_lens`` [R],
        ``num_seqs`` [], and the static shapes of ``positions`` [T] and ``block_tables`` [R, W]).
      block_size: tokens per KV block (static).

    Returns:
      `XlaWorkPlan` of the bucket's static sizes. A single-token row gets
      ``ceil(ctx / (GROUP_BLOCKS * block_size))`` B1 groups; a multi-token row with context gets
      ``ceil(n / min(Q_CHUNK, T))`` B2 items; other rows get neither (their context is empty, or
      they are padding).
    """
    T = meta.positions.shape[0]
    R, W = meta.block_tables.shape
    qsl = meta.query_start_loc.astype(jnp.int32)
    real = jnp.arange(R) < meta.num_seqs
    n = jnp.where(real, qsl[1:] - qsl[:-1], 0)
    ctx = jnp.where(real, meta.kv_lens - n, 0)
    single = real & (n == 1)
    t = jnp.arange(T, dtype=jnp.int32)
    token_seq = jnp.where(t < qsl[meta.num_seqs], jnp.searchsorted(qsl[1:], t, side="right"), -1)
    span = GROUP_BLOCKS * block_size
    group_row, group_index, num_groups = _ragged_slots(jnp.where(single, (ctx + span - 1) // span, 0),
                                                       num_context_groups(R, W))
    q_chunk = min(Q_CHUNK, T)
    chunked = real & (n != 1) & (ctx > 0)
    row, index, num_items = _ragged_slots(jnp.where(chunked, (n + q_chunk - 1) // q_chunk, 0),
                                          num_work_items(T, R))
    used = row < R
    at = jnp.minimum(row, R - 1)
    i32 = lambda x: x.astype(jnp.int32)  # noqa: E731
    return XlaWorkPlan(
        token_seq=i32(token_seq), row_ctx_len=i32(ctx), row_last=i32(jnp.where(single, qsl[:-1], T)),
        item_row=i32(jnp.where(used, row, 0)), item_start=i32(jnp.where(used, qsl[at] + index * q_chunk, 0)),
        item_len=i32(jnp.where(used, jnp.minimum(q_chunk, n[at] - index * q_chunk), 0)), num_items=num_items,
        group_row=group_row, group_index=group_index, num_groups=num_groups)


def _ragged_slots(counts: jax.Array, num_slots: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Lay ``counts[i]`` consecutive slots per row i (counts: [R] int32 >= 0) into ``num_slots``
    static slots in row order.

    Returns:
      (row [num_slots] int32, R past the last used slot; index [num_slots] int32, the slot's
      rank within its row, 0 past the last used slot; used [] int32, ``sum(counts)``).
      Slots beyond ``num_slots`` are dropped (the callers' static bounds leave none).
    """
    R = counts.shape[0]
    ends = jnp.cumsum(counts)
    slots = jnp.arange(num_slots, dtype=jnp.int32)
    row = jnp.searchsorted(ends, slots, side="right").astype(jnp.int32)
    first = (ends - counts)[jnp.minimum(row, R - 1)]
    index = jnp.where(row < R, slots - first, 0).astype(jnp.int32)
    return row, index, ends[-1].astype(jnp.int32)
