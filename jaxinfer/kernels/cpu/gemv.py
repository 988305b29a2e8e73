"""One- and two-row products against bfloat16 weights on CPU (`jaxinfer/kernels/cpu/csrc/bf16_gemv.cc`):
the build, the XLA FFI registration and the jnp-side calls.

A lone decoding stream multiplies one row by every weight matrix, and XLA:CPU (jax 0.10.2)
runs that on a slow path; its two-row form reads bfloat16 weights at ~7 GB/s
(`benchmarks/results/2026-12-02-cpu2-bf16/`). The C++ loops read each weight once, in float32
registers, over XLA's intra-op threads: bfloat16 operands and float32 sums, as
``lax.dot_general(..., preferred_element_type=float32)``. `jaxinfer.layers.cpu_bf16` calls
them for one- and two-row products when the model was built for one CPU device (a custom call has no
sharding rule) and no packed weights were passed: a CPU with neither AMX nor AVX-512 BF16 (with
them, `jaxinfer.kernels.cpu.amx` takes every row count).

Built on first use by `jaxinfer.kernels.cpu.build` (``~/.cache/jaxinfer/native/bf16_gemv-<hash>.so``).
With no compiler, or ``JAXINFER_NATIVE_GEMV=0``, `available` says why and XLA's dot runs.
"""
from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

from jaxinfer.kernels.cpu import build as native_build

logger = logging.getLogger(__name__)

TARGET_KN = "jaxinfer_bf16_gemv_kn"  # x [M, K] @ w [K, N]
TARGET_NK = "jaxinfer_bf16_gemv_nk"  # x [M, K] @ w [N, K]^T
SOURCE = native_build.NATIVE_DIR / "bf16_gemv.cc"
ENV_SWITCH = "JAXINFER_NATIVE_GEMV"  # "0" turns the loops off (XLA's dot runs)
MAX_ROWS = 2  # kMaxRows in bf16_gemv.cc


@functools.cache
def _load() -> str | None:
    """Build (once per machine), load and register both targets; returns None, or why not."""
    return native_build.load_ffi(SOURCE, {TARGET_KN: "JaxinferBf16GemvKn", TARGET_NK: "JaxinferBf16GemvNk"},
                                 what="CPU bfloat16 one-row product", env_switch=ENV_SWITCH, logger=logger)


def available() -> bool:
    """Whether the loops can run here (built and registered on first call; if not, logged why)."""
    why = _load()
    if why is not None:
        logger.warning("CPU bfloat16 one-row product off (%s); XLA's dot is used", why)
    return why is None


def _call(target: str, x, w, n: int):
    out = jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32)
    return jax.ffi.ffi_call(target, out)(x.astype(jnp.bfloat16), w)


def matmul_kn(x, w):
    """``x [M, K] @ w [K, N]`` -> float32 ``[M, N]``; ``x`` is cast to bfloat16, ``w`` is
    bfloat16 or its uint16 bits; ``M`` <= `MAX_ROWS`. Call only where `available` is True."""
    return _call(TARGET_KN, x, w, w.shape[1])


def matmul_nk(x, w):
    """``x [M, K] @ w [N, K]^T`` -> float32 ``[M, N]`` (a tied embedding as the LM head);
    otherwise as `matmul_kn`."""
    return _call(TARGET_NK, x, w, w.shape[0])
