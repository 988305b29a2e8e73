"""bfloat16 weights on XLA:CPU: bit-stored layer stacks, bit gathers and the one-row product.

Owns three work-arounds for XLA:CPU (jax 0.10.2) behaviours that made a bfloat16 model
slower than float32 on CPU although bfloat16 operands with float32 accumulation are
XLA:CPU's fastest matmul from two rows up (YNNPACK; numbers in
``benchmarks/results/2026-12-02-cpu2-bf16/README.md``):

1. **Sliced stacks.** ``nn.scan`` slices each layer's weights out of the stacked
   ``[L, ...]`` arrays with a dynamic-slice, and XLA:CPU computes a bfloat16
   dynamic-slice in float32: the compiled step converted the *whole* stack to float32 on
   every call (a 30-layer MLP at 32 rows: ~130 ms against ~30 ms). Stored as ``uint16``
   bits (`weights_as_bits`), the slice stays 16-bit, and `bits_as_bfloat16` reinterprets
   the one layer's slice inside the scan body (a bitcast: no conversion, no copy). The
   KV cache is bit-stored on CPU for the same reason (`jaxinfer.layers.attention.kv_storage.BF16_BITS`).
2. **Gathered tables.** A gather from a bfloat16 table is computed in float32 too: the
   embedding lookup converted the whole ``[V, D]`` table (113 MB of float32 for SmolLM2)
   on every step. `take_rows` gathers the rows as bits.
3. **One-row products.** A bfloat16 x bfloat16 dot whose left operand has one row takes a
   slow XLA:CPU path (~100 ms for that MLP at 1 row, float32 ~16 ms); from two rows up it
   is YNNPACK's. `dot_general` and `tied_logits` give a one-row product a second row of
   zeros and keep the first row of the result. (A float32 multiply-and-sum instead was
   split by XLA:CPU into a weight-sized float32 product written out, then its sum.)
   That two-row form still reads the weights at only ~7 GB/s. With ``native=True`` (the
   ``bf16_gemv`` linear method, which the execution plan picks for a model on one CPU device),
   products of one or two rows run the C++ loops of `jaxinfer.kernels.cpu.gemv` instead, which
   read each weight once.

None changes what is computed beyond float32 summation order: operands are the same
bfloat16 values, products and sums float32, as in ``lax.dot_general`` with
``preferred_element_type=float32``.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from jaxinfer.kernels.cpu import gemv as native_gemv
from jaxinfer.layers.attention.kv_storage import BF16_BITS as BITS  # the storage dtype of bit-stored bfloat16 (as the KV cache)
from jaxinfer.layers.attention.kv_storage import kv_storage_dtype, kv_values


def wants_bits(dtype, platform: str) -> bool:
    """Whether a model of ``dtype`` on JAX ``platform`` stores its layer stack as bits: the
    KV cache's rule (`jaxinfer.layers.attention.kv_storage.kv_storage_dtype`)."""
    return kv_storage_dtype(dtype, platform) == BITS


def weights_as_bits(tree):
    """``tree`` with every bfloat16 leaf reinterpreted as `BITS` (same shape and bytes)."""
    return jax.tree.map(lambda x: jax.lax.bitcast_convert_type(x, BITS) if x.dtype == jnp.bfloat16 else x, tree)


def bits_as_bfloat16(tree):
    """Inverse of `weights_as_bits`: `BITS` leaves read as bfloat16 (`jaxinfer.layers.attention.kv_storage.kv_values`),
    other leaves as they are. The ``trans_in_fn`` of the ``nn.map_variables`` around the scanned layer."""
    return jax.tree.map(kv_values, tree)


def take_rows(table, ids, cpu: bool = True):
    """``table[ids]`` (``[V, D]`` rows at int32 ``ids [T]`` -> ``[T, D]``, ``table``'s dtype),
    gathered as bits when ``table`` is bfloat16 and ``cpu`` (the step runs on XLA:CPU; module
    docstring, item 2)."""
    if wants_bits(table.dtype, "cpu" if cpu else "other"):
        return kv_values(jnp.take(weights_as_bits(table), ids, axis=0))
    return jnp.take(table, ids, axis=0)


def _rows(lhs, n_contract: int) -> int:
    return math.prod(lhs.shape[:lhs.ndim - n_contract])


def _one_row_on_cpu(lhs, rhs, n_contract: int, cpu: bool) -> bool:
    return _rows(lhs, n_contract) == 1 and rhs.dtype == jnp.bfloat16 and cpu


def _native_rows(lhs, rhs, n_contract: int, native: bool, cpu: bool) -> bool:
    """Whether the C++ loops take this product: asked for, on CPU, bfloat16 weights, at most
    `jaxinfer.kernels.cpu.gemv.MAX_ROWS` rows."""
    return native and cpu and rhs.dtype == jnp.bfloat16 and _rows(lhs, n_contract) <= native_gemv.MAX_ROWS


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=jnp.float32,
                native: bool = False, cpu: bool = True):
    """``lax.dot_general`` with float32 accumulation; on CPU (``cpu``: the execution plan's
    platform) a product of few rows over bfloat16 weights runs in `jaxinfer.kernels.cpu.gemv` when
    ``native``, else a one-row product runs as two rows (module docstring, item 3).

    Both forms cover the layout `flax.linen.DenseGeneral` passes: ``lhs [*B, *C]``
    contracting its trailing axes ``C`` with the leading axes of ``rhs [*C, *F]``, no batch
    axes; the result is ``[*B, *F]``. Every other call is ``lax.dot_general`` as given.
    """
    (lhs_c, rhs_c), (lhs_b, _) = dimension_numbers
    dot = functools.partial(jax.lax.dot_general, dimension_numbers=dimension_numbers, precision=precision,
                            preferred_element_type=preferred_element_type)
    n = len(lhs_c)
    dense_layout = (not lhs_b and tuple(lhs_c) == tuple(range(lhs.ndim - n, lhs.ndim))
                    and tuple(rhs_c) == tuple(range(n)))
    if dense_layout and _native_rows(lhs, rhs, n, native, cpu):
        k = math.prod(rhs.shape[:n])
        y = native_gemv.matmul_kn(lhs.reshape(-1, k), rhs.reshape(k, -1))
        return y.reshape(*lhs.shape[:lhs.ndim - n], *rhs.shape[n:]).astype(preferred_element_type or y.dtype)
    if not (dense_layout and _one_row_on_cpu(lhs, rhs, n, cpu)):
        return dot(lhs, rhs)
    return dot(jnp.concatenate([lhs, jnp.zeros_like(lhs)]), rhs)[:1]


def tied_logits(x, table, native: bool = False, cpu: bool = True):
    """Logits ``[R, V]`` float32 of hidden states ``x [R, D]`` against a tied embedding
    ``table [V, D]`` (``einsum("rd,vd->rv")``); with bfloat16 on CPU (``cpu``), few rows run in
    `jaxinfer.kernels.cpu.gemv` when ``native``, else one row as two (module docstring, item 3)."""
    if _native_rows(x, table, 1, native, cpu):
        return native_gemv.matmul_nk(x, table)
    if _one_row_on_cpu(x, table, 1, cpu):
        return tied_logits(jnp.concatenate([x, jnp.zeros_like(x)]), table, cpu=cpu)[:1]
    return jnp.einsum("rd,vd->rv", x, table, preferred_element_type=jnp.float32)
