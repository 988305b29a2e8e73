"""int8 weights (``--quantization int8``): the quantized linear and embedding modules,
the matmul they run, and the conversion of a float params tree.

Weights are symmetric int8 with one float32 scale per output channel (absmax:
``s = max_in |w| / 127``, ``q = round(w / s)``; LLM.int8's "vector-wise" weight scales,
Dettmers et al. 2022). The tree keeps the float model's names and logical axes: every
projection's ``kernel`` becomes int8 of the same shape with a ``scale`` beside it (the
kernel's output axes, so the scales shard with their weights), and the embedding table
becomes int8 ``[V, D]`` with a ``scale [V]`` per vocabulary row, which is both the
per-token scale of the lookup and the per-output-channel scale of a tied LM head.
Norms stay float (0.05% of SmolLM2's bytes). See docs/quantization.md for the measured
choice and for why no library does this here.

The matmul (`qdot`) picks its path per compiled bucket from the static row count:
  * fewer than `W8A8_MIN_ROWS` rows (by default every bucket, for quality): the int8 weight is converted to the model dtype
    inside the step and multiplied, the scale applied to the product (weight-only
    quantization, W8A16/W8A32);
  * otherwise W8A8: the activations are quantized per row (absmax int8) and multiplied
    in int8 x int8 -> int32 (``preferred_element_type=int32``), the result scaled by the
    row scale times the channel scale (LLM.int8 without the outlier split; SmoothQuant,
    Xiao et al. 2023, names the same per-token x per-channel scheme).
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

QUANTIZATIONS = ("int8",)
# Buckets with at least this many rows would use integer dots. Off: on SmolLM2 W8A8 at >= 16
# rows kept float32's first 16 greedy tokens on 3 of 9 oracle prompts, weight-only on 5
# (docs/quantization.md); `qdot` takes the threshold per call.
W8A8_MIN_ROWS = 1 << 30
_DUMMY_STD = 0.02  # std of the random weights `init_params` draws; the dummy int8 init matches it


def _int8_init(key, shape, dtype=jnp.int8):
    return jax.random.randint(key, shape, -127, 128, jnp.int32).astype(dtype)


def _scale_init(key, shape, dtype=jnp.float32):
    return jnp.full(shape, _DUMMY_STD * math.sqrt(3.0) / 127.0, dtype)  # uniform int8 -> std 0.02


def quantize_array(w: jax.Array, contract: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """Absmax int8 per output channel.

    Args:
      w: float weight. contract: the axes reduced over (the matmul's input axes).
    Returns:
      (q int8 of w's shape, scale float32 of w's shape without ``contract``), with
      ``|w - q * scale| <= scale / 2`` elementwise.
    """
    w = w.astype(jnp.float32)
    amax = jnp.max(jnp.abs(w), axis=contract, keepdims=True)
    s = jnp.maximum(amax, 1e-30) / 127.0
    q = jnp.clip(jnp.round(w / s), -127, 127).astype(jnp.int8)
    return q, jnp.squeeze(s, axis=contract)


def qdot(x: jax.Array, w: jax.Array, scale: jax.Array, w_contract: tuple[int, ...], dtype,
         w8a8_min_rows: int | None = None) -> jax.Array:
    """``x`` times an int8 weight, dequantized by per-output-channel ``scale``.

    Args:
      x: [rows..., in...] float; its last ``len(w_contract)`` axes are contracted with
        ``w``'s ``w_contract`` axes (in order).
      w: int8 weight; scale: float32 of ``w``'s other (output) axes.
      dtype: the model dtype the weight-only path converts ``w`` to.
      w8a8_min_rows: rows from which the W8A8 path is taken (None: `W8A8_MIN_ROWS`).
    Returns:
      [rows..., out...] float32. The path (module docstring) is chosen from the static
      number of rows.
    """
    n = len(w_contract)
    x_axes = tuple(range(x.ndim - n, x.ndim))
    dims = ((x_axes, tuple(w_contract)), ((), ()))
    rows = math.prod(x.shape[:x.ndim - n])
    if rows < (W8A8_MIN_ROWS if w8a8_min_rows is None else w8a8_min_rows):
        y = jax.lax.dot_general(x.astype(dtype), w.astype(dtype), dims, preferred_element_type=jnp.float32)
        return y * scale
    x32 = x.astype(jnp.float32)
    a = jnp.maximum(jnp.max(jnp.abs(x32), axis=x_axes, keepdims=True), 1e-30) / 127.0
    xq = jnp.clip(jnp.round(x32 / a), -127, 127).astype(jnp.int8)
    y = jax.lax.dot_general(xq, w, dims, preferred_element_type=jnp.int32).astype(jnp.float32)
    a = a.reshape(a.shape[:x.ndim - n] + (1,) * (y.ndim - (x.ndim - n)))
    return y * a * scale


class QDenseGeneral(nn.Module):
    """Bias-free ``nn.DenseGeneral`` with an int8 kernel and per-output-channel scales.

    Params: ``kernel`` int8 [in..., features...] (logical ``names``), ``scale`` float32
    [features...] (the output names). Contracts ``x``'s last ``n_in`` axes.
    """

    features: tuple[int, ...]
    n_in: int
    names: tuple[str, ...]
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        in_shape = x.shape[x.ndim - self.n_in:]
        kernel = self.param("kernel", nn.with_logical_partitioning(_int8_init, self.names),
                            tuple(in_shape) + tuple(self.features), jnp.int8)
        scale = self.param("scale", nn.with_logical_partitioning(_scale_init, self.names[self.n_in:]),
                           tuple(self.features), jnp.float32)
        return qdot(x, kernel, scale, tuple(range(self.n_in)), self.dtype)


class QEmbed(nn.Module):
    """Embedding table int8 ``embedding [V, D]`` with ``scale [V]`` (one per row)."""

    num_embeddings: int
    features: int
    dtype: jnp.dtype = jnp.float32

    def setup(self):
        self.embedding = self.param("embedding", nn.with_logical_partitioning(_int8_init, ("vocab", "embed")),
                                    (self.num_embeddings, self.features), jnp.int8)
        self.scale = self.param("scale", nn.with_logical_partitioning(_scale_init, ("vocab",)),
                                (self.num_embeddings,), jnp.float32)

    def __call__(self, ids):
        """ids [T] int32 -> [T, D] float32."""
        return self.embedding[ids].astype(jnp.float32) * self.scale[ids][:, None]

    def attend(self, x):
        """Tied LM head: x [R, D] -> logits [R, V] float32."""
        return qdot(x, self.embedding, self.scale, (1,), self.dtype)


def _contract_axes(path: tuple[str, ...]) -> tuple[int, ...] | None:
    """The input axes of a quantized leaf (by its path in the params tree), or None for
    leaves kept float (norms)."""
    name = path[-1]
    if path[0] == "embed" and name == "embedding":
        return (1,)  # per vocabulary row
    if name != "kernel":
        return None
    if path[0] == "lm_head":
        return (0,)
    return (1, 2) if path[-2] == "o_proj" else (1,)  # layer-stacked: axis 0 is L


def quantize_params(params, shardings=None):
    """A float params tree -> the int8 tree of `QDenseGeneral` / `QEmbed` (same names,
    ``scale`` leaves added), computed on device in one jitted call.

    Args:
      params: the float tree (numpy or ``jax.Array``, any sharding).
      shardings: the quantized tree's shardings (`jaxinfer.sharding.param_shardings` of
        the quantized config), or None for the default device.
    Returns:
      The quantized tree; the float input is not kept.
    """
    def convert(node, path=()):
        res = {}
        for k, v in node.items():
            if isinstance(v, dict):
                res[k] = convert(v, path + (k,))
                continue
            contract = _contract_axes(path + (k,))
            if contract is None:
                res[k] = v
            else:
                res[k], res["scale"] = quantize_array(v, contract)
        return res

    out = {} if shardings is None else {"out_shardings": shardings}
    return jax.jit(convert, **out)(params)
