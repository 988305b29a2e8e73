"""Products against pre-packed int8 weights with group scales on CPUs with AVX-512 VNNI
(`jaxinfer/kernels/cpu/csrc/int8_gemm.cc`, ``--quantization int8``): the build, the FFI registration, the
packed layout (`pack`) and the jnp-side call.

XLA:CPU (jax 0.10.2) does not fuse the int8 -> float convert into its dot, so the int8 model
(`jaxinfer.layers.quantization.int8.qdot`) dequantizes every weight inside the step: it read more bytes per
token than the bfloat16 model. The kernel reads the int8 weights once, in place by layer index,
and applies the group scales to its int32 sums (the kernel's header has the arithmetic).

A packed weight is a dict ``{"w": int8 [L, N/16, K/32, 16, 16, 2], "s": float32 [L, K/64, N]}``
(`pack`): `jaxinfer.kernels.cpu.amx`'s layout with int8 elements, and the scales as float32. The
``int8_packed`` linear method (`jaxinfer.layers.linear_methods.int8_packed`) packs a model's
weights at load and calls `matmul`. Used for an int8 model on one CPU device whose
CPU has AVX-512 VNNI and BW (Intel Ice Lake / Sapphire Rapids, AMD Zen 4 on), at any row count
and compute dtype.

Built on first use by `jaxinfer.kernels.cpu.build`; without AVX-512 VNNI in the flags it is given, or
no compiler, `available` says why and the int8 model runs `qdot` (the execution plan reads
``JAXINFER_NATIVE_INT8=0`` and then does not ask).
"""
from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.kernels.cpu import build as native_build

logger = logging.getLogger(__name__)

TARGET = "jaxinfer_int8_gemm"
SOURCE = native_build.NATIVE_DIR / "int8_gemm.cc"
ENV_SWITCH = "JAXINFER_NATIVE_INT8"  # "0" turns the kernel off (`quant.qdot` runs)
GROUP = 64  # inputs per scale: kGroup in int8_gemm.cc, and `jaxinfer.layers.quantization.int8.GROUP_SIZE`


@functools.cache
def _load(flags: frozenset[str]) -> str | None:
    """Check the CPU's ``flags``, build (once per machine), load, register and try one product;
    None, or why not."""
    if not {"avx512_vnni", "avx512bw"} <= flags:
        return "this CPU has no AVX-512 VNNI (avx512_vnni, avx512bw)"
    why = native_build.load_ffi(SOURCE, {TARGET: "JaxinferInt8Gemm"}, what="int8 product", env_switch=ENV_SWITCH,
                                 logger=logger, cpu_flags=flags)
    return why if why is not None else _smoke_test()


def _smoke_test() -> str | None:
    """One small product through the registered kernel (`native_build.first_call`)."""
    return native_build.first_call("int8 product", lambda: matmul(
        jnp.full((1, 64), 2.0, jnp.float32), pack(np.ones((1, 64, 32), np.int8), np.full((1, 1, 32), 0.5, np.float32)), 0),
        64.0)


def available(flags: frozenset[str]) -> bool:
    """Whether the kernel can run on a CPU with ``flags`` (`jaxinfer.platform.cpu_features.host_cpu_flags`,
    which the execution plan reads): checked, built and registered on first call."""
    why = _load(frozenset(flags))
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
