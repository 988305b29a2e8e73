"""``bf16_gemv``: bfloat16 weights on one CPU device, products of one or two rows (a lone
stream's decode step) in the C++ loops of `jaxinfer.kernels.cpu.gemv`, which read each weight once;
more rows as ``dense_cpu`` (`jaxinfer.layers.cpu_bf16.dot_general` with ``native=True``).
Same parameters as ``dense``.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from jaxinfer.layers.linear import register_linear_method
from jaxinfer.layers.linear_methods.dense import CpuDenseLinear


@register_linear_method
@dataclasses.dataclass(frozen=True)
class Bf16GemvLinear(CpuDenseLinear):
    """``dense_cpu`` with few-row bfloat16 products (and the tied LM head's) in `jaxinfer.kernels.cpu.gemv`."""

    name: ClassVar[str] = "bf16_gemv"
    native: ClassVar[bool] = True
