"""The 8-bit KV cache (``--kv-cache-dtype int8|fp8``): its storage, the quantizing write
and the dequantizing read, shared by both attention backends through
`jaxinfer.layers.attention.kv_storage.KVStorage`.

A quantized cache is a `QuantKV` pytree per K and per V: 8-bit ``values [L, NB, bs, K, H]``
and one scale per token and KV head, ``scales [L, NB, bs, K]`` (bfloat16, held as its
uint16 bits like a bfloat16 cache on CPU, see `jaxinfer.layers.attention.kv_storage.KVStorage`).
Symmetric absmax quantization per (token, KV head), as in vLLM's per-token KV quantization
and KIVI (Liu et al., 2024, "KIVI: a tuning-free asymmetric 2bit quantization for KV
cache", whose key/value-per-token variant this is):

  int8: ``s = max|x| / 127``, ``q = clip(round(x / s), -127, 127)``; ``|x - q s| <= s / 2``.
  fp8 (OCP e4m3, ``float8_e4m3fn``): ``s = max|x| / 448``, ``q = e4m3(x / s)``; the
  rounding error of ``x / s`` is at most 2^-4 of its magnitude (3 mantissa bits) for
  normal numbers and ``2^-10`` absolute below 2^-6 (subnormals), so
  ``|x - q s| <= max(2^-4 |x|, 2^-10 s)``.

``s`` is rounded to bfloat16 *before* ``x / s`` is taken, so the bounds hold for the stored
scale exactly. With H = 64 a token-head costs 64 + 2 bytes instead of 128 in bfloat16
(1.94x the blocks) or 256 in float32 (3.9x).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

KV_CACHE_DTYPES = ("auto", "int8", "fp8")
SCALE_BITS = jnp.uint16  # bfloat16 scales held as their bits (in-place scatter on XLA:CPU)
SCALE_BYTES = 2
_QMAX = {"int8": 127.0, "fp8": 448.0}  # largest magnitude of int8 / float8_e4m3fn
STORE_DTYPES = {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn}  # the 8-bit values' dtype per kind


@struct.dataclass
class QuantKV:
    """One 8-bit paged cache (K or V): ``values [L, NB, bs, K, H]`` int8 or
    float8_e4m3fn, ``scales [L, NB, bs, K]`` uint16 (bfloat16 bits). A pytree, carried
    through the layer scan and donated to the step like a plain cache array."""

    values: jax.Array
    scales: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of ``values`` (what a plain cache array's shape would be)."""
        return self.values.shape

    @property
    def kind(self) -> str:
        """``"int8"`` or ``"fp8"``."""
        return "int8" if self.values.dtype == jnp.int8 else "fp8"


def check_kv_cache_dtype(kv_cache_dtype: str, platform: str) -> None:
    """Refuse an unknown ``--kv-cache-dtype``, or fp8 where the backend has no e4m3.

    fp8 (``float8_e4m3fn``) is converted by XLA on CPU and on GPUs of compute capability
    8.9 (Ada) and later; TPUs before v5p have no e4m3 either.

    Raises:
      ValueError: the name is not one of `KV_CACHE_DTYPES`, or fp8 on a GPU older than
        sm_89 or on a TPU.
    """
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    if kv_cache_dtype != "fp8" or platform == "cpu":
        return
    if platform == "gpu":
        cc = getattr(jax.devices()[0], "compute_capability", "0")
        if tuple(int(p) for p in str(cc).split(".")[:2]) >= (8, 9):
            return
        raise ValueError(f"--kv-cache-dtype fp8 needs float8 e4m3 support (GPU compute capability >= 8.9); this "
                         f"GPU has {cc}: use --kv-cache-dtype int8")
    raise ValueError(f"--kv-cache-dtype fp8 is not supported on {platform}: use --kv-cache-dtype int8")


def kv_bytes_per_token_head(head_dim: int, kv_cache_dtype: str, itemsize: int) -> int:
    """Bytes one token's K (or V) of one KV head takes: ``H * itemsize`` for a float
    cache (``kv_cache_dtype`` "auto"), ``H + 2`` (8-bit values and a bfloat16 scale) else."""
    return head_dim * itemsize if kv_cache_dtype == "auto" else head_dim + SCALE_BYTES


def alloc(shape: tuple[int, ...], kind: str) -> QuantKV:
    """A zeroed cache of ``shape`` [L, NB, bs, K, H] (scales zero: reads as 0)."""
    return QuantKV(jnp.zeros(shape, STORE_DTYPES[kind]), jnp.zeros(shape[:-1], SCALE_BITS))


def quantize(x: jax.Array, kind: str) -> tuple[jax.Array, jax.Array]:
    """Per-row absmax quantization over the last axis (module docstring).

    Args:
      x: [..., H] float. kind: "int8" or "fp8".
    Returns:
      (values [..., H] int8 / float8_e4m3fn, scales [...] uint16 bfloat16 bits).
    """
    x = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(x), axis=-1)
    s = (jnp.maximum(amax, 1e-30) / _QMAX[kind]).astype(jnp.bfloat16)  # the stored scale
    y = x / s.astype(jnp.float32)[..., None]
    if kind == "int8":
        q = jnp.clip(jnp.round(y), -127, 127).astype(jnp.int8)
    else:
        q = jnp.clip(y, -448.0, 448.0).astype(jnp.float8_e4m3fn)
    return q, jax.lax.bitcast_convert_type(s, SCALE_BITS)


def scale_values(scales: jax.Array) -> jax.Array:
    """Stored scales (uint16 bits) as float32."""
    return jax.lax.bitcast_convert_type(scales, jnp.bfloat16).astype(jnp.float32)


def dequantize(values: jax.Array, scales: jax.Array) -> jax.Array:
    """``values [..., H]`` times ``scales [...]`` (uint16 bits) -> float32 [..., H]."""
    return values.astype(jnp.float32) * scale_values(scales)[..., None]


def as_stored(x: jax.Array, kind: str) -> jax.Array:
    """``x [..., H]`` as an 8-bit cache of ``kind`` gives it back (quantized, then dequantized;
    float32): the step's new K/V as every later read sees them."""
    return dequantize(*quantize(x, kind))


def write(cache: QuantKV, layer: jax.Array, slot_mapping: jax.Array, new: jax.Array) -> QuantKV:
    """Quantize new K or V ``[T, K, H]`` and scatter values and scales at the slots
    (one combined-index scatter each, as `jaxinfer.layers.attention.kv_storage.KVStorage.write`)."""
    bs = cache.values.shape[2]
    q, s = quantize(new, cache.kind)
    idx = (layer, slot_mapping // bs, slot_mapping % bs)
    return QuantKV(cache.values.at[idx].set(q), cache.scales.at[idx].set(s))


def gather_pages(cache: QuantKV, layer: jax.Array, blocks: jax.Array) -> jax.Array:
    """Dequantized pages ``blocks`` (any shape B) of ``layer`` -> float32 [*B, bs, K, H];
    indexed by (layer, block) on the carried arrays
    (see `jaxinfer.layers.attention.kv_storage.KVStorage.gather_pages`)."""
    v = cache.values.at[layer, blocks].get(mode="promise_in_bounds")
    s = cache.scales.at[layer, blocks].get(mode="promise_in_bounds")
    return dequantize(v, s)
