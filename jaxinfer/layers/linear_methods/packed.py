"""The packed-weight layout shared by the packed linear methods (``amx_packed``,
``int8_packed``): which projections are packed, under which names, how the model reads them
and how the stacked copies are dropped.

A projection ``<name>`` of layer module ``attn`` or ``mlp`` has its packed stack (all L layers)
under ``layers/<module>/<name>_packed`` in the `PACKED_COLLECTION` collection, the LM head
under ``lm_head_packed``; projections packed together as one product are named by `FUSED`.
"""
from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import numpy as np

from jaxinfer.layers.linear import PACKED_COLLECTION, LinearMethod, Projection

PACKED = "_packed"  # suffix of a projection's packed stack in the `PACKED_COLLECTION` collection
# The layer projections that take packed weights: (module path under ``layers``, projection
# name, number of contracted kernel axes).
PROJECTIONS = (("attn", "q_proj", 1), ("attn", "k_proj", 1), ("attn", "v_proj", 1), ("attn", "o_proj", 2),
               ("mlp", "gate_proj", 1), ("mlp", "up_proj", 1), ("mlp", "down_proj", 1))
# Projections packed together as one product, by module: fused name -> its members, in the
# order of the fused output's columns ("gate_up" interleaves its members' 16-column blocks,
# `jaxinfer.kernels.cpu.amx.pack_gated`; "qkv" is q's, k's and v's kernels side by side, in that order).
FUSED = {"mlp": {"gate_up": ("gate_proj", "up_proj")}, "attn": {"qkv": ("q_proj", "k_proj", "v_proj")}}


def read_packed(module: nn.Module, name: str):
    """The packed weights of ``module``'s projection ``name`` (all layers), or None when the
    caller passed none (the unrolled layers, or a projection that was not packable)."""
    key = name + PACKED
    return module.get_variable(PACKED_COLLECTION, key) if module.has_variable(PACKED_COLLECTION, key) else None


def packed_as(module: str, name: str, have: dict) -> bool:
    """Whether projection ``name`` of ``module`` has a packed copy in ``have`` (that module's
    packed variables), alone or inside a fused product (`FUSED`)."""
    return name + PACKED in have or any(fused + PACKED in have and name in members
                                        for fused, members in FUSED.get(module, {}).items())


def without_packed(params: dict, packed: dict) -> dict:
    """``params`` without the layer kernels that ``packed`` holds a packed copy of, alone or in
    a fused product (`FUSED`): the scanned step reads only the packed copy, so the stacked
    kernels were the weights' bytes held twice for nothing. The int8 scales beside a dropped
    kernel go with it. Biases, norms, the embedding and an untied ``lm_head`` (which the
    prompt-logprobs head reads) stay. The input tree is not modified."""
    layers = {module: dict(sub) for module, sub in params["layers"].items()}
    for module, name, _ in PROJECTIONS:
        if packed_as(module, name, packed["layers"].get(module, {})):
            rest = {k: v for k, v in layers[module][name].items() if k not in ("kernel", "scale")}
            if rest:
                layers[module][name] = rest
            else:
                del layers[module][name]
    return {**params, "layers": layers}


def as_kn(kernel, n_in: int) -> np.ndarray:
    """A stacked projection kernel ``[L, *in, *out]`` as ``[L, K, N]`` (``n_in`` contracted axes)."""
    kernel = np.asarray(kernel)
    return kernel.reshape(kernel.shape[0], math.prod(kernel.shape[1:1 + n_in]), -1)


@dataclasses.dataclass(frozen=True)
class PackedLinear(LinearMethod):
    """The reading side of a packed method: each product from the packed stack of its layer
    when the caller passed one (`read_packed`), else by ``fallback`` (whose parameters, embedding
    and tied head these are). Subclasses give the kernel call (`matmul`)."""

    fallback: LinearMethod = None

    @staticmethod
    def matmul(x, packed, layer, rows):
        """``x [M, K]`` (compute dtype) times layer ``layer`` of ``packed`` -> float32 ``[M, N]``,
        only the first ``rows`` rows computed (None: all), the rest zeros."""
        raise NotImplementedError

    def create_weights(self, module: nn.Module, p: Projection) -> nn.Module:
        return self.fallback.create_weights(module, p)

    def apply(self, module: nn.Module, p: Projection, x, layer=None, rows=None):
        packed = read_packed(module, p.name)
        if packed is None:
            return self.fallback.apply(module, p, x, layer, rows)
        lead = x.shape[:x.ndim - p.n_in]
        x = x.reshape(math.prod(lead), -1).astype(module.dtype)  # the compute dtype, as XLA's dot gets it
        return self.matmul(x, packed, layer, rows).reshape(*lead, *p.feature_tuple)

    def fused(self, module: nn.Module, group: str, x, layer, rows=None):
        packed = read_packed(module, group)
        if packed is None:
            return None
        return self.matmul(x.reshape(-1, x.shape[-1]).astype(module.dtype), packed, layer, rows)

    def embedding(self, module: nn.Module, cfg) -> nn.Module:
        return self.fallback.embedding(module, cfg)

    def embed(self, module: nn.Module, table: nn.Module, ids):
        return self.fallback.embed(module, table, ids)

    def logits(self, module: nn.Module, cfg, x, table: nn.Module, rows=None):
        packed = read_packed(module, "lm_head")
        if packed is None:
            return self.fallback.logits(module, cfg, x, table, rows)
        return self.matmul(x.astype(module.dtype), packed, 0, rows)
