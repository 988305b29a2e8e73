"""How the paged KV cache stores its floats: one `KVStorage` type for every format (float,
bfloat16 held as its bits on CPU, 8-bit with per-token scales), with the KV write into the
pages and the page gather that both attention backends use.

Layout (per engine): ``k_cache, v_cache [L, num_blocks, block_size, K, H]``, all layers stacked
so the layer scan carries it in place (donated to the step). The token with slot ``s`` lives at
``[layer, s // block_size, s % block_size]``; block 0 is the null block that padding tokens
write into. Formats:

  float: the model dtype (float32, or bfloat16 off CPU).
  bf16_bits: a bfloat16 cache on CPU holds its uint16 bits (`BF16_BITS`): XLA:CPU upcasts a
    bfloat16 update of the carried cache to float32 over the whole pool (plus a full copy)
    every layer of every step; an integer update stays in place.
  int8 / fp8 (``--kv-cache-dtype``): a `jaxinfer.layers.attention.kv_quant.QuantKV` pytree of 8-bit values and
    bfloat16-bit scales per token and KV head (the quantization is `jaxinfer.layers.attention.kv_quant`'s).

The format is chosen once: by the runner from the model dtype, the platform and
``--kv-cache-dtype`` (`KVStorage.select`), and inside the step from the cache itself
(`KVStorage.of`, the one place that looks at a cache's type).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxinfer.layers.attention import kv_quant
from jaxinfer.layers.attention.kv_quant import QuantKV

BF16_BITS = jnp.uint16  # the storage dtype of bit-stored bfloat16
FORMATS = ("float", "bf16_bits", "int8", "fp8")


@dataclasses.dataclass(frozen=True)
class KVStorage:
    """One KV cache format (static, hashable).

    Attributes:
      kind: one of `FORMATS`.
      dtype: the array dtype of the pages' values (float: the model dtype; bf16_bits: uint16;
        int8: int8; fp8: float8_e4m3fn).

    Raises:
      ValueError: an unknown kind.
    """

    kind: str
    dtype: jnp.dtype

    def __post_init__(self) -> None:
        if self.kind not in FORMATS:
            raise ValueError(f"unknown KV storage {self.kind!r} (expected one of {', '.join(FORMATS)})")

    @classmethod
    def select(cls, dtype, platform: str, kv_cache_dtype: str = "auto") -> KVStorage:
        """The format of a cache for model ``dtype`` on ``platform`` ("cpu", "gpu", "tpu") with
        ``kv_cache_dtype`` ("auto", "int8", "fp8"; checked by `kv_quant.check_kv_cache_dtype`)."""
        if kv_cache_dtype in ("int8", "fp8"):
            return cls(kv_cache_dtype, jnp.dtype(kv_quant.STORE_DTYPES[kv_cache_dtype]))
        dtype = jnp.dtype(dtype)
        if dtype == jnp.bfloat16 and platform == "cpu":
            return cls("bf16_bits", jnp.dtype(BF16_BITS))
        return cls("float", dtype)

    @classmethod
    def of(cls, cache) -> KVStorage:
        """The format of a cache (an array, or a `QuantKV`), read at trace time."""
        if isinstance(cache, QuantKV):
            return cls(cache.kind, jnp.dtype(cache.values.dtype))
        return cls("bf16_bits" if cache.dtype == BF16_BITS else "float", jnp.dtype(cache.dtype))

    @property
    def quantized(self) -> bool:
        """Whether values come with per-token scales (int8, fp8)."""
        return self.kind in ("int8", "fp8")

    def alloc(self, shape: tuple[int, ...]):
        """A zeroed cache of ``shape`` [L, NB, bs, K, H] (an 8-bit one with zero scales: reads as 0)."""
        return kv_quant.alloc(shape, self.kind) if self.quantized else jnp.zeros(shape, self.dtype)

    def sharding(self, values):
        """The cache's sharding given its values' ``NamedSharding`` (an 8-bit cache's scales
        ``[L, NB, bs, K]`` split like the values)."""
        if not self.quantized:
            return values
        scales = jax.sharding.NamedSharding(values.mesh, jax.sharding.PartitionSpec(*tuple(values.spec)[:4]))
        return QuantKV(values, scales)

    def bytes_per_token_head(self, head_dim: int) -> int:
        """Bytes one token's K (or V) of one KV head takes (`kv_quant.kv_bytes_per_token_head`)."""
        return kv_quant.kv_bytes_per_token_head(head_dim, self.kind if self.quantized else "auto",
                                                jnp.dtype(self.dtype).itemsize)

    def values(self, x: jax.Array) -> jax.Array:
        """Stored (unquantized) contents as floats: bit-stored bfloat16 reinterpreted, no conversion."""
        return jax.lax.bitcast_convert_type(x, jnp.bfloat16) if self.kind == "bf16_bits" else x

    def as_stored(self, x: jax.Array) -> jax.Array:
        """``x [..., H]`` as the pages give it back to attention: an 8-bit cache's quantized then
        dequantized float32, else ``x`` itself (the path reads the new tokens at their own precision)."""
        return kv_quant.as_stored(x, self.kind) if self.quantized else x

    def write(self, cache, layer: jax.Array, slot_mapping: jax.Array, new: jax.Array):
        """Scatter ``new [T, K, H]`` into ``cache`` at the slots, one combined-index scatter on the
        carried cache (no per-layer slice is copied); an 8-bit cache quantizes per token and KV head."""
        if self.quantized:
            return kv_quant.write(cache, layer, slot_mapping, new)
        bs = cache.shape[2]
        if self.kind == "bf16_bits":
            new = jax.lax.bitcast_convert_type(new.astype(jnp.bfloat16), BF16_BITS)
        return cache.at[layer, slot_mapping // bs, slot_mapping % bs].set(new.astype(cache.dtype))

    def gather_pages(self, cache, layer: jax.Array, blocks: jax.Array) -> jax.Array:
        """The pages ``blocks`` (int32, any shape B) of ``layer``: [*B, bs, K, H] floats (an 8-bit
        cache dequantized to float32). One gather indexed by (layer, block) on the carried cache,
        no per-layer copy. Not through a flattened ``[L*NB, ...]`` view: XLA:CPU then rewrote the
        cache's in-place K/V update into a second update of the reshaped view, which cost full
        copies of the whole pool per layer (seen as ~1.5 s decode steps on 260-block pools)."""
        if self.quantized:
            return kv_quant.gather_pages(cache, layer, blocks)
        return self.values(cache.at[layer, blocks].get(mode="promise_in_bounds"))

    def kernel_operands(self, cache) -> tuple[jax.Array, jax.Array | None]:
        """(values, scales) as a kernel takes them: the stored array and None, or an 8-bit
        cache's values [L, NB, bs, K, H] and uint16 scales [L, NB, bs, K]."""
        return (cache.values, cache.scales) if self.quantized else (cache, None)


def kv_storage_dtype(dtype, platform: str):
    """The array dtype of an unquantized KV cache for model ``dtype`` on ``platform``."""
    return KVStorage.select(dtype, platform).dtype


def kv_values(x: jax.Array) -> jax.Array:
    """Cache contents as floats (bit-stored bfloat16 reinterpreted; no conversion)."""
    return KVStorage.of(x).values(x)


def write_kv(cache, layer: jax.Array, slot_mapping: jax.Array, new: jax.Array):
    """Scatter new K or V ``[T, K, H]`` into ``cache [L, NB, bs, K, H]`` at the slots
    (`KVStorage.write` of the cache's format).

    A one-token step also writes its token to the null slot 0 (block 0, never read as
    context), so that the write stays a scatter: XLA:CPU turns a one-index scatter into a
    dynamic-update-slice, and in the tensor-parallel decode step it then fused that update
    a second time into the attention's page gather, so copy insertion copied the whole
    carried V cache twice per layer (SmolLM2 at TP 2, 600 blocks: 6.6 s decode steps, 81 ms
    with the scatter; a tiny model at TP 2 grew from 2 ms at 2,000 blocks to 400 ms at 50,000).
    """
    if slot_mapping.shape[0] == 1:  # see above: keep a scatter
        slot_mapping = jnp.concatenate([slot_mapping, jnp.zeros((1,), slot_mapping.dtype)])
        new = jnp.concatenate([new, new])
    return KVStorage.of(cache).write(cache, layer, slot_mapping, new)


def gather_pages(cache, layer: jax.Array, blocks: jax.Array) -> jax.Array:
    """`KVStorage.gather_pages` of the cache's own format."""
    return KVStorage.of(cache).gather_pages(cache, layer, blocks)
