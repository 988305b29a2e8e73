"""Ragged paged attention: the Pallas kernel and its validated, jitted wrapper.

This module owns the kernel body (one program per (work item, KV head), walking the
sequence's block table with ``lax.fori_loop`` and a FlashAttention-style online
softmax; with a sliding window it starts at the first page the item's window reaches
and masks older keys) and ``ragged_paged_attention``, the public entry point. The work plan
(which packed query rows each program handles) and the pure-jnp reference live in
``reference.py``; the contract and the GPU backend choice are in ``README.md``.

Layout inside the kernel: a work item holds up to ``q_block`` consecutive query rows
of one sequence. The ``G = N / K`` query heads that share a KV head are padded to a
power of two ``G_pad`` and folded into the row axis, so one program multiplies a
``[R, H]`` tile (``R = max(16, q_block * G_pad)`` rows, row ``r`` being token
``r // G_pad``) by one ``[block_size, H]`` page of K and V at a time. Decode-only
batches use ``q_block = 1`` (one program per sequence and KV head).

GPU: compiled through Pallas's Triton lowering (``compiler_params`` of
``jax.experimental.pallas.triton``); every array the kernel touches is a power of
two and every dot has M, N, K >= 16 as Triton requires. CPU: ``interpret=True``.
JAX 0.11 deprecated the Triton backend (`TRITON_DEPRECATION`, filtered here by its exact text
only); this kernel stays for GPUs without Hopper's TMA and WGMMA (sm80-sm89), and for the
caches the Mosaic GPU kernel (``mosaic_paged_attention.py``) does not read (float32, 8-bit).

The online softmax here is the kernel's own in-kernel form (finite ``MASK_VALUE`` instead of
-inf, ``[R, 1]`` statistics, HIGHEST-precision dots on 2-D tiles), not the XLA path's
`jaxinfer.layers.attention.softmax`: the kernel body must stay Triton-lowerable and this
package imports nothing from jaxinfer; sharing it would change the compiled kernel.

Sources: PagedAttention (Kwon et al., SOSP 2023); FlashAttention online softmax
(Dao et al., 2022; Milakov & Gimelshein 2018); ragged paged attention as in tpu-inference.
"""

from __future__ import annotations

import functools
import re
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxinfer.kernels.pallas.reference import (
    MASK_VALUE,
    QueryBlockPlan,
    check_inputs,
    decode_only,
    gather_query_blocks,
    num_work_items,
    plan_query_blocks,
    scatter_query_blocks,
    stack_layer_view,
)

# The DeprecationWarning JAX 0.11 gives when a kernel lowers through Pallas's Triton backend, as
# jax 0.11.2 worded it on the H200 run (benchmarks/results/gpu/2026-12-04-h200/call1/tests.log).
TRITON_DEPRECATION = ("The Pallas Triton backend is deprecated and will be removed in a future JAX version. "
                      "To keep using Pallas on GPU, please migrate to the Mosaic GPU backend. To keep using "
                      "Triton, switch to the official Triton bindings and jax_triton.")


def ignore_triton_deprecation() -> None:
    """Silence `TRITON_DEPRECATION` (a DeprecationWarning), matched by its whole exact text; every
    other warning, JAX's other deprecations and any rewording of this one included, still shows."""
    warnings.filterwarnings("ignore", message=re.escape(TRITON_DEPRECATION) + r"\Z", category=DeprecationWarning)


ignore_triton_deprecation()

