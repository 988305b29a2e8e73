"""The Pallas attention backend ("pallas", the GPU default): after the KV write,
`jaxinfer.kernels.pallas.ragged_paged_attention` over each row's whole context (``kv_lens``, this step's
tokens included), in interpret mode on CPU, under ``shard_map`` over the heads when
tensor-parallel. The kernel reads the step's metadata as it is: `PallasAttention.prepare` has
nothing to derive.
"""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from jaxinfer.layers.attention.base import AttentionBackend
from jaxinfer.layers.attention.kv_storage import KVStorage
from jaxinfer.layers.step_metadata import AttentionMetadata


@dataclasses.dataclass(frozen=True)
class PallasAttention(AttentionBackend):
    """The Pallas kernel (`pallas_paged_attention`).

    Attributes:
      interpret: run the kernel in Pallas' interpret mode (CPU).
    """

    name: ClassVar[str] = "pallas"
    interpret: bool = False

    def forward(self, q, k_new, v_new, k_cache, v_cache, layer, meta, sm_scale, window, prepared):
        """`pallas_paged_attention` (the new K/V are read back from the pages)."""
        return pallas_paged_attention(q, k_cache, v_cache, layer, meta, sm_scale, self.interpret, self.mesh, window)


def pallas_paged_attention(q, k_cache, v_cache, layer, meta: AttentionMetadata, sm_scale: float,
                           interpret: bool = False, mesh: Mesh | None = None, window=None):
    """``jaxinfer.kernels.pallas.ragged_paged_attention`` over the whole context, per TP shard.

    The kernel is an opaque custom call that XLA's SPMD partitioner cannot split (it would
    gather its operands, the whole KV cache, onto every device). With a ``model`` mesh
    axis of size > 1 it therefore runs under ``jax.shard_map``: each device attends with
    its own query heads over its own KV heads (Megatron's head split; no communication).
    When the KV heads do not divide by the TP degree the cache is replicated
    (`jaxinfer.distributed.sharding`), and so is this computation, as on the XLA path.

    Args:
      q: [T, N, H]; k_cache, v_cache: [L, NB, bs, K, H] arrays, or 8-bit `QuantKV` caches
        (values and per-token scales handed to the kernel, which dequantizes per page); layer: [] int32.
      mesh: the replica's ``(data, model)`` mesh, or None on one device.
      window: [] int32 sliding window of this layer, or None (full causal attention).
    Returns:
      [T, N, H] in q's dtype.
    """
    from jaxinfer.kernels.pallas import ragged_paged_attention

    kv = KVStorage.of(k_cache)
    quant = kv.quantized

    def attend(q, k_cache, v_cache, layer, kv_lens, block_tables, query_start_loc, num_seqs, *extra):
        scales, win = (extra[:2], extra[2:]) if quant else ((), extra)
        # The kernel takes q in the cache dtype (bfloat16 models keep q in float32 up to here);
        # 8-bit pages are dequantized to q's float32 inside it.
        q_in = q if quant else q.astype(k_cache.dtype)
        kw = dict(k_scales=scales[0], v_scales=scales[1]) if quant else {}
        return ragged_paged_attention(q_in, k_cache, v_cache, kv_lens, block_tables,
                                      query_start_loc, num_seqs, sm_scale=sm_scale, layer=layer,
                                      interpret=interpret, sliding_window=win[0] if win else None, **kw).astype(q.dtype)

    (k_pages, k_scales), (v_pages, v_scales) = kv.kernel_operands(k_cache), kv.kernel_operands(v_cache)
    if quant:
        scales = tuple(jax.lax.bitcast_convert_type(s, jnp.bfloat16) for s in (k_scales, v_scales))
    else:
        k_pages, v_pages, scales = kv.values(k_pages), kv.values(v_pages), ()
    args = (q, k_pages, v_pages, layer, meta.kv_lens, meta.block_tables, meta.query_start_loc,
            meta.num_seqs) + scales + (() if window is None else (window,))
    tp = 1 if mesh is None else math.prod(mesh.shape[a] for a in mesh.axis_names if a != "data")
    if tp == 1:
        return attend(*args)
    group = tuple(a for a in mesh.axis_names if a != "data")  # ("model",) or ("expert", "model")
    heads = (group if len(group) > 1 else group[0]) if k_cache.shape[3] % tp == 0 else None  # sharding.kv_cache_spec
    q_spec, kv_spec = P(None, heads, None), P(None, None, None, heads, None)
    scale_specs = (P(None, None, None, heads),) * len(scales)
    in_specs = (q_spec, kv_spec, kv_spec) + (P(),) * 5 + scale_specs + (P(),) * (window is not None)
    sharded = jax.shard_map(attend, mesh=mesh, in_specs=in_specs, out_specs=q_spec, check_vma=False)
    return sharded(*args)
