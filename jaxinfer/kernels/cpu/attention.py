"""The CPU paged-attention kernel (`jaxinfer/kernels/cpu/csrc/paged_decode.cc`): its build, its
registration as an XLA FFI target, and the jnp-side call.

On one CPU device the XLA attention path hands every token to it
(`jaxinfer.layers.attention.xla._native_paged_attention`): each query reads its row's pages up
to its own position with an online softmax; a prompt chunk's consecutive queries share each
page read. It was written for decode rows, whose context XLA:CPU read in several passes (a
gather, a transpose, tiny batched dots;
at 32 rows and a context of ~640 that was ~270 ms of a ~350 ms decode step,
`benchmarks/results/2026-12-01-cpu2-s3/`). Prefill tokens then still went through the jnp
path's dense [T, T] scores, which grow with the square of the step's tokens: a 512-token
prefill step ran at ~800-940 prompt tokens/s, and ~2,200 with every token in the kernel
(`benchmarks/results/2026-12-02-cpu2-prefill/`). On a CPU with AMX and a bfloat16 cache, a
prompt chunk's queries multiply Q K^T and P V on the AMX tiles (bfloat16 operands, float32
sums; `JAXINFER_NATIVE_AMX=0` keeps the AVX-512 loop): the kernel alone on a 512-token chunk,
79 against 200 ms for SmolLM2's 30 layers (`benchmarks/results/2026-12-03-cpu2-amx-attention/`).

The source is compiled on first use by `jaxinfer.kernels.cpu.build` (the machine's C++ compiler,
cached in ``~/.cache/jaxinfer/native/paged_decode-<hash>.so``).
The executable keeps only the target's name, so JAX's persistent compilation cache still
works. With no compiler, or ``JAXINFER_NATIVE_DECODE=0``, `available` says why and the
XLA path runs as before.
"""
from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

from jaxinfer.kernels.cpu import build as native_build

logger = logging.getLogger(__name__)

TARGET = "jaxinfer_paged_decode"  # float32 / bfloat16-bit caches
TARGET_8BIT = "jaxinfer_paged_decode_8bit"  # int8 / fp8 caches with per-token scales (`jaxinfer.layers.attention.kv_quant`)
SOURCE = native_build.NATIVE_DIR / "paged_decode.cc"
ENV_SWITCH = "JAXINFER_NATIVE_DECODE"  # "0" turns the kernel off (the XLA path's jnp parts run)
# The kernel's per-thread buffers (kMaxHeads, kMaxHeadDim, kMaxBlockSize in paged_decode.cc).
MAX_QUERY_HEADS, MAX_HEAD_DIM, MAX_BLOCK_SIZE = 64, 256, 256


def supports(num_query_heads: int, head_dim: int, block_size: int) -> bool:
    """Whether a model's shapes fit the kernel's buffers (else the jnp loop runs)."""
    return num_query_heads <= MAX_QUERY_HEADS and head_dim <= MAX_HEAD_DIM and block_size <= MAX_BLOCK_SIZE


@functools.cache
def _load() -> str | None:
    """Build (once per machine), load and register the kernel; returns None, or why not."""
    return native_build.load_ffi(SOURCE, {TARGET: "JaxinferPagedDecode", TARGET_8BIT: "JaxinferPagedDecode8bit"},
                                 what="CPU paged-attention kernel", env_switch=ENV_SWITCH, logger=logger)


def unavailable_reason() -> str | None:
    """None when the kernel is built and registered (building it on first call), else why not."""
    why = _load()
    if why is not None:
        logger.warning("CPU paged-attention kernel off (%s); the XLA path's jnp parts are used", why)
    return why


def available() -> bool:
    """Whether the kernel can run here (`unavailable_reason` is None)."""
    return unavailable_reason() is None


def paged_context(q, k_cache, v_cache, layer, tables, ctx_len, q_pos, window, k_scales=None, v_scales=None):
    """Partial softmax of each query over the first ``ctx_len`` positions of its pages, by the
    C++ kernel (a "row" here is one query: a decode row, or one token of a prefill chunk).

    Args:
      q: [R, K, G, H] float32 queries (already scaled), one per row.
      k_cache, v_cache: [L, NB, bs, K, H] float32, or uint16 bfloat16 bits, or 8-bit values
        (int8 / float8_e4m3fn) of an 8-bit cache.
      layer: [] int32. tables: [R, W] int32 block tables.
      ctx_len: [R] int32 cached context to read per row (0: none).
      q_pos: [R] int32 query positions. window: [] int32 sliding window, or None (full).
      k_scales, v_scales: with 8-bit pages, their scales [L, NB, bs, K] uint16 (bfloat16 bits,
        one per token and KV head, applied to the scores and the probabilities); else None.

    Returns:
      (max [R, K, G], sum [R, K, G], acc [R, K, G, H]) float32, the same pieces as
      `jaxinfer.layers.attention.softmax.partial_softmax` (a row with no key gives (-inf, 0, 0)).

    Raises:
      RuntimeError: the kernel is not available (check `available` first).
    """
    why = _load()
    if why is not None:
        raise RuntimeError(why)
    R, K, G, H = q.shape
    out = (jax.ShapeDtypeStruct((R, K, G), jnp.float32),) * 2 + (jax.ShapeDtypeStruct((R, K, G, H), jnp.float32),)
    window = jnp.int32(0) if window is None else jnp.asarray(window, jnp.int32)
    rest = (jnp.asarray(layer, jnp.int32), tables.astype(jnp.int32), ctx_len.astype(jnp.int32),
            q_pos.astype(jnp.int32), window)
    if k_scales is not None:
        return jax.ffi.ffi_call(TARGET_8BIT, out)(q.astype(jnp.float32), k_cache, v_cache, k_scales, v_scales, *rest)
    return jax.ffi.ffi_call(TARGET, out)(q.astype(jnp.float32), k_cache, v_cache, *rest)