MIN_ROWS = 16  # Triton's dot needs M >= 16.
NO_WINDOW = 1 << 30  # the sliding window that stands for none (any position difference is below it)
TARGET_PROGRAMS = 256  # decode key splits: aim for about 2 programs per H200 SM (132)
MIN_SPLIT_KEYS = 512
MAX_SPLITS = 16
_DOT_DIMS_QK = (((1,), (1,)), ((), ()))  # [R, H] x [bs, H] -> [R, bs]
_DOT_DIMS_PV = (((1,), (0,)), ((), ()))  # [R, bs] x [bs, H] -> [R, H]


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _kernel(meta_ref, bt_ref, layer_ref, q_ref, k_ref, v_ref, *refs,
            sm_scale: float, group_pad: int, pages_per_step: int, num_splits: int, quantized: bool = False):
    """One (work item, KV head[, key split]) program.

    meta_ref: [W, 4] int32 (seq, q_pos, num_rows, kv_len) per work item.
    bt_ref: [S, max_blocks] int32. layer_ref: [2] int32: the layer, and the sliding window
      (a key is seen when ``row_pos - key_pos < window``; a huge value for none).
    q_ref: [R, H] rows of this item and KV head.
    k_ref / v_ref: [L, num_blocks, block_size, K, H], read one page at a time.
    With ``quantized``, ``refs`` starts with ``ks_ref / vs_ref [L, num_blocks, block_size, K]``,
      the per-token scales of 8-bit pages: a page is dequantized to q's dtype as it is loaded.
    out_refs: ``(o_ref [R, H],)`` normalised, or with ``num_splits > 1`` the split's
      unnormalised partials ``(acc_ref [R, H] f32, m_ref [R, 1] f32, l_ref [R, 1] f32)``
      over its share of the pages (flash-decoding; merged by `_merge_splits`).
    """
    ks_ref, vs_ref, out_refs = (refs[0], refs[1], refs[2:]) if quantized else (None, None, refs)
    w, head = pl.program_id(0), pl.program_id(1)
    seq, q_pos = meta_ref[w, 0], meta_ref[w, 1]
    num_rows, kv_len = meta_ref[w, 2], meta_ref[w, 3]
    layer, window = layer_ref[0], layer_ref[1]
    rows, head_dim = q_ref.shape
    num_blocks, block_size = k_ref.shape[1], k_ref.shape[2]
    max_blocks = bt_ref.shape[1]

    n_keys = jnp.clip(jnp.minimum(q_pos + num_rows, kv_len), 0, max_blocks * block_size)
    num_pages = lax.div(n_keys + block_size - 1, block_size)  # operands >= 0
    num_steps = lax.div(num_pages + pages_per_step - 1, pages_per_step)
    first_key = jnp.maximum(q_pos - window + 1, 0)  # the item's earliest row sees no key before it
    first_step = jnp.minimum(lax.div(lax.div(first_key, block_size), pages_per_step), num_steps)
    row_tok = lax.div(lax.broadcasted_iota(jnp.int32, (rows, 1), 0), group_pad)
    row_pos = q_pos + row_tok  # [R, 1]
    row_ok = row_tok < num_rows
    q = q_ref[...]

    def load_page(j):
        col = jnp.minimum(j, max_blocks - 1)
        page = jnp.clip(bt_ref[seq, col], 0, num_blocks - 1)
        page = jnp.where(j < num_pages, page, 0)
        k, v = k_ref[layer, page, :, head, :], v_ref[layer, page, :, head, :]
        if quantized:  # [bs, H] 8-bit times [bs] scales, in float32, then q's dtype
            k = (k.astype(jnp.float32) * ks_ref[layer, page, :, head].astype(jnp.float32)[:, None]).astype(q.dtype)
            v = (v.astype(jnp.float32) * vs_ref[layer, page, :, head].astype(jnp.float32)[:, None]).astype(q.dtype)
        return k, v

    def update(j, k, v, carry):
        acc, m, l = carry
        key_pos = j * block_size + lax.broadcasted_iota(jnp.int32, (1, block_size), 1)
        mask = (key_pos <= row_pos) & (row_pos - key_pos < window) & (key_pos < n_keys) & row_ok  # [R, bs]
        s = lax.dot_general(q, k, _DOT_DIMS_QK, precision=lax.Precision.HIGHEST,
                            preferred_element_type=jnp.float32) * sm_scale
        s = jnp.where(mask, s, MASK_VALUE)
        m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
        alpha = jnp.exp(m - m_new)
        p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
        l_new = alpha * l + jnp.sum(p, axis=1, keepdims=True)
        # Slots past the context may hold anything (NaN too), and 0 * NaN = NaN.
        key_col = j * block_size + lax.broadcasted_iota(jnp.int32, (block_size, 1), 0)
        v = jnp.where(key_col < n_keys, v, jnp.zeros((), v.dtype))
        pv = lax.dot_general(p.astype(v.dtype), v, _DOT_DIMS_PV,
                             precision=lax.Precision.HIGHEST,
                             preferred_element_type=jnp.float32)
        return alpha * acc + pv, m_new, l_new

    def step(i, carry):
        first = i * pages_per_step
        pages = [load_page(first + p) for p in range(pages_per_step)]  # loads first
        for p, (k, v) in enumerate(pages):
            carry = update(first + p, k, v, carry)
        return carry

    init = (jnp.zeros((rows, head_dim), jnp.float32),
            jnp.full((rows, 1), MASK_VALUE, jnp.float32),
            jnp.zeros((rows, 1), jnp.float32))
    if num_splits == 1:
        acc, _, l = lax.fori_loop(first_step, num_steps, step, init)
        (o_ref,) = out_refs
        out = acc / jnp.where(l > 0, l, 1.0)
        o_ref[...] = jnp.where(row_ok, out, 0.0).astype(o_ref.dtype)
        return
    per_split = lax.div(num_steps - first_step + num_splits - 1, num_splits)
    first = first_step + pl.program_id(2) * per_split
    acc, m, l = lax.fori_loop(first, jnp.minimum(first + per_split, num_steps), step, init)
    acc_ref, m_ref, l_ref = out_refs
    acc_ref[...] = acc
    m_ref[...] = m
    l_ref[...] = l


