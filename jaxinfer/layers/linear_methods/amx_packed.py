"""``amx_packed``: bfloat16 unquantized weights packed once at load for the kernel of
`jaxinfer.kernels.cpu.amx` (AMX tiles, or AVX-512 BF16's VDPBF16PS), which runs every row count over
them in place by layer index: each projection, q/k/v as one product, the MLP's gate and up as
one gated call, and the LM head. What is not packable runs the fallback method (and so do the
unrolled layers, which get no packed weights). Parameters are the fallback's.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jaxinfer.kernels.cpu import amx as native_amx
from jaxinfer.layers.linear import register_linear_method
from jaxinfer.layers.linear_methods.packed import (FUSED, PACKED, PROJECTIONS, PackedLinear, as_kn, packed_as,
                                                   read_packed, without_packed)

logger = logging.getLogger(__name__)


@register_linear_method
@dataclasses.dataclass(frozen=True)
class AmxPackedLinear(PackedLinear):
    """Packed bfloat16 products (`jaxinfer.kernels.cpu.amx`), ``fallback`` where nothing was packed."""

    name: ClassVar[str] = "amx_packed"

    @staticmethod
    def matmul(x, packed, layer, rows):
        return native_amx.matmul(x, packed, layer, rows)

    def gated(self, module: nn.Module, x, layer, act: str, rows=None):
        packed = read_packed(module, "gate_up")
        if packed is None or act not in native_amx.GATED_ACTS:
            return None
        lead = x.shape[:-1]
        return native_amx.gated_matmul(x.reshape(math.prod(lead), -1), packed, layer, act, rows).reshape(*lead, -1)

    def process_weights_after_loading(self, params: dict, cfg) -> tuple[dict, dict | None]:
        packed = packed_variables(params, cfg)
        logger.info("products: bfloat16 weights packed once, jaxinfer/kernels/cpu/csrc/amx_gemm.cc")
        return without_packed(params, packed), packed


def _fused_layers(layers: dict, cfg) -> dict:
    """The fused products' packed stacks: gate and up as one (`native_amx.pack_gated`) where
    `native_amx.gated_packable` and ``cfg.hidden_act`` is one of `native_amx.GATED_ACTS`; q, k
    and v as one ``[L, K, Nq + Nk + Nv]`` product where their widths add up to a packable one
    (a lone stream's step made 120 small calls of them)."""
    out: dict = {}
    if "mlp" in layers:  # a mixture of experts without dense layers has none
        gate, up = (np.asarray(layers["mlp"][name]["kernel"]) for name in ("gate_proj", "up_proj"))
        if cfg.hidden_act in native_amx.GATED_ACTS and native_amx.gated_packable(*gate.shape[1:]):
            out["mlp"] = {"gate_up" + PACKED: jnp.asarray(native_amx.pack_gated(gate, up))}
    qkv = [as_kn(layers["attn"][name]["kernel"], 1) for name in FUSED["attn"]["qkv"]]
    if len({w.shape[1] for w in qkv}) == 1 and native_amx.packable(qkv[0].shape[1], sum(w.shape[2] for w in qkv)):
        out["attn"] = {"qkv" + PACKED: jnp.asarray(native_amx.pack(np.concatenate(qkv, axis=2)))}
    return out


def packed_variables(params: dict, cfg) -> dict:
    """The `jaxinfer.layers.linear.PACKED_COLLECTION` variables of a stacked bfloat16 ``params``
    tree (`jaxinfer.models.llama`'s layout, unquantized): each layer projection's kernel
    ``[L, *in, *out]`` as ``[L, K, N]`` packed (`native_amx.pack`) under
    ``layers/{attn,mlp}/<name>_packed``, and the LM head's ``[D, V]`` (the tied embedding
    transposed, or ``lm_head``) as ``lm_head_packed``. Projections whose K or N is not a
    multiple of 32 are left out (the fallback runs them); the fused products (`_fused_layers`)
    are not also packed one by one. Packed on the host, once."""
    layers = params["layers"]
    out: dict = {"layers": _fused_layers(layers, cfg)}
    for module, name, n_in in PROJECTIONS:
        if module not in layers or packed_as(module, name, out["layers"].get(module, {})):
            continue  # (no dense MLP in a mixture of experts: its experts run unpacked, jaxinfer.layers.moe)
        w = as_kn(layers[module][name]["kernel"], n_in)
        if native_amx.packable(*w.shape[1:]):
            out["layers"].setdefault(module, {})[name + PACKED] = jnp.asarray(native_amx.pack(w))
    head = np.asarray(params["embed"]["embedding"]).T if cfg.tie_word_embeddings else np.asarray(params["lm_head"]["kernel"])
    if native_amx.packable(*head.shape):
        out["lm_head" + PACKED] = jnp.asarray(native_amx.pack(head[None]))
    return out
