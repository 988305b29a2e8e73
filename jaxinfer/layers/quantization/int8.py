"""int8 weights (``--quantization int8``): the quantized linear and embedding modules,
the matmul they run, and the conversion of a float params tree.

Weights are symmetric int8 with group scales: along each matmul's innermost input axis,
every run of `GROUP_SIZE` elements of an output channel has its own absmax scale
(``s = max |w| / 127`` rounded up to `SCALE_DTYPE`, ``q = round(w / s)``), as llama.cpp's
Q8_0 (groups of 32, float16 scales) and the "group-wise" scales of GPTQ/AWQ. The tree keeps
the float model's names and logical axes: every projection's ``kernel`` becomes int8 of the
same shape with a ``scale`` beside it that has the kernel's axes and names, the grouped axis
divided by the group size (so the scales shard with their weights, even along a split input
axis), and the embedding table becomes int8 ``[V, D]`` with ``scale [V, D / g]``: groups of
each row, which are both the per-token scales of the lookup and the group scales of a tied
LM head. Norms stay float (0.05% of SmolLM2's bytes). See docs/quantization.md for the
measured choice (group size, scale dtype, rounding) and for why no library does this here.

The matmul (`qdot`) picks its path per compiled bucket from the static row count:
  * fewer than `W8A8_MIN_ROWS` rows (by default every bucket, for quality): the int8
    weight is dequantized (times its group scales) to the model dtype inside the step and
    multiplied (weight-only quantization, W8A16/W8A32);
  * otherwise W8A8: the activations are quantized per row (absmax int8) and multiplied in
    int8 x int8 -> int32 (``preferred_element_type=int32``) one group at a time (the groups
    a batch axis), each partial product scaled by the row scale times its group scale and
    summed (SmoothQuant's per-token activation scales, Xiao et al. 2023, with group-wise
    weight scales).
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

QUANTIZATIONS = ("int8",)
# Inputs per scale: each output channel's weights get one scale per GROUP_SIZE consecutive
# elements of the (innermost) input axis, stored as SCALE_DTYPE. Chosen by greedy agreement
# with float32 on SmolLM2 at >= 3.8x fewer bytes than float32 (docs/quantization.md).
GROUP_SIZE = 64
SCALE_DTYPE = jnp.bfloat16
# Buckets with at least this many rows would use integer dots. Off: on SmolLM2 W8A8 at >= 16
# rows kept float32's first 16 greedy tokens on 3 of 9 oracle prompts with per-channel
# scales (docs/quantization.md); `qdot` takes the threshold per call.
W8A8_MIN_ROWS = 1 << 30
# The tied LM head dequantizes the int8 table this many vocabulary rows at a time, in a
# loop, so each float chunk stays in cache instead of a float copy of the whole [V, D]
# table being written and read back every step (`tied_head_logits`; docs/quantization.md).
# 0: the whole table at once. Read when the step is traced.
HEAD_CHUNK = 1024
HEAD_BLOCKS = 1  # runs of consecutive rows per chunk (`tied_head_logits`); 8 ran 2-5x slower (docs)
_DUMMY_STD = 0.02  # std of the random weights `init_params` draws; the dummy int8 init matches it


def _int8_init(key, shape, dtype=jnp.int8):
    return jax.random.randint(key, shape, -127, 128, jnp.int32).astype(dtype)


def _scale_init(key, shape, dtype=SCALE_DTYPE):
    return jnp.full(shape, _DUMMY_STD * math.sqrt(3.0) / 127.0, dtype)  # uniform int8 -> std 0.02


def group_size(n: int, group: int = GROUP_SIZE) -> int:
    """Elements per scale along an input axis of length ``n``: the largest divisor of ``n``
    not above ``group`` (static; e.g. 576 with 128 -> 96, so shapes never need padding)."""
    return max(d for d in range(1, min(n, group) + 1) if n % d == 0)


def scale_shape(shape: tuple[int, ...], axis: int, group: int = GROUP_SIZE) -> tuple[int, ...]:
    """Shape of the scales of an int8 weight of ``shape`` grouped along input ``axis``: the
    weight's shape with that axis divided by its `group_size`."""
    n = shape[axis]
    return shape[:axis] + (n // group_size(n, group),) + shape[axis + 1:]


def _split(x: jax.Array, axis: int, ng: int) -> jax.Array:
    """``x`` with ``axis`` (length ng * g) split into (ng, g)."""
    return x.reshape(x.shape[:axis] + (ng, x.shape[axis] // ng) + x.shape[axis + 1:])


def _round_up_to(s: jax.Array, dtype) -> jax.Array:
    """``s`` (positive float32) in ``dtype``, rounded up so that ``s / stored <= 1``."""
    low = s.astype(dtype)
    up = jnp.nextafter(low, jnp.asarray(jnp.inf, dtype))
    return jnp.where(low.astype(jnp.float32) < s, up, low)


def quantize_array(w: jax.Array, axis: int, group: int = GROUP_SIZE, scale_dtype=SCALE_DTYPE
                   ) -> tuple[jax.Array, jax.Array]:
    """Symmetric absmax int8 with one scale per output channel and group of input elements.

    Along input ``axis`` (length n), each run of g = `group_size` (n, group) elements of
    each output channel gets ``s = max|w| / 127``, rounded up to ``scale_dtype``;
    ``q = round(w / s)``. (llama.cpp's Q8_0 is this with g = 32 and float16 scales.)

    Args:
      w: float weight. axis: the input axis grouped (the matmul's innermost contracted axis).
    Returns:
      (q int8 of w's shape, scale ``scale_dtype`` of `scale_shape` (w.shape, axis, group)),
      with ``|w - q * s| <= s / 2`` elementwise (s the element's group scale).
    """
    axis %= w.ndim
    ng = w.shape[axis] // group_size(w.shape[axis], group)
    wg = _split(w.astype(jnp.float32), axis, ng)
    amax = jnp.max(jnp.abs(wg), axis=axis + 1, keepdims=True)
    s = _round_up_to(jnp.maximum(amax, 1e-30) / 127.0, scale_dtype)
    q = jnp.clip(jnp.round(wg / s.astype(jnp.float32)), -127, 127).astype(jnp.int8)
    return q.reshape(w.shape), jnp.squeeze(s, axis=axis + 1)


def dequantize(q: jax.Array, scale: jax.Array, axis: int, dtype=jnp.float32) -> jax.Array:
    """``q * s`` in ``dtype`` (the inverse of `quantize_array`; ``axis`` the grouped axis)."""
    axis %= q.ndim
    qg = _split(q, axis, scale.shape[axis]).astype(jnp.float32)
    return (qg * jnp.expand_dims(scale.astype(jnp.float32), axis + 1)).reshape(q.shape).astype(dtype)


def qdot(x: jax.Array, w: jax.Array, scale: jax.Array, w_contract: tuple[int, ...], dtype,
         w8a8_min_rows: int | None = None) -> jax.Array:
    """``x`` times an int8 weight with group scales (`quantize_array` along ``w_contract[-1]``).

    Args:
      x: [rows..., in...] float; its last ``len(w_contract)`` axes are contracted with
        ``w``'s ``w_contract`` axes (in order).
      w: int8 weight; scale: its scales (`scale_shape` (w.shape, w_contract[-1])).
      dtype: the model dtype the weight-only path dequantizes ``w`` to.
      w8a8_min_rows: rows from which the W8A8 path is taken (None: `W8A8_MIN_ROWS`).
    Returns:
      [rows..., out...] float32. The path (module docstring) is chosen from the static
      number of rows.
    """
    n = len(w_contract)
    lead = x.ndim - n
    x_axes = tuple(range(lead, x.ndim))
    rows = math.prod(x.shape[:lead])
    if rows < (W8A8_MIN_ROWS if w8a8_min_rows is None else w8a8_min_rows):
        dims = ((x_axes, tuple(w_contract)), ((), ()))
        return jax.lax.dot_general(x.astype(dtype), dequantize(w, scale, w_contract[-1], dtype), dims,
                                   preferred_element_type=jnp.float32)
    x32 = x.astype(jnp.float32)
    a = jnp.maximum(jnp.max(jnp.abs(x32), axis=x_axes, keepdims=True), 1e-30) / 127.0
    xq = jnp.clip(jnp.round(x32 / a), -127, 127).astype(jnp.int8)
    # one integer dot per scale: the groups and the outer input axes become batch axes
    ng, wa = scale.shape[w_contract[-1]], w_contract[-1]
    xq, wq = _split(xq, x.ndim - 1, ng), _split(w, wa, ng)
    wc = tuple(c + (c > wa) for c in w_contract)  # contract axes after the split
    x_batch, w_batch = tuple(range(lead, x.ndim)), wc[:-1] + (wa,)
    dims = (((x.ndim,), (wa + 1,)), (x_batch, w_batch))
    y = jax.lax.dot_general(xq, wq, dims, preferred_element_type=jnp.int32).astype(jnp.float32)
    # y: [in_outer..., ng, rows..., out...]; scale -> [in_outer..., ng, 1..., out...]
    s = jnp.moveaxis(scale.astype(jnp.float32), w_contract, tuple(range(n)))
    s = s.reshape(s.shape[:n] + (1,) * lead + s.shape[n:])
    y = jnp.sum(y * s, axis=tuple(range(n)))
    return y * a.reshape(a.shape[:lead] + (1,) * (y.ndim - lead))


class QDenseGeneral(nn.Module):
    """Bias-free ``nn.DenseGeneral`` with an int8 kernel and group scales.

    Params: ``kernel`` int8 [in..., features...] (logical ``names``), ``scale``
    `SCALE_DTYPE` of `scale_shape` (kernel shape, n_in - 1) with the same logical names, so
    a split input axis splits its groups with it. Contracts ``x``'s last ``n_in`` axes.
    """

    features: tuple[int, ...]
    n_in: int
    names: tuple[str, ...]
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        shape = tuple(x.shape[x.ndim - self.n_in:]) + tuple(self.features)
        kernel = self.param("kernel", nn.with_logical_partitioning(_int8_init, self.names), shape, jnp.int8)
        scale = self.param("scale", nn.with_logical_partitioning(_scale_init, self.names),
                           scale_shape(shape, self.n_in - 1), SCALE_DTYPE)
        return qdot(x, kernel, scale, tuple(range(self.n_in)), self.dtype)


class QEmbed(nn.Module):
    """Embedding table int8 ``embedding [V, D]`` with ``scale [V, D / g]`` (groups of each
    row: per-token scales of the lookup, and group scales of a tied LM head)."""

    num_embeddings: int
    features: int
    dtype: jnp.dtype = jnp.float32

    def setup(self):
        shape = (self.num_embeddings, self.features)
        self.embedding = self.param("embedding", nn.with_logical_partitioning(_int8_init, ("vocab", "embed")),
                                    shape, jnp.int8)
        self.scale = self.param("scale", nn.with_logical_partitioning(_scale_init, ("vocab", "embed")),
                                scale_shape(shape, 1), SCALE_DTYPE)

    def __call__(self, ids):
        """ids [T] int32 -> [T, D] float32."""
        return dequantize(self.embedding[ids], self.scale[ids], 1)

    def attend(self, x):
        """Tied LM head: x [R, D] -> logits [R, V] float32 (`tied_head_logits`)."""
        return tied_head_logits(x, self.embedding, self.scale, self.dtype)


def tied_head_logits(x: jax.Array, table: jax.Array, scale: jax.Array, dtype, chunk: int | None = None
                     ) -> jax.Array:
    """Logits of a tied LM head over an int8 table with row-group scales, a chunk of the
    vocabulary at a time.

    XLA:CPU does not fuse a weight's dequantization into its dot: over the whole table it
    writes a float copy of all [V, D] every step and reads it back. Here a loop
    (``lax.map``) dequantizes c = `group_size` (V, chunk) rows per iteration and multiplies
    them (`qdot`), so the float chunk stays in cache. The table is viewed as
    ``[b, V / c, c / b, D]`` with b = `HEAD_BLOCKS` (or c's largest divisor below it) and
    iteration j takes ``[:, j]``: b runs of c / b consecutive rows. The vocabulary's outer
    factor b is never looped over, so a vocabulary split over up to b devices (tensor
    parallelism) splits every iteration's rows instead of the loop. The arithmetic per
    logit is `qdot`'s.

    Args:
      x: [R, D] float. table: int8 [V, D]; scale: [V, D / g] (`quantize_array` along axis 1).
      dtype: the dtype ``table`` is dequantized to. chunk: rows per iteration (None:
        `HEAD_CHUNK`; 0 or >= V: the whole table in one `qdot`, as also when V has no
        divisor between chunk / 2 and chunk).
    Returns:
      [R, V] float32.
    """
    chunk = HEAD_CHUNK if chunk is None else chunk
    V, D = table.shape
    c = group_size(V, chunk) if chunk else V
    n = V // c
    if n == 1 or 2 * c < min(chunk, V):
        return qdot(x, table, scale, (1,), dtype)
    b = group_size(c, HEAD_BLOCKS)
    t, s = table.reshape(b, n, c // b, D), scale.reshape(b, n, c // b, scale.shape[1])

    def one(j):  # logits of rows i * V / b + j * c / b + k (i < b, k < c / b): [R, b, c / b]
        tj = jax.lax.dynamic_index_in_dim(t, j, 1, keepdims=False)
        sj = jax.lax.dynamic_index_in_dim(s, j, 1, keepdims=False)
        return qdot(x, tj, sj, (2,), dtype)

    y = jax.lax.map(one, jnp.arange(n))  # [n, R, b, c / b]
    return jnp.transpose(y, (1, 2, 0, 3)).reshape(x.shape[0], V)


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
      shardings: the quantized tree's shardings (`jaxinfer.distributed.sharding.param_shardings` of
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
                res[k], res["scale"] = quantize_array(v, contract[-1])
        return res

    out = {} if shardings is None else {"out_shardings": shardings}
    return jax.jit(convert, **out)(params)
