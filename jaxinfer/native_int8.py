"""Products against pre-packed int8 weights with group scales on CPUs with AVX-512 VNNI
(`jaxinfer/native/int8_gemm.cc`, ``--quantization int8``): the build, the FFI registration, the
one-time packing of an int8 model's weights and the jnp-side call.

XLA:CPU (jax 0.10.2) does not fuse the int8 -> float convert into its dot, so the int8 model
(`jaxinfer.models.quant.qdot`) dequantizes every weight inside the step: it read more bytes per
token than the bfloat16 model. The kernel reads the int8 weights once, in place by layer index,
and applies the group scales to its int32 sums (the kernel's header has the arithmetic).

A packed weight is a dict ``{"w": int8 [L, N/16, K/32, 16, 16, 2], "s": float32 [L, K/64, N]}``
(`pack`): `jaxinfer.native_amx`'s layout with int8 elements, and the scales as float32. It lives
in the same variable collection as the bfloat16 packed weights (`native_amx.COLLECTION`), under the
same names (`packed_variables`), and `native_amx.matmul` hands it here (`matmul`), so
`jaxinfer.models.llama` needs no second path. Used for an int8 model on one CPU device whose
CPU has AVX-512 VNNI and BW (Intel Ice Lake / Sapphire Rapids, AMD Zen 4 on), at any row count
and compute dtype.

Built on first use by `jaxinfer.native_build`; without AVX-512 VNNI, no compiler, or
``JAXINFER_NATIVE_INT8=0``, `available` says why and the int8 model runs `qdot` as before.
"""
from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer import native_build
from jaxinfer.cpu_features import host_cpu_flags

logger = logging.getLogger(__name__)

TARGET = "jaxinfer_int8_gemm"
SOURCE = native_build.NATIVE_DIR / "int8_gemm.cc"
ENV_SWITCH = "JAXINFER_NATIVE_INT8"  # "0" turns the kernel off (`quant.qdot` runs)
GROUP = 64  # inputs per scale: kGroup in int8_gemm.cc, and `jaxinfer.models.quant.GROUP_SIZE`


@functools.cache
def _load() -> str | None:
    """Check the CPU, build (once per machine), load, register and try one product; None, or why not."""
    if not {"avx512_vnni", "avx512bw"} <= host_cpu_flags():
        return "this CPU has no AVX-512 VNNI (avx512_vnni, avx512bw)"
    why = native_build.load_ffi(SOURCE, {TARGET: "JaxinferInt8Gemm"}, what="int8 product", env_switch=ENV_SWITCH,
                                 logger=logger, cpu_flags=host_cpu_flags())
    return why if why is not None else _smoke_test()


def _smoke_test() -> str | None:
    """One small product through the registered kernel (`native_build.first_call`)."""
    return native_build.first_call("int8 product", lambda: matmul(
        jnp.full((1, 64), 2.0, jnp.float32), pack(np.ones((1, 64, 32), np.int8), np.full((1, 1, 32), 0.5, np.float32)), 0),
        64.0)


def available() -> bool:
    """Whether the kernel can run here (checked, built and registered on first call)."""
    why = _load()
    if why is not None:
        logger.info("int8 products in C++ off (%s); XLA's dequantize-then-dot is used", why)
    return why is None


def packable(k: int, n: int, group: int) -> bool:
    """Whether an int8 ``[k, n]`` weight with scales every ``group`` inputs fits the kernel:
    ``group`` is `GROUP`, ``k`` a multiple of it and ``n`` of 32."""
    return group == GROUP and k % GROUP == 0 and n % 32 == 0


