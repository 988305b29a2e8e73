"""``int8``: int8 weights with group scales (``--quantization int8``) through XLA's
dequantize-then-dot (`jaxinfer.layers.quantization.int8.qdot`).

Parameters: `jaxinfer.layers.quantization.int8.QDenseGeneral`'s ``kernel`` int8 and ``scale`` per
projection, `QEmbed`'s int8 ``embedding [V, D]`` and ``scale [V, D / g]``; a tied LM head
dequantizes the table chunk by chunk (`QEmbed.attend`).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from jaxinfer.layers.linear import LinearMethod, Projection, register_linear_method
from jaxinfer.layers.quantization.int8 import QDenseGeneral, QEmbed


@register_linear_method
@dataclasses.dataclass(frozen=True)
class Int8Linear(LinearMethod):
    """Weight-only int8 products (`jaxinfer.layers.quantization.int8`), any platform."""

    name: ClassVar[str] = "int8"

    def create_weights(self, module: nn.Module, p: Projection) -> nn.Module:
        return QDenseGeneral(p.feature_tuple, p.n_in, p.names, module.dtype, name=p.name)

    def embedding(self, module: nn.Module, cfg) -> nn.Module:
        return QEmbed(cfg.vocab_size, cfg.hidden_size, module.dtype, name="embed")

    def embed(self, module: nn.Module, table: nn.Module, ids):
        return table(ids).astype(jnp.float32)

    def logits(self, module: nn.Module, cfg, x, table: nn.Module, rows=None):
        if cfg.tie_word_embeddings:
            return table.attend(x)
        return self.apply(module, Projection("lm_head", cfg.vocab_size, ("embed", "vocab")), x)
