"""Ragged paged attention on Pallas's Mosaic GPU backend (Hopper, sm_90a and later).

This module owns the Mosaic GPU kernel and ``mosaic_ragged_paged_attention``, its jitted
entry point, with the contract of ``ragged_paged_attention`` (``README.md``): packed ragged
query rows (prefill chunks and decode rows mixed), causal GQA over a paged KV cache walked
through each sequence's block table, an optional sliding window.

Layout. A program is one (work item, KV head, key split). A work item holds ``q_block``
consecutive query rows of one sequence (``q_block = 1`` for decode-only steps); the
``G = N / K`` query heads sharing the KV head are padded to a power of two ``G_pad`` and
folded into the row axis, so a program owns one ``[64, H]`` query tile (row ``r`` is token
``r // G_pad``, head ``r % G_pad`` of the group): one WGMMA M-tile. Every query head of the
GQA group is served by one pass over each KV page.

Pipeline. An outer one-step ``plgpu.emit_pipeline`` brings the item's info row (scalars and
block-table row) and query tile into shared memory; an inner one walks the program's pages:
each step's K and V pages (``[block_size, H]`` of one layer and KV head) are copied by TMA
from the block-table offset into a ``stages``-deep ring of shared-memory buffers (cut to what
fits `SMEM_BUDGET`) while earlier pages are computed on. Per page: ``S = Q Kᵀ`` (WGMMA,
float32 accumulator ``[64, block_size]``), the causal / window / length mask and the online
softmax in float32 registers, ``P`` (in the cache dtype) stored to shared memory, ``O += P V``
(WGMMA ``[64, H]``). The rows that can be real (``max(8, q_block * G_pad)``) of ``O`` and its
softmax statistics leave by TMA as float32 partials.

Flash-decoding. The pages of a program's range are split over ``num_splits`` programs
(grid axis 2); each writes its unnormalised ``(acc, m, l)`` and ``merge_splits`` combines
them by log-sum-exp in XLA. One split is the same path (the merge is then a division).

Interpretation. ``interpret=True`` runs the same kernel in Mosaic GPU's interpreter
(``InterpretGPUParams``, race detection on, uninitialised memory as NaN). Two things differ
from the compiled kernel, both memory-layout only: shared-memory buffers carry no
tiling/swizzle transforms (the interpreter reads them as plain arrays) and ``Kᵀ`` is an
explicit transposed copy in shared memory (the interpreter's WGMMA does not take the
transposed-operand view the hardware reads); register layouts are not cast.

8-bit pages (int8 / float8_e4m3fn with per-token scales, `jaxinfer.layers.attention.kv_quant`'s
format) arrive by the same TMA pipeline at one byte per element. Each step widens its K and V
page to bfloat16 in registers (loaded from swizzled shared memory in the ``WGMMA_8BIT`` layout,
converted, exact for both formats; e4m3 goes through float32 because sm_90 converts e4m3 only to
f16) and stores them into two swizzled bfloat16 buffers that feed the same WGMMAs. The scales
are not multiplied into the pages: with one scale per key, ``S = (Q Kq^T) * s_k`` and
``P V = (P * s_v) Vq`` scale the columns of the float32 ``[64, bs]`` tile, so each step also
brings the page's ``[bs]`` K and V scales (from `_item_scales`, a per-step gather of the tables'
pages into ``[W, K, MB, bs]``) and broadcasts them over the rows. The ``WGMMA_8BIT`` register
layout is 64 rows, so 8-bit pages need block size 64 (`EIGHT_BIT_BLOCK_SIZES`; docs/kernels.md
says what refuses 16 and 32).

Limits (checked, `check_supported`): 16-bit float pages (bfloat16 / float16; q is cast to the
pages' dtype) or 8-bit pages of block size 64 (q cast to bfloat16); ``H`` a multiple of 64;
``block_size`` 16, 32 or 64; ``G_pad <= 64``; block tables of at most 16,376 blocks; two pipeline
stages within `SMEM_BUDGET` (`fits_shared_memory`). Modeled bytes and FLOPs per call:
``docs/kernels.md``.

One contract difference from the Triton kernel: V's slots past a sequence's length in its last
page must hold finite values (8-bit pages: values and scales). P is 0 there, but the WGMMA reads the whole page and 0 x NaN is
NaN; masking the page in shared memory would need a register layout of ``block_size`` rows,
which Mosaic GPU does not have (its WGMMA layout is 64 rows). The Mosaic backend
(`jaxinfer.layers.attention.mosaic`) therefore zeroes those slots as it writes the step's K/V
(`clear_value_tails`). K's tails may hold anything (their scores are replaced by the mask).

Sources: PagedAttention (Kwon et al., SOSP 2023); FlashAttention online softmax (Dao et al.
2022); FlashDecoding split-KV (Dao et al. 2023); WGMMA / TMA per the Hopper tuning guide.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxinfer.kernels.pallas.reference import (
    MASK_VALUE,
    check_inputs,
    decode_only,
    gather_query_blocks,
    num_work_items,
    plan_query_blocks,
    scatter_query_blocks,
    stack_layer_view,
)

ROWS = 64  # one WGMMA M-tile: query rows (tokens x padded group heads) per program
NO_WINDOW = 1 << 30
INFO = 8  # leading int32 fields of a program's info row (see `_info_rows`)
INFO_COLS = 64  # the info row as [rows, 64]: a TMA box takes at most 256 elements per dimension
MAX_INFO = 256 * INFO_COLS
SMEM_BUDGET = 200 * 1024  # of the 227 KiB a Hopper block may have: the rest for reductions and barriers
TARGET_PROGRAMS = 264  # decode splits: aim for about two programs per H100/H200 SM (132)
MIN_SPLIT_PAGES = 4
MAX_SPLITS = 16
SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
EIGHT_BIT_DTYPES = (jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn))  # with per-token scales
EIGHT_BIT_BLOCK_SIZES = (64,)  # one page is one 64-row WGMMA_8BIT tile (docs/kernels.md)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _plgpu():
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu


def _smem_transforms(dtype, minor: int, interpret: bool) -> tuple:
    """Tiling + swizzle of a [rows, minor] shared-memory WGMMA operand (none when interpreted)."""
    if interpret:
        return ()
    plgpu = _plgpu()
    bits = jnp.dtype(dtype).itemsize * 8
    swizzle = plgpu.find_swizzle(minor * bits)
    return (plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle))


def _kernel(*refs, sm_scale: float, group_pad: int, num_splits: int, stages: int, interpret: bool,
            quant: bool):
    """One (work item, KV head, split) program: grid axes "w", "h", "p".

    refs, in order: inputs ``info_gmem, q_gmem, k_ref, v_ref`` (and ``ks_gmem, vs_gmem`` when
    ``quant``), outputs ``acc_gmem, m_gmem, l_gmem``, scratch ``p_smem, acc_smem, m_smem,
    l_smem`` (and ``kb_smem, vb_smem`` when ``quant``, then ``kt_smem`` when interpreted).

    info_gmem: [W, R, 64] int32: per item, flat, layer, q_pos, num_rows, n_keys, window, first
      page, end page, 0, then its block-table row (`_info_rows`). q_gmem: [W, K, 64, H].
    k_ref, v_ref: [L, NB, bs, K, H] (GMEM), 16-bit floats or 8-bit (int8 / float8_e4m3fn).
    ks_gmem, vs_gmem: [W, K, MB, bs] bfloat16: the per-token scales of the item's block-table
      pages for each KV head (`_item_scales`). Outputs acc [W, K, P, O, H], m and l [W, K, P, O]
      float32: the first O = `_out_rows` of the 64 rows (the rest are padding).
    p_smem: [64, bs] scratch for P; acc_smem [64, H], m_smem / l_smem [64]: the results on their
      way out; kb_smem, vb_smem: [bs, H] bfloat16, the widened 8-bit pages; kt_smem: ([H, bs],)
      when interpreted (see the module docstring).
    An outer one-step pipeline brings the item's info row and q tile into shared memory; the
    inner pipeline streams the pages; the real rows of the results go out by TMA.
    """
    plgpu = _plgpu()
    n_in = 6 if quant else 4
    info_gmem, q_gmem, k_ref, v_ref = refs[:4]
    scale_refs = refs[4:n_in]
    acc_gmem, m_gmem, l_gmem = refs[n_in:n_in + 3]
    p_smem, acc_smem, m_smem, l_smem, *extra = refs[n_in + 3:]
    wide_smem, kt_smem = (tuple(extra[:2]), tuple(extra[2:])) if quant else ((), tuple(extra))
    w, head, split = lax.axis_index("w"), lax.axis_index("h"), lax.axis_index("p")
    rows, head_dim = q_gmem.shape[2], q_gmem.shape[3]
    out_rows = acc_gmem.shape[3]
    scale_views = tuple(r.at[w, head] for r in scale_refs)

    def outer(_, info_ref, q_ref):
        _attend(info_ref, q_ref, k_ref, v_ref, acc_smem, m_smem, l_smem, p_smem, kt_smem, head, split,
                scale_views, wide_smem, sm_scale=sm_scale, group_pad=group_pad, num_splits=num_splits,
                stages=stages, interpret=interpret)
        plgpu.commit_smem()  # the results' stores, visible to the TMA engine
        for src, dst in ((acc_smem, acc_gmem), (m_smem, m_gmem), (l_smem, l_gmem)):
            plgpu.copy_smem_to_gmem(src.at[pl.ds(0, out_rows)], dst.at[w, head, split])
        plgpu.wait_smem_to_gmem(0)

    plgpu.emit_pipeline(
        outer, grid=(1,),
        in_specs=[plgpu.BlockSpec(info_gmem.shape[1:], lambda i: (0, 0)),
                  plgpu.BlockSpec((rows, head_dim), lambda i: (0, 0),
                                  transforms=_smem_transforms(q_gmem.dtype, head_dim, interpret))],
    )(info_gmem.at[w], q_gmem.at[w, head])


def _attend(info_ref, q_ref, k_ref, v_ref, acc_out, m_out, l_out, p_smem, kt_smem, head, split,
            scale_views=(), wide_smem=(), *, sm_scale: float, group_pad: int, num_splits: int, stages: int,
            interpret: bool):
    """The page loop of one program (refs in shared memory except the pages and ``scale_views``,
    the [MB, bs] bfloat16 scales of this item and KV head in GMEM, given for 8-bit pages)."""
    plgpu = _plgpu()
    layer, q_pos, num_rows, n_keys = info_ref[0, 0], info_ref[0, 1], info_ref[0, 2], info_ref[0, 3]
    window, first_page, end_page = info_ref[0, 4], info_ref[0, 5], info_ref[0, 6]

    def table(j):
        flat = INFO + j
        return info_ref[lax.div(flat, INFO_COLS), lax.rem(flat, INFO_COLS)]
    block_size, head_dim = k_ref.shape[2], k_ref.shape[4]
    per_split = lax.div(end_page - first_page + num_splits - 1, num_splits)
    start = first_page + split * per_split
    count = jnp.maximum(jnp.minimum(per_split, end_page - start), 0)

    if interpret:
        cast, iota = (lambda x, layout: x), (lambda shape, dim: lax.broadcasted_iota(jnp.int32, shape, dim))
    else:
        cast = plgpu.layout_cast
        iota = functools.partial(plgpu.broadcasted_iota, jnp.int32, layout=plgpu.Layout.WGMMA)
    row_layout, vec_layout = plgpu.Layout.WGMMA, plgpu.Layout.WGMMA.reduce(1)
    init = (cast(jnp.zeros((ROWS, head_dim), jnp.float32), row_layout),
            cast(jnp.full((ROWS,), MASK_VALUE, jnp.float32), vec_layout),
            cast(jnp.zeros((ROWS,), jnp.float32), vec_layout))

    def scores(k_smem):
        def run(acc):
            if interpret:
                kt_smem[0][...] = k_smem[...].T
                kt = kt_smem[0]
            else:
                kt = plgpu.transpose_ref(k_smem, (1, 0))
            plgpu.wgmma(acc, q_ref, kt)
            return acc[...]
        return pl.run_scoped(run, plgpu.ACC((ROWS, block_size), jnp.float32))

    def values(v_smem):
        def run(acc):
            plgpu.wgmma(acc, p_smem, v_smem)
            return acc[...]
        return pl.run_scoped(run, plgpu.ACC((ROWS, head_dim), jnp.float32))

    quant = bool(scale_views)

    def widen(src, dst):
        # 8-bit page -> bfloat16 (exact for int8 and e4m3) in the WGMMA operand buffer; e4m3 goes
        # through float32 (sm_90 converts e4m3 to f16 only), exact too
        x = src[...] if interpret else plgpu.load(src, (), layout=plgpu.Layout.WGMMA_8BIT)
        if x.dtype != jnp.int8:
            x = x.astype(jnp.float32)
        dst[...] = x.astype(dst.dtype)

    def columns(scale_smem):
        # a page's [bs] per-token scales broadcast over the 64 rows of S / P
        x = scale_smem[...] if interpret else plgpu.load(scale_smem, (), layout=plgpu.Layout.WGMMA.reduce(0))
        return lax.broadcast_in_dim(x.astype(jnp.float32), (ROWS, block_size), [1])

    def body(idx, k_smem, v_smem, *rest):
        *scale_smem, (acc, m, l) = rest
        if quant:
            widen(k_smem, wide_smem[0])
            widen(v_smem, wide_smem[1])
            plgpu.commit_smem()  # the widened pages, visible to the WGMMA's async proxy
            k_smem, v_smem = wide_smem
        row_tok = lax.div(iota((ROWS, block_size), 0), group_pad)
        row_pos = q_pos + row_tok
        key_pos = (start + idx[0]) * block_size + iota((ROWS, block_size), 1)
        mask = (key_pos <= row_pos) & (row_pos - key_pos < window) & (key_pos < n_keys) & (row_tok < num_rows)
        raw = scores(k_smem) * sm_scale
        if quant:  # S = (Q Kq^T) * s_k per key column
            raw = raw * columns(scale_smem[0])
        s = jnp.where(mask, raw, MASK_VALUE)
        m_new = jnp.maximum(m, s.max(axis=1))
        alpha = jnp.exp(m - m_new)
        p = jnp.where(mask, jnp.exp(s - lax.broadcast_in_dim(m_new, s.shape, [0])), 0.0)
        l_new = l * alpha + p.sum(axis=1)
        if quant:  # P V = (P * s_v per key column) Vq
            p = p * columns(scale_smem[1])
        p_smem[...] = p.astype(p_smem.dtype)
        plgpu.commit_smem()  # the stores above, visible to the WGMMA's async proxy
        pv = values(v_smem)
        return acc * lax.broadcast_in_dim(alpha, acc.shape, [0]) + pv, m_new, l_new

    def page(j):
        return (table(start + j), 0, 0)

    page_minor = (head_dim, head_dim) if quant else (head_dim, block_size)
    k_spec = plgpu.BlockSpec((None, block_size, head_dim), page,
                             transforms=_smem_transforms(k_ref.dtype, page_minor[0], interpret))
    v_spec = plgpu.BlockSpec((None, block_size, head_dim), page,
                             transforms=_smem_transforms(v_ref.dtype, page_minor[1], interpret))
    scale_spec = plgpu.BlockSpec((None, block_size), lambda j: (start + j, 0))
    k_view, v_view = k_ref.at[layer, :, :, head, :], v_ref.at[layer, :, :, head, :]

    @pl.when(count > 0)
    def _pages():
        pipe = plgpu.emit_pipeline(body, grid=(count,), in_specs=[k_spec, v_spec] + [scale_spec] * len(scale_views),
                                   max_concurrent_steps=stages, init_carry=init)
        acc, m, l = pipe(k_view, v_view, *scale_views)
        acc_out[...] = acc
        m_out[...] = m
        l_out[...] = l

    @pl.when(count <= 0)
    def _empty():
        acc_out[...] = init[0]
        m_out[...] = init[1]
        l_out[...] = init[2]


def merge_splits(acc, m, l):
    """Log-sum-exp merge of per-split partials (FlashDecoding): acc [..., P, R, H], m and l
    [..., P, R] -> normalised [..., R, H] float32 (a row with no key at all gives 0)."""
    m_all = jnp.max(m, axis=-2, keepdims=True)
    weight = jnp.exp(m - m_all)  # a split without keys has m = MASK_VALUE: weight 0
    l_all = jnp.sum(weight * l, axis=-2)
    acc_all = jnp.sum(weight[..., None] * acc, axis=-3)
    return acc_all / jnp.where(l_all > 0, l_all, 1.0)[..., None]


def auto_splits(num_programs: int, max_pages: int) -> int:
    """Key splits of a decode step: enough programs to fill the GPU (`TARGET_PROGRAMS`)
    when ``num_programs`` (sequences x KV heads) does not, never fewer than
    `MIN_SPLIT_PAGES` pages of the block table's width per split, at most `MAX_SPLITS`."""
    if num_programs >= TARGET_PROGRAMS:
        return 1
    by_fill = -(-TARGET_PROGRAMS // num_programs)
    return max(1, min(MAX_SPLITS, by_fill, max_pages // MIN_SPLIT_PAGES))


def _info_rows(plan, block_tables, layer, window, block_size: int, num_blocks: int):
    """[W, R, INFO_COLS] int32: each work item's scalars and block-table row, flat, padded to
    whole rows of `INFO_COLS` (a copy of a multiple of 128 bytes, at most 256 x 64 entries)."""
    num_keys_max = block_tables.shape[1] * block_size
    n_keys = jnp.clip(jnp.minimum(plan.q_pos + plan.num_rows, plan.kv_len), 0, num_keys_max)
    n_keys = jnp.where(plan.num_rows > 0, n_keys, 0)
    end_page = (n_keys + block_size - 1) // block_size
    first_key = jnp.maximum(plan.q_pos - window + 1, 0)
    first_page = jnp.minimum(first_key // block_size, end_page)
    num_work = plan.seq.shape[0]
    scalars = jnp.stack([jnp.broadcast_to(layer, (num_work,)), plan.q_pos, plan.num_rows, n_keys,
                         jnp.broadcast_to(window, (num_work,)), first_page, end_page,
                         jnp.zeros((num_work,), jnp.int32)], axis=1)
    table = jnp.clip(block_tables[plan.seq], 0, num_blocks - 1)
    width = INFO + table.shape[1]
    pad = -width % INFO_COLS
    flat = jnp.concatenate([scalars.astype(jnp.int32), table, jnp.zeros((num_work, pad), jnp.int32)], axis=1)
    return flat.reshape(num_work, (width + pad) // INFO_COLS, INFO_COLS)


def _to_rows(q_blk, num_kv_heads: int, group_pad: int):
    """[W, B, N, H] -> [W, K, 64, H]: the heads of a KV group folded into rows, padded."""
    num_work, q_block, num_q_heads, head_dim = q_blk.shape
    group = num_q_heads // num_kv_heads
    x = q_blk.reshape(num_work, q_block, num_kv_heads, group, head_dim)
    x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, group_pad - group), (0, 0)))
    x = x.transpose(0, 2, 1, 3, 4).reshape(num_work, num_kv_heads, q_block * group_pad, head_dim)
    return jnp.pad(x, ((0, 0), (0, 0), (0, ROWS - q_block * group_pad), (0, 0)))


def _from_rows(out, q_block: int, group: int, group_pad: int):
    """Inverse of `_to_rows`: [W, K, 64, H] -> [W, B, N, H]."""
    num_work, num_kv_heads, _, head_dim = out.shape
    x = out[:, :, :q_block * group_pad].reshape(num_work, num_kv_heads, q_block, group_pad, head_dim)
    return x[:, :, :, :group].transpose(0, 2, 1, 3, 4).reshape(num_work, q_block, num_kv_heads * group, head_dim)


def _interpret_params():
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

    return InterpretGPUParams(detect_races=True, uninitialized_memory="nan")


def _stages_that_fit(stages: int, head_dim: int, block_size: int, itemsize: int, info_bytes: int) -> int:
    """The deepest page pipeline up to ``stages`` whose shared memory fits `SMEM_BUDGET`: q tile,
    results, P, the info row and ``stages`` K and V pages (at least 2: one computing, one loading).
    8-bit pages (``itemsize`` 1) add two bfloat16 pages (the widened K and V) and, per stage, two
    [bs] bfloat16 scale rows; q and P are then bfloat16.

    Raises:
      NotImplementedError: not even two stages fit.
    """
    compute = 2 if itemsize == 1 else itemsize
    fixed = ROWS * head_dim * (compute + 4) + ROWS * (block_size * compute + 8) + info_bytes
    per_stage = 2 * block_size * head_dim * itemsize
    if itemsize == 1:
        fixed += 2 * block_size * head_dim * 2
        per_stage += 2 * block_size * 2
    fit = (SMEM_BUDGET - fixed) // per_stage
    if fit < 2:
        raise NotImplementedError(f"head dim {head_dim} with block size {block_size} does not fit shared memory")
    return min(stages, fit)


def fits_shared_memory(head_dim: int, block_size: int, itemsize: int = 2, info_bytes: int = 8192) -> bool:
    """Whether a two-stage page pipeline fits `SMEM_BUDGET` (``itemsize``: bytes per page element,
    1 for 8-bit caches; ``info_bytes``: the block-table row; 8 KiB holds a 32K-token context at
    block size 16)."""
    try:
        _stages_that_fit(2, head_dim, block_size, itemsize, info_bytes)
    except NotImplementedError:
        return False
    return True


def _out_rows(q_block: int, group_pad: int) -> int:
    """Rows of a program's results that can be real: ``q_block * G_pad``, at least 8 (a TMA copy
    of a whole number of 16-byte units, and the row tile of shared memory)."""
    return min(ROWS, max(8, q_block * group_pad))


def _call(info, q_rows, k5, v5, scales, *, sm_scale, group_pad, num_splits, stages, interpret, out_rows):
    """The kernel over grid (W, K, num_splits) -> float32 partials (acc, m, l) of the first
    ``out_rows`` rows. ``scales``: () or the [W, K, MB, bs] bfloat16 K and V scales of 8-bit pages."""
    plgpu = _plgpu()
    num_work, num_kv_heads, rows, head_dim = q_rows.shape
    block_size = k5.shape[2]
    compute = q_rows.dtype
    part = (num_work, num_kv_heads, num_splits, out_rows)
    kernel = functools.partial(_kernel, sm_scale=sm_scale, group_pad=group_pad, num_splits=num_splits,
                               stages=stages, interpret=interpret, quant=bool(scales))
    scratch = [plgpu.SMEM((rows, block_size), compute,
                          transforms=_smem_transforms(compute, block_size, interpret)),
               plgpu.SMEM((rows, head_dim), jnp.float32), plgpu.SMEM((rows,), jnp.float32),
               plgpu.SMEM((rows,), jnp.float32)]
    if scales:  # the widened K and V pages, laid out as the 16-bit path's TMA'd pages
        scratch += [plgpu.SMEM((block_size, head_dim), compute,
                               transforms=_smem_transforms(compute, minor, interpret))
                    for minor in (head_dim, block_size)]
    if interpret:
        scratch.append(plgpu.SMEM((head_dim, block_size), compute))
    return plgpu.kernel(
        kernel,
        out_type=[jax.ShapeDtypeStruct(part + (head_dim,), jnp.float32),
                   jax.ShapeDtypeStruct(part, jnp.float32), jax.ShapeDtypeStruct(part, jnp.float32)],
        scratch_types=scratch,
        grid=(num_work, num_kv_heads, num_splits), grid_names=("w", "h", "p"),
        compiler_params=plgpu.CompilerParams(),
        interpret=_interpret_params() if interpret else None,
        kernel_name="mosaic_ragged_paged_attention",
    )(info, q_rows, k5, v5, *scales)


def _item_scales(scales4, layer, block_tables, plan):
    """[L, NB, bs, K] scales -> [W, K, MB, bs] bfloat16: each work item's block-table pages' scales,
    per KV head with the page's tokens innermost (a TMA row of 128 bytes per page). The cache's
    own [.., bs, K] layout has stride K between one head's tokens, which is not a TMA box (its
    innermost extent for one head is 2 bytes, under TMA's 16); this gather reads only the pages
    the step's tables name and writes them once for the kernel to read: 3 x 2 bytes per token and
    KV head, against H bytes of 8-bit values (under 5% at H = 128)."""
    num_blocks = scales4.shape[1]
    table = jnp.clip(block_tables[plan.seq], 0, num_blocks - 1)
    got = scales4.at[layer, table].get(mode="promise_in_bounds")  # [W, MB, bs, K]
    return got.astype(jnp.bfloat16).transpose(0, 3, 1, 2)  # bfloat16 already: exact


def _run(q, k5, v5, layer, window, kv_lens, block_tables, query_start_loc, num_seqs, *scales4,
         q_block: int, decode: bool, num_splits: int | None, sm_scale: float, stages: int, interpret: bool):
    """Plans work items of ``q_block`` rows, runs the kernel, merges splits, scatters rows back."""
    num_tokens, num_q_heads, _ = q.shape
    num_kv_heads, block_size = k5.shape[3], k5.shape[2]
    group = num_q_heads // num_kv_heads
    group_pad = _next_pow2(group)
    num_work = num_work_items(num_tokens, kv_lens.shape[0], q_block, decode=decode)
    plan = plan_query_blocks(kv_lens, query_start_loc, num_seqs, num_tokens=num_tokens,
                             q_block=q_block, num_work=num_work)
    info = _info_rows(plan, block_tables, layer, window, block_size, k5.shape[1])
    stages = _stages_that_fit(stages, q.shape[2], block_size, k5.dtype.itemsize, info.shape[1] * INFO_COLS * 4)
    q_rows = _to_rows(gather_query_blocks(q, plan, q_block), num_kv_heads, group_pad)
    scales = tuple(_item_scales(s, layer, block_tables, plan) for s in scales4)
    splits = 1
    if decode:
        splits = num_splits or auto_splits(num_work * num_kv_heads, block_tables.shape[1])
    out_rows = _out_rows(q_block, group_pad)
    acc, m, l = _call(info, q_rows, k5, v5, scales, sm_scale=sm_scale, group_pad=group_pad, num_splits=splits,
                      stages=stages, interpret=interpret, out_rows=out_rows)
    out = merge_splits(acc, m, l).astype(q.dtype)  # [W, K, out_rows >= q_block * G_pad, H]
    return scatter_query_blocks(_from_rows(out, q_block, group, group_pad), plan)


def check_supported(q_shape, pages_shape, dtype, max_blocks: int | None = None) -> None:
    """The kernel's own limits beyond the shared contract.

    Raises:
      NotImplementedError: pages neither bfloat16/float16 nor int8/float8_e4m3fn (8-bit: block
        size in `EIGHT_BIT_BLOCK_SIZES`), ``H`` not a multiple of 64, a block size other than
        16/32/64, more than 64 query heads per KV head, or block tables wider than 16,376 blocks.
    """
    head_dim, num_kv_heads, block_size = pages_shape[-1], pages_shape[-2], pages_shape[-3]
    dtype = jnp.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES + EIGHT_BIT_DTYPES:
        raise NotImplementedError(f"the Mosaic GPU kernel reads bfloat16/float16 or int8/float8_e4m3fn pages, "
                                  f"got {dtype}")
    if head_dim % 64:
        raise NotImplementedError(f"the Mosaic GPU kernel needs a head dim multiple of 64, got {head_dim}")
    if block_size not in (16, 32, 64):
        raise NotImplementedError(f"the Mosaic GPU kernel needs block_size 16, 32 or 64, got {block_size}")
    if dtype in EIGHT_BIT_DTYPES and block_size not in EIGHT_BIT_BLOCK_SIZES:
        raise NotImplementedError(f"the Mosaic GPU kernel reads 8-bit pages of block size "
                                  f"{'/'.join(map(str, EIGHT_BIT_BLOCK_SIZES))} only, got {block_size}")
    if _next_pow2(q_shape[1] // num_kv_heads) > ROWS:
        raise NotImplementedError(f"more than {ROWS} query heads per KV head")
    if max_blocks is not None and INFO + max_blocks > MAX_INFO:
        raise NotImplementedError(f"block tables wider than {MAX_INFO - INFO} blocks")


@functools.partial(jax.jit, static_argnames=("sm_scale", "interpret", "num_splits", "stages"))
def mosaic_ragged_paged_attention(q, k_pages, v_pages, kv_lens, block_tables, query_start_loc, num_seqs, *,
                                  sm_scale=None, layer=None, sliding_window=None, interpret: bool = False,
                                  num_splits: int | None = None, stages: int = 3, k_scales=None, v_scales=None):
    """Causal GQA attention of packed ragged queries over a paged KV cache (Mosaic GPU).

    The contract of `jaxinfer.kernels.pallas.ragged_paged_attention` (same arguments and
    result), restricted to what `check_supported` allows.

    Args:
      q: [T, N, H] float; cast to the pages' dtype (bfloat16 for 8-bit pages) for the WGMMA,
        float32 accumulation.
      k_pages, v_pages: [num_blocks, block_size, K, H] bfloat16/float16, or int8/float8_e4m3fn
        with scales; or [L, ...] with ``layer``.
      kv_lens: [S] int32 context lengths (this step's rows included).
      block_tables: [S, max_blocks] int32 page ids (clamped into the pool).
      query_start_loc: [S+1] int32 packed row offsets. num_seqs: int32 scalar (may be traced).
      sm_scale: static float, default ``H ** -0.5``. layer: int32 scalar (may be traced).
      sliding_window: optional int32 scalar >= 1: a row at p sees keys ``p - w + 1 .. p``.
      interpret: static; run Mosaic GPU's interpreter (CPU; race detection on).
      num_splits: static key splits of decode-only steps (None: `auto_splits`).
      stages: static depth of the TMA page pipeline (shared-memory K/V buffers per operand).
      k_scales, v_scales: with 8-bit pages, their per-token float scales ``[(L,) NB, bs, K]``
        (`jaxinfer.layers.attention.kv_quant`: a key is ``k_pages[...] * k_scales[..., None]``).

    Returns:
      [T, N, H] in q's dtype; rows past ``query_start_loc[num_seqs]`` are 0.

    Raises:
      ValueError, TypeError: as `check_inputs` (8-bit pages without scales: TypeError).
      NotImplementedError: as `check_supported`.
    """
    check_inputs(q, k_pages, v_pages, kv_lens, block_tables, query_start_loc, num_seqs, layer, k_scales, v_scales)
    check_supported(q.shape, k_pages.shape, k_pages.dtype, block_tables.shape[1])
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1 or None, got {num_splits}")
    k5, v5, layer_idx = stack_layer_view(k_pages, v_pages, layer)
    scales = ()
    if k_scales is not None:
        scales = (k_scales, v_scales) if layer is not None else (k_scales[None], v_scales[None])
    head_dim = q.shape[-1]
    compute = jnp.bfloat16 if scales else k5.dtype
    window = jnp.maximum(jnp.asarray(NO_WINDOW if sliding_window is None else sliding_window, jnp.int32), 1)
    kw = dict(sm_scale=float(head_dim ** -0.5 if sm_scale is None else sm_scale), stages=stages,
              interpret=interpret, num_splits=num_splits)
    arrays = (q.astype(compute), k5, v5, layer_idx, window, kv_lens.astype(jnp.int32),
              block_tables.astype(jnp.int32), query_start_loc.astype(jnp.int32),
              jnp.asarray(num_seqs, jnp.int32)) + scales
    decode_fn = functools.partial(_run, q_block=1, decode=True, **kw)
    general_fn = functools.partial(_run, q_block=ROWS // _next_pow2(q.shape[1] // k5.shape[3]), decode=False, **kw)
    out = lax.cond(decode_only(arrays[7], arrays[8]), decode_fn, general_fn, *arrays)
    return out.astype(q.dtype)
