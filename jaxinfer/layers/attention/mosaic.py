"""The Mosaic GPU attention backend ("mosaic", the default on compute capability 9.0 and later):
after the KV write, `jaxinfer.kernels.pallas.mosaic_paged_attention` over each row's whole context
(``kv_lens``, this step's tokens included), in Mosaic GPU's interpreter on CPU, under
``shard_map`` over the heads when tensor-parallel. Like the Pallas (Triton) backend it reads the
step's metadata as it is: `MosaicAttention.prepare` has nothing to derive.

The kernel reads 16-bit float pages (bfloat16 / float16; a CPU bfloat16 cache's uint16 bits are
reinterpreted, not converted) and 8-bit caches (``--kv-cache-dtype int8|fp8``) of block size 64:
their values and per-token scales (bfloat16 bits, reinterpreted) go to the kernel, which widens
each page in shared memory. `supports` says which engines it serves; the execution plan picks the
Triton backend for the others (float32 caches, 8-bit caches of block size 16/32, head dims not a
multiple of 64).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from jaxinfer.layers.attention.base import AttentionBackend
from jaxinfer.layers.attention.kv_quant import QuantKV
from jaxinfer.layers.attention.kv_storage import KVStorage, write_kv
from jaxinfer.layers.step_metadata import AttentionMetadata

KV_DTYPES = ("bfloat16", "float16")  # the model dtypes whose cache the kernel reads
BLOCK_SIZES = (16, 32, 64)


def supports(num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype,
             kv_cache_dtype: str = "auto") -> str | None:
    """None when the kernel serves these shapes and cache format, else the reason it does not
    (a sentence for the error of a forced ``--attention-backend mosaic``)."""
    from jaxinfer.kernels.pallas.mosaic_paged_attention import EIGHT_BIT_BLOCK_SIZES, fits_shared_memory

    eight_bit = kv_cache_dtype in ("int8", "fp8")
    if kv_cache_dtype not in ("auto", "int8", "fp8"):
        return f"the Mosaic GPU kernel reads 16-bit float or int8/fp8 pages, not a {kv_cache_dtype} KV cache"
    if eight_bit and block_size not in EIGHT_BIT_BLOCK_SIZES:
        sizes = "/".join(map(str, EIGHT_BIT_BLOCK_SIZES))
        return (f"the Mosaic GPU kernel reads a {kv_cache_dtype} KV cache of block size {sizes} only (a page is one "
                f"64-row WGMMA_8BIT tile), not {block_size}")
    if jnp.dtype(dtype).name not in KV_DTYPES:
        return f"the Mosaic GPU kernel reads bfloat16/float16 pages, not {jnp.dtype(dtype).name}"
    if head_dim % 64:
        return f"the Mosaic GPU kernel needs a head dim multiple of 64, not {head_dim}"
    if block_size not in BLOCK_SIZES:
        return f"the Mosaic GPU kernel needs block size 16, 32 or 64, not {block_size}"
    if not fits_shared_memory(head_dim, block_size, 1 if eight_bit else jnp.dtype(dtype).itemsize):
        return f"the Mosaic GPU kernel's pages of head dim {head_dim} x block size {block_size} do not fit shared memory"
    if num_q_heads % num_kv_heads or num_q_heads // num_kv_heads > 64:
        return f"the Mosaic GPU kernel serves 1..64 query heads per KV head, not {num_q_heads}/{num_kv_heads}"
    return None


@dataclasses.dataclass(frozen=True)
class MosaicAttention(AttentionBackend):
    """The Mosaic GPU kernel (`mosaic_paged_attention`).

    Attributes:
      interpret: run the kernel in Mosaic GPU's interpreter (CPU; slow, for tests).
    """

    name: ClassVar[str] = "mosaic"
    interpret: bool = False

    def __call__(self, q, k_new, v_new, k_cache, v_cache, layer, meta: AttentionMetadata, sm_scale: float,
                 window=None, prepared=None):
        """Write this step's K/V, zero V's slots past each row's context in its last page
        (`clear_value_tails`), then `forward`.

        Returns:
          (out [T, N, H], k_cache, v_cache).
        """
        k_cache = write_kv(k_cache, layer, meta.slot_mapping, k_new)
        v_cache = clear_value_tails(write_kv(v_cache, layer, meta.slot_mapping, v_new), layer, meta)
        out = self.forward(q, k_new, v_new, k_cache, v_cache, layer, meta, sm_scale, window, prepared)
        return out, k_cache, v_cache

    def forward(self, q, k_new, v_new, k_cache, v_cache, layer, meta, sm_scale, window, prepared):
        """`mosaic_paged_attention` (the new K/V are read back from the pages)."""
        return mosaic_paged_attention(q, k_cache, v_cache, layer, meta, sm_scale, self.interpret, self.mesh, window)


def clear_value_tails(v_cache, layer, meta: AttentionMetadata):
    """``v_cache`` with zeros in the slots past each real row's context in its last page.

    The kernel's WGMMA multiplies P (0 for those keys) by the whole page, so a stale NaN or inf
    left there by a freed block's last owner would poison the row (0 x NaN); the Triton kernel
    masks V in registers instead. Those slots belong to the row alone (a partial block is never
    shared by the prefix cache) and are written before they are ever read as context. One scatter
    of at most ``R x (block_size - 1)`` slots of one layer, in place on the carried cache.

    An 8-bit cache (`QuantKV`) has its values (an e4m3 byte may be NaN) and scales zeroed there.

    Args:
      v_cache: [L, NB, bs, K, H] (float or bfloat16 bits), or a `QuantKV`. layer: [] int32.
    Returns:
      v_cache with the tails of ``layer`` zeroed.
    """
    if isinstance(v_cache, QuantKV):
        return QuantKV(clear_value_tails(v_cache.values, layer, meta), _clear_tails(v_cache.scales, layer, meta))
    return _clear_tails(v_cache, layer, meta)


def _clear_tails(v_cache, layer, meta: AttentionMetadata):
    """`clear_value_tails` of one array [L, NB, bs, ...]."""
    num_blocks, block_size = v_cache.shape[1], v_cache.shape[2]
    kv_lens = meta.kv_lens.astype(jnp.int32)
    rows = kv_lens.shape[0]
    last_col = jnp.clip((kv_lens - 1) // block_size, 0, meta.block_tables.shape[1] - 1)
    last_page = meta.block_tables[jnp.arange(rows), last_col]
    used = kv_lens % block_size  # slots of the last page that hold context; 0: the page is full
    offsets = jnp.arange(block_size, dtype=jnp.int32)
    real = (jnp.arange(rows) < meta.num_seqs) & (kv_lens > 0) & (used > 0)
    tail = real[:, None] & (offsets[None, :] >= used[:, None])
    blocks = jnp.where(tail, last_page[:, None], num_blocks)  # out of range: dropped
    zeros = jnp.zeros((rows, block_size) + v_cache.shape[3:], v_cache.dtype)
    return v_cache.at[layer, blocks, jnp.broadcast_to(offsets, blocks.shape)].set(zeros, mode="drop")


def mosaic_paged_attention(q, k_cache, v_cache, layer, meta: AttentionMetadata, sm_scale: float,
                           interpret: bool = False, mesh: Mesh | None = None, window=None):
    """``jaxinfer.kernels.pallas.mosaic_ragged_paged_attention`` over the whole context, per TP shard
    (the head split of `jaxinfer.layers.attention.pallas.pallas_paged_attention`, for the same reason:
    the SPMD partitioner cannot split a custom call).

    Args:
      q: [T, N, H]; k_cache, v_cache: [L, NB, bs, K, H] bfloat16/float16 (or bfloat16 bits), or
        8-bit `QuantKV` caches of block size 64;
      layer: [] int32; window: [] int32 sliding window or None.
    Returns:
      [T, N, H] in q's dtype.
    Raises:
      NotImplementedError: a cache the kernel does not read (see `supports`).
    """
    from jaxinfer.kernels.pallas.mosaic_paged_attention import mosaic_ragged_paged_attention

    kv = KVStorage.of(k_cache)
    (k_pages, k_scales), (v_pages, v_scales) = kv.kernel_operands(k_cache), kv.kernel_operands(v_cache)
    if kv.quantized:  # bfloat16 scales held as their bits
        scales = tuple(jax.lax.bitcast_convert_type(s, jnp.bfloat16) for s in (k_scales, v_scales))
        compute = jnp.bfloat16
    else:
        k_pages, v_pages, scales = kv.values(k_pages), kv.values(v_pages), ()
        compute = k_pages.dtype

    def attend(q, k_pages, v_pages, layer, kv_lens, block_tables, query_start_loc, num_seqs, *extra):
        quant, win = (extra[:2], extra[2:]) if scales else ((), extra)
        kw = dict(k_scales=quant[0], v_scales=quant[1]) if quant else {}
        # q comes in float32 from bfloat16 models: the kernel takes it in its compute dtype
        return mosaic_ragged_paged_attention(
            q.astype(compute), k_pages, v_pages, kv_lens, block_tables, query_start_loc, num_seqs, sm_scale=sm_scale,
            layer=layer, interpret=interpret, sliding_window=win[0] if win else None, **kw).astype(q.dtype)

    args = (q, k_pages, v_pages, layer, meta.kv_lens, meta.block_tables, meta.query_start_loc,
            meta.num_seqs) + scales + (() if window is None else (window,))
    tp = 1 if mesh is None else mesh.shape["model"]
    if tp == 1:
        return attend(*args)
    heads = "model" if k_pages.shape[3] % tp == 0 else None  # the cache's own K split
    q_spec, kv_spec = P(None, heads, None), P(None, None, None, heads, None)
    scale_specs = (P(None, None, None, heads),) * len(scales)
    in_specs = (q_spec, kv_spec, kv_spec) + (P(),) * 5 + scale_specs + (P(),) * (window is not None)
    return jax.shard_map(attend, mesh=mesh, in_specs=in_specs, out_specs=q_spec, check_vma=False)(*args)
