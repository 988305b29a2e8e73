"""``int8_packed``: int8 weights with group scales packed once at load for the kernel of
`jaxinfer.kernels.cpu.int8` (AVX-512 VNNI), which runs every row count over them in place by layer
index: each projection, q/k/v as one product, and the LM head; gate and up stay two products
(the gated epilogue is the bfloat16 kernel's). What does not fit runs the fallback (``int8``,
whose parameters these are), and so do the unrolled layers.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import ClassVar

import numpy as np

from jaxinfer.kernels.cpu import int8 as native_int8
from jaxinfer.layers.linear import register_linear_method
from jaxinfer.layers.linear_methods.packed import FUSED, PACKED, PROJECTIONS, PackedLinear, without_packed

logger = logging.getLogger(__name__)


@register_linear_method
@dataclasses.dataclass(frozen=True)
class Int8PackedLinear(PackedLinear):
    """Packed int8 products (`jaxinfer.kernels.cpu.int8`), ``fallback`` where nothing was packed."""

    name: ClassVar[str] = "int8_packed"

    @staticmethod
    def matmul(x, packed, layer, rows):
        return native_int8.matmul(x, packed, layer, rows)

    def process_weights_after_loading(self, params: dict, cfg) -> tuple[dict, dict | None]:
        packed = packed_variables(params, cfg)
        logger.info("products: int8 weights packed once, jaxinfer/kernels/cpu/csrc/int8_gemm.cc")
        return without_packed(params, packed), packed


def _as_kn(leaf: dict, n_in: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A stacked int8 projection ``{"kernel": [L, *in, *out], "scale": ...}`` as ``(q [L, K, N],
    s [L, K/64, N])``, or None when its groups are not `native_int8.GROUP` inputs or the shape
    is not `native_int8.packable`."""
    q, s = np.asarray(leaf["kernel"]), np.asarray(leaf["scale"], np.float32)
    if q.shape[n_in] // s.shape[n_in] != native_int8.GROUP:
        return None
    L = q.shape[0]
    q, s = q.reshape(L, int(np.prod(q.shape[1:1 + n_in])), -1), s.reshape(L, int(np.prod(s.shape[1:1 + n_in])), -1)
    return (q, s) if native_int8.packable(q.shape[1], q.shape[2], native_int8.GROUP) else None


def packed_variables(params: dict, cfg) -> dict:
    """The `jaxinfer.layers.linear.PACKED_COLLECTION` variables of a stacked int8 ``params`` tree
    (`jaxinfer.layers.quantization.int8`'s layout): each layer projection as `native_int8.pack` (q, s) under
    ``layers/{attn,mlp}/<name>_packed``, q, k and v side by side as one product
    (``layers/attn/qkv_packed``) where they share K, and the LM head (the tied int8 embedding
    transposed, or ``lm_head``) as ``lm_head_packed``: the names of the ``amx_packed`` method.
    Projections that do not fit are left to the fallback (`quant.qdot`). Packed on the host, once."""
    layers = params["layers"]
    out: dict = {"layers": {}}
    qkv = [_as_kn(layers["attn"][name], 1) for name in FUSED["attn"]["qkv"]]
    if all(p is not None for p in qkv) and len({p[0].shape[1] for p in qkv}) == 1:
        out["layers"]["attn"] = {"qkv" + PACKED: native_int8.pack(np.concatenate([p[0] for p in qkv], axis=2),
                                                                  np.concatenate([p[1] for p in qkv], axis=2))}
    for module, name, n_in in PROJECTIONS:
        if module == "attn" and name in FUSED["attn"]["qkv"] and "attn" in out["layers"]:
            continue
        kn = _as_kn(layers[module][name], n_in)
        if kn is not None:
            out["layers"].setdefault(module, {})[name + PACKED] = native_int8.pack(*kn)
    if cfg.tie_word_embeddings:
        emb = params["embed"]
        head = {"kernel": np.asarray(emb["embedding"]).T[None], "scale": np.asarray(emb["scale"]).T[None]}
    else:
        head = {k: np.asarray(v)[None] for k, v in params["lm_head"].items()}
    kn = _as_kn(head, 1)
    if kn is not None:
        out["lm_head" + PACKED] = native_int8.pack(*kn)
    return out
