"""Float weights through XLA's dot: ``dense`` (as given) and ``dense_cpu`` (XLA:CPU, where a
one-row bfloat16 product runs as two rows and bfloat16 tables are gathered as bits,
`jaxinfer.layers.cpu_bf16`).

Parameters: ``nn.DenseGeneral``'s ``kernel [*in, *features]`` per projection and ``nn.Embed``'s
``embedding [V, D]`` (`jaxinfer.models.llama`'s tree). Operands in the compute dtype, float32
accumulation (``lax.dot_general(..., preferred_element_type=float32)``).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp

from jaxinfer.layers.linear import LinearMethod, Projection, register_linear_method
from jaxinfer.layers import cpu_bf16

_init = nn.initializers.normal(0.02)


def _part(init, names):
    return nn.with_logical_partitioning(init, names)


@register_linear_method
@dataclasses.dataclass(frozen=True)
class DenseLinear(LinearMethod):
    """XLA's dot over float weights (any platform)."""

    name: ClassVar[str] = "dense"
    cpu: ClassVar[bool] = False  # `cpu_bf16`'s XLA:CPU work-arounds
    native: ClassVar[bool] = False  # one- and two-row bfloat16 products in `jaxinfer.kernels.cpu.gemv`

    def create_weights(self, module: nn.Module, p: Projection) -> nn.Module:
        """``nn.DenseGeneral`` named ``p.name``, kernel ``[*in, *features]`` with logical axes ``p.names``."""
        axis = tuple(range(-p.n_in, 0)) if p.n_in > 1 else -1
        dot = functools.partial(cpu_bf16.dot_general, native=self.native, cpu=self.cpu)
        return nn.DenseGeneral(p.features, axis=axis, use_bias=False, dtype=module.dtype,
                               param_dtype=module.param_dtype, dot_general=dot, kernel_init=_part(_init, p.names),
                               name=p.name)

    def embedding(self, module: nn.Module, cfg) -> nn.Module:
        return nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=module.dtype, param_dtype=module.param_dtype,
                        embedding_init=_part(_init, ("vocab", "embed")), name="embed")

    def embed(self, module: nn.Module, table: nn.Module, ids):
        """``nn.Embed``'s lookup in the compute dtype (gathered as bits on CPU, `cpu_bf16.take_rows`)."""
        return cpu_bf16.take_rows(table.embedding.astype(module.dtype), ids, cpu=self.cpu).astype(jnp.float32)

    def logits(self, module: nn.Module, cfg, x, table: nn.Module, rows=None):
        if cfg.tie_word_embeddings:
            return cpu_bf16.tied_logits(x.astype(module.dtype), table.embedding.astype(module.dtype), self.native,
                                        cpu=self.cpu)
        return self.apply(module, Projection("lm_head", cfg.vocab_size, ("embed", "vocab")), x)


@register_linear_method
@dataclasses.dataclass(frozen=True)
class CpuDenseLinear(DenseLinear):
    """XLA:CPU's dot with `cpu_bf16`'s work-arounds (a one-row bfloat16 product as two rows,
    bfloat16 embedding rows gathered as bits); float32 weights run exactly as ``dense``."""

    name: ClassVar[str] = "dense_cpu"
    cpu: ClassVar[bool] = True