def pack(q, s) -> dict:
    """int8 weights ``q [L, K, N]`` and their group scales ``s [L, K/64, N]`` (any float dtype)
    -> ``{"w": int8 [L, N/16, K/32, 16, 16, 2], "s": float32 [L, K/64, N]}`` with
    ``w[l, j, b, p, c, e] = q[l, 32b + 2p + e, 16j + c]`` (`native_amx.pack`'s layout).

    Raises:
      ValueError: not 3-D, shapes that do not match, or K / N not multiples of 64 / 32.
    """
    q, s = np.asarray(q), np.asarray(s, np.float32)
    if q.ndim != 3 or q.dtype != np.int8 or s.shape != (q.shape[0], q.shape[1] // GROUP, q.shape[2]) \
            or not packable(q.shape[1], q.shape[2], GROUP):
        raise ValueError(f"int8 pack: expected int8 [L, K, N] (K a multiple of {GROUP}, N of 32) and scales "
                         f"[L, K/{GROUP}, N], got {q.dtype} {q.shape} and {s.shape}")
    L, K, N = q.shape
    blocks = q.reshape(L, K // 32, 16, 2, N // 16, 16).transpose(0, 4, 1, 2, 5, 3)
    return {"w": jnp.asarray(np.ascontiguousarray(blocks)), "s": jnp.asarray(s)}


def packed_shape_kn(packed: dict) -> tuple[int, int]:
    """``(K, N)`` of a packed weight."""
    return packed["w"].shape[2] * 32, packed["w"].shape[1] * 16


def matmul(x, packed: dict, layer, rows=None):
    """``x [M, K] @ (q s)[layer]`` -> float32 ``[M, N]`` for ``packed`` = `pack` (q, s); ``x``
    float32 or bfloat16 (other dtypes are cast to float32), ``layer`` an int32 scalar (traced or
    not). ``rows`` (int32 scalar, traced or not; None: M): only x's first ``rows`` rows are
    multiplied, the output's later rows are zeros (a step's padding tokens). Each row of ``x`` is rounded to int16 with its own absmax scale inside the kernel,
    except bfloat16 ``x`` of more than 4 real rows (``rows``) on a CPU with AVX-512 BF16, which is multiplied as
    given (the kernel's header); a row holding a NaN or an infinity comes out NaN. Call only
    where `available` is True."""
    k, n = packed_shape_kn(packed)
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"int8 matmul: x {x.shape} does not contract with a packed [{k}, {n}] weight")
    if x.dtype not in (jnp.float32, jnp.bfloat16):
        x = x.astype(jnp.float32)
    out = jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32)
    rows = x.shape[0] if rows is None else rows
    return jax.ffi.ffi_call(TARGET, out)(x, packed["w"], packed["s"], jnp.asarray(layer, jnp.int32),
                                         jnp.asarray(rows, jnp.int32))


def _as_kn(leaf: dict, n_in: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A stacked int8 projection ``{"kernel": [L, *in, *out], "scale": ...}`` as ``(q [L, K, N],
    s [L, K/64, N])``, or None when its groups are not `GROUP` inputs or the shape is not
    `packable`."""
    q, s = np.asarray(leaf["kernel"]), np.asarray(leaf["scale"], np.float32)
    if q.shape[n_in] // s.shape[n_in] != GROUP:
        return None
    L = q.shape[0]
    q, s = q.reshape(L, int(np.prod(q.shape[1:1 + n_in])), -1), s.reshape(L, int(np.prod(s.shape[1:1 + n_in])), -1)
    return (q, s) if packable(q.shape[1], q.shape[2], GROUP) else None


def packed_variables(params: dict, cfg) -> dict:
    """The `native_amx.COLLECTION` variables of a stacked int8 ``params`` tree
    (`jaxinfer.models.quant`'s layout): each layer projection as `pack` (q, s) under
    ``layers/{attn,mlp}/<name>_packed``, q, k and v side by side as one product
    (``layers/attn/qkv_packed``) where they share K, and the LM head (the tied int8 embedding
    transposed, or ``lm_head``) as ``lm_head_packed``; the names of `native_amx.packed_variables`,
    so `jaxinfer.models.llama` reads either. Gate and up stay two products (the gated epilogue is
    the bfloat16 kernel's). Projections that do not fit (`packable`) are left to `quant.qdot`.
    Packed on the host, once; `native_amx.without_packed` then drops the stacked int8 kernels and
    scales that have a packed copy."""
    from jaxinfer.models.llama import PACKED
    from jaxinfer.native_amx import FUSED, _PROJECTIONS

    layers = params["layers"]
    out: dict = {"layers": {}}
    qkv = [_as_kn(layers["attn"][name], 1) for name in FUSED["attn"]["qkv"]]
    if all(p is not None for p in qkv) and len({p[0].shape[1] for p in qkv}) == 1:
        out["layers"]["attn"] = {"qkv" + PACKED: pack(np.concatenate([p[0] for p in qkv], axis=2),
                                                      np.concatenate([p[1] for p in qkv], axis=2))}
    for module, name, n_in in _PROJECTIONS:
        if module == "attn" and name in FUSED["attn"]["qkv"] and "attn" in out["layers"]:
            continue
        kn = _as_kn(layers[module][name], n_in)
        if kn is not None:
            out["layers"].setdefault(module, {})[name + PACKED] = pack(*kn)
    if cfg.tie_word_embeddings:
        emb = params["embed"]
        head = {"kernel": np.asarray(emb["embedding"]).T[None], "scale": np.asarray(emb["scale"]).T[None]}
    else:
        head = {k: np.asarray(v)[None] for k, v in params["lm_head"].items()}
    kn = _as_kn(head, 1)
    if kn is not None:
        out["lm_head" + PACKED] = pack(*kn)
    return out