def _merge_splits(acc, m, l):
    """Combine per-split partials (FlashDecoding, Dao et al. 2023): acc [W, K, P, R, H],
    m and l [W, K, P, R, 1] -> normalised [W, K, R, H] float32."""
    m_all = jnp.max(m, axis=2, keepdims=True)
    weight = jnp.exp(m - m_all)  # a split with no keys has m = MASK_VALUE: weight 0
    l_all = jnp.sum(weight * l, axis=2)
    acc_all = jnp.sum(weight * acc, axis=2)
    return acc_all / jnp.where(l_all > 0, l_all, 1.0)


def _to_kernel_rows(q_blk, num_kv_heads: int, group_pad: int, rows: int):
    """[W, B, N, H] -> [W, K, R, H]: heads of a KV group folded into rows, padded."""
    num_work, q_block, num_q_heads, head_dim = q_blk.shape
    group = num_q_heads // num_kv_heads
    x = q_blk.reshape(num_work, q_block, num_kv_heads, group, head_dim)
    x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, group_pad - group), (0, 0)))
    x = x.transpose(0, 2, 1, 3, 4).reshape(num_work, num_kv_heads, q_block * group_pad,
                                           head_dim)
    return jnp.pad(x, ((0, 0), (0, 0), (0, rows - q_block * group_pad), (0, 0)))


def _from_kernel_rows(out, q_block: int, group: int, group_pad: int):
    """Inverse of ``_to_kernel_rows``: [W, K, R, H] -> [W, B, N, H]."""
    num_work, num_kv_heads, _, head_dim = out.shape
    x = out[:, :, :q_block * group_pad].reshape(num_work, num_kv_heads, q_block,
                                                 group_pad, head_dim)
    x = x[:, :, :, :group].transpose(0, 2, 1, 3, 4)
    return x.reshape(num_work, q_block, num_kv_heads * group, head_dim)


def _compiler_params(interpret: bool, num_warps: int, num_stages: int):
    """Triton compiler params for the GPU (see README.md for why Triton)."""
    if interpret:
        return None
    try:
        from jax.experimental.pallas import triton as pltriton
    except ImportError as e:  # a JAX that removed Pallas's Triton backend
        raise NotImplementedError(
            "ragged_paged_attention compiles through Pallas's Triton backend, which "
            "this JAX no longer ships; use interpret=True or the reference") from e
    params = getattr(pltriton, "CompilerParams", None) or pltriton.TritonCompilerParams
    return params(num_warps=num_warps, num_stages=num_stages)


def _call_kernel(meta, block_tables, layer_window, q_rows, k5, v5, scales, *, sm_scale, group_pad,
                 pages_per_step, interpret, num_warps, num_stages, num_splits=1):
    """The pallas_call over grid (W, K) or, split over the keys, (W, K, num_splits).
    ``scales``: () for float pages, (k_scales, v_scales) [L, NB, bs, K] for 8-bit ones."""
    num_work, num_kv_heads, rows, head_dim = q_rows.shape
    whole = pl.BlockSpec()
    kernel = functools.partial(_kernel, sm_scale=sm_scale, group_pad=group_pad,
                               pages_per_step=pages_per_step, num_splits=num_splits, quantized=bool(scales))
    params = dict(interpret=interpret, name="ragged_paged_attention",
                  compiler_params=_compiler_params(interpret, num_warps, num_stages))
    args = (meta, block_tables, layer_window, q_rows, k5, v5) + tuple(scales)
    scale_specs = [whole] * len(scales)
    if num_splits == 1:
        row_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, rows, head_dim),
                                lambda w, h: (w, h, 0, 0))
        return pl.pallas_call(
            kernel, grid=(num_work, num_kv_heads),
            in_specs=[whole, whole, whole, row_spec, whole, whole] + scale_specs, out_specs=row_spec,
            out_shape=jax.ShapeDtypeStruct(q_rows.shape, q_rows.dtype), **params)(*args)
    q_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, rows, head_dim),
                          lambda w, h, p: (w, h, 0, 0))
    part = (num_work, num_kv_heads, num_splits, rows)
    acc, m, l = pl.pallas_call(
        kernel, grid=(num_work, num_kv_heads, num_splits),
        in_specs=[whole, whole, whole, q_spec, whole, whole] + scale_specs,
        out_specs=[pl.BlockSpec((pl.squeezed,) * 3 + (rows, n), lambda w, h, p: (w, h, p, 0, 0))
                   for n in (head_dim, 1, 1)],
        out_shape=[jax.ShapeDtypeStruct(part + (n,), jnp.float32) for n in (head_dim, 1, 1)],
        **params)(*args)
    return _merge_splits(acc, m, l).astype(q_rows.dtype)


def auto_decode_splits(num_programs: int, max_blocks: int, block_size: int) -> int:
    """Key splits for a decode batch of ``num_programs`` (sequence, KV head) programs.

    Enough programs to fill a GPU (`TARGET_PROGRAMS`, about two per H200 SM) when the
    batch alone does not, never a split of fewer than `MIN_SPLIT_KEYS` keys of the
    block table's capacity, at most `MAX_SPLITS`. Batches of 64 x 8 KV heads and more
    are not split.
    """
    if num_programs >= TARGET_PROGRAMS:
        return 1
    by_fill = -(-TARGET_PROGRAMS // num_programs)
    by_length = max(1, max_blocks * block_size // MIN_SPLIT_KEYS)
    return max(1, min(MAX_SPLITS, by_fill, by_length))


def _run(q, k5, v5, layer_window, kv_lens, block_tables, query_start_loc, num_seqs, *scales,
         q_block: int, decode: bool, decode_splits: int | None = 1, **kernel_kw):
    """Plans work items of ``q_block`` rows, runs the kernel, scatters rows back.
    ``decode_splits``: key splits of a decode batch (None: `auto_decode_splits`)."""
    num_tokens, num_q_heads, _ = q.shape
    num_kv_heads = k5.shape[3]
    group = num_q_heads // num_kv_heads
    group_pad = _next_pow2(group)
    rows = max(MIN_ROWS, q_block * group_pad)
    num_work = num_work_items(num_tokens, kv_lens.shape[0], q_block, decode=decode)
    plan: QueryBlockPlan = plan_query_blocks(
        kv_lens, query_start_loc, num_seqs, num_tokens=num_tokens, q_block=q_block,
        num_work=num_work)
    meta = jnp.stack([plan.seq, plan.q_pos, plan.num_rows, plan.kv_len], axis=1)
    q_rows = _to_kernel_rows(gather_query_blocks(q, plan, q_block), num_kv_heads,
                             group_pad, rows)
    splits = 1
    if decode:
        splits = decode_splits or auto_decode_splits(num_work * num_kv_heads,
                                                     block_tables.shape[1], k5.shape[2])
    out = _call_kernel(meta, block_tables, layer_window, q_rows, k5, v5, scales, group_pad=group_pad,
                       num_splits=splits, **kernel_kw)
    return scatter_query_blocks(_from_kernel_rows(out, q_block, group, group_pad), plan)


@functools.partial(jax.jit, static_argnames=(
    "sm_scale", "interpret", "q_block_rows", "pages_per_step", "num_warps",
    "num_stages", "decode_splits"))
def ragged_paged_attention(q, k_pages, v_pages, kv_lens, block_tables,
                           query_start_loc, num_seqs, *, sm_scale=None, layer=None,
                           sliding_window=None, interpret=False, q_block_rows: int = 64,
                           pages_per_step: int | None = None, num_warps: int = 4,
                           num_stages: int = 2, decode_splits: int | None = None,
                           k_scales=None, v_scales=None):
    """Causal GQA attention of packed ragged queries over a paged KV cache (Pallas).

    Rows ``query_start_loc[i] .. query_start_loc[i+1] - 1`` of ``q`` are the last
    ``q_len_i`` positions ``kv_lens[i] - q_len_i .. kv_lens[i] - 1`` of sequence i;
    each attends to keys ``0 .. its position`` of its own sequence (only the last
    ``sliding_window`` of them when given), whose K/V (new tokens included) sit in the
    pages listed by ``block_tables[i]``.

    Args:
      q: [T, N, H] float32/bfloat16/float16, new rows of all sequences, packed.
      k_pages, v_pages: [num_blocks, block_size, K, H], q's dtype; with ``layer``
        [L, num_blocks, block_size, K, H], read at layer ``layer`` in place. With
        ``k_scales``/``v_scales``: 8-bit pages (int8 or float8_e4m3fn).
      kv_lens: [S] int32, context length of each sequence, new rows included.
      block_tables: [S, max_blocks] int32 page ids; entries past a sequence's
        pages are never used for keys (ids are clamped into range; block 0 is the
        null block).
      query_start_loc: [S+1] int32, packed row offsets.
      num_seqs: int32 scalar (may be traced). Sequences at or past it and rows at
        or past ``query_start_loc[num_seqs]`` are padding: their output is 0 and
        they never affect real rows.
      sm_scale: static float, default ``H ** -0.5``.
      layer: optional int32 scalar (may be traced), clamped to ``[0, L - 1]``.
      sliding_window: optional int32 scalar >= 1 (may be traced): a row at position p
        sees keys ``p - sliding_window + 1 .. p`` (transformers' sliding-window mask;
        pages wholly before every row's window are skipped). None: full causal attention.
      interpret: static; True runs the Pallas interpreter (required on CPU).
      q_block_rows: static power of two, kernel rows per program for non-decode
        batches (``q_block = q_block_rows // G_pad`` tokens).
      pages_per_step: static pages loaded per loop step (default: 64 keys' worth).
      num_warps, num_stages: static Triton launch parameters (GPU only).
      decode_splits: static; key splits of decode-only batches (flash-decoding: each
        (sequence, KV head) program becomes that many, merged by log-sum-exp). None:
        `auto_decode_splits` (split only when the batch cannot fill the GPU); 1: never.
      k_scales, v_scales: optional float [num_blocks, block_size, K] (or [L, ...]), one
        scale per token and KV head of 8-bit pages: key ``j`` of head ``k`` is
        ``k_pages[..., j, k, :] * k_scales[..., j, k]`` (dequantized as each page is
        loaded, in float32, then q's dtype). Both or neither.

    Returns:
      [T, N, H] in q's dtype (float32 accumulation inside).

    Raises:
      ValueError: shapes disagree with the contract, or ``q_block_rows`` is not a
        power of two.
      TypeError: q/pages dtypes differ or are not float; metadata not integer.
    """
    check_inputs(q, k_pages, v_pages, kv_lens, block_tables, query_start_loc,
                 num_seqs, layer, k_scales, v_scales)
    if q_block_rows < 1 or q_block_rows & (q_block_rows - 1):
        raise ValueError(f"q_block_rows must be a power of two, got {q_block_rows}")
    if decode_splits is not None and decode_splits < 1:
        raise ValueError(f"decode_splits must be >= 1 or None, got {decode_splits}")
    head_dim = q.shape[-1]
    k5, v5, layer_idx = stack_layer_view(k_pages, v_pages, layer)
    scales = () if k_scales is None else stack_layer_view(k_scales, v_scales, layer)[:2]
    block_size = k5.shape[2]
    kernel_kw = dict(
        sm_scale=float(head_dim ** -0.5 if sm_scale is None else sm_scale),
        pages_per_step=pages_per_step or max(1, 64 // block_size),
        interpret=interpret, num_warps=num_warps, num_stages=num_stages)
    window = jnp.asarray(NO_WINDOW if sliding_window is None else sliding_window, jnp.int32)
    layer_window = jnp.stack([layer_idx, jnp.maximum(window, 1)])
    arrays = (q, k5, v5, layer_window, kv_lens.astype(jnp.int32),
              block_tables.astype(jnp.int32), query_start_loc.astype(jnp.int32),
              jnp.asarray(num_seqs, jnp.int32)) + tuple(scales)
    group_pad = _next_pow2(q.shape[1] // k5.shape[3])
    q_block = max(1, q_block_rows // group_pad)
    decode_fn = functools.partial(_run, q_block=1, decode=True, decode_splits=decode_splits,
                                  **kernel_kw)
    general_fn = functools.partial(_run, q_block=q_block, decode=False, **kernel_kw)
    return lax.cond(decode_only(arrays[6], arrays[7]), decode_fn, general_fn, *arrays)
