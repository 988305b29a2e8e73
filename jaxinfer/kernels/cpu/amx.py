"""Products against pre-packed bfloat16 weights on CPUs with Intel AMX or AVX-512 BF16
(`jaxinfer/kernels/cpu/csrc/amx_gemm.cc`): the build, the FFI registration, the packed layout (`pack`) and the jnp-side calls. The packed layout is AMX's pair-interleaved B operand,
which is also what VDPBF16PS multiplies, so one packing serves both: AMX CPUs (Sapphire Rapids
on) run the tiles, CPUs with AVX-512 BF16 and no AMX (AMD Zen 4 on) the VDPBF16PS loops. Every
row count goes through the kernel, one row (a lone decoding stream) too: those products
are bound by reading the weights, and the kernel reads them as fast as or faster than the
row-major loops of `native_gemv` (the kernel's header has the probes).

XLA:CPU (jax 0.10.2) re-packs a bfloat16 weight for AMX on every call and, under the layer
scan, copies each layer's slice out of the stacked weights first; the kernel reads weights
packed once, at load, in place through the layer index (the kernel's header says more).
The ``amx_packed`` linear method (`jaxinfer.layers.linear_methods.amx_packed`, which packs a
model's weights at load) calls it for products of every row count where the execution plan
chose it: a bfloat16 unquantized model on one CPU device whose CPU has AMX (``amx_bf16``) or
AVX-512 BF16 (``avx512_bf16``). The gated MLP's
gate and up products run as one call that writes act(gate) * up in bfloat16 (`gated_matmul`).

Built on first use by `jaxinfer.kernels.cpu.build`; with neither AMX nor AVX-512 BF16 in the flags
it is given, or no compiler, `available` says why and XLA's dot runs (the execution plan reads
``JAXINFER_NATIVE_AMX=0`` and then does not ask). The same switch keeps the
attention kernel's prefill runs off AMX (`jaxinfer.kernels.cpu.attention`, which reads it per call
and asks Linux for the tile state itself).
"""
from __future__ import annotations

import ctypes
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.kernels.cpu import build as native_build

logger = logging.getLogger(__name__)

TARGET = "jaxinfer_amx_gemm"
GATED_TARGET = "jaxinfer_amx_gated"  # act(x wg) * (x wu) in one call (`gated_matmul`)
GATED_ACTS = {"silu": 0, "gelu_pytorch_tanh": 1}  # hidden_act -> the kernel's ``act`` attribute
SOURCE = native_build.NATIVE_DIR / "amx_gemm.cc"
ENV_SWITCH = "JAXINFER_NATIVE_AMX"  # "0" turns the kernel off (XLA's dot runs)
MAX_K = 16384  # kMaxK in amx_gemm.cc
AMX_FLAGS = frozenset({"amx_tile", "amx_bf16"})  # /proc/cpuinfo flags of the AMX path
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL = 0x1023, 18, 158


def _request_tiles() -> str | None:
    """Ask Linux for this process's AMX tile state (``arch_prctl(ARCH_REQ_XCOMP_PERM)``,
    Linux >= 5.16); None, or why not."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0:
            return f"the kernel refused AMX tile state (errno {ctypes.get_errno()})"
    except (OSError, AttributeError) as err:
        return f"could not ask for AMX tile state: {err}"
    return None


@functools.cache
def _load(flags: frozenset[str]) -> str | None:
    """Check the CPU's ``flags``, ask for tile state, build (once per machine), load and register;
    None, or why not."""
    if AMX_FLAGS <= flags:
        why = _request_tiles()
        if why is not None:
            return why
    elif "avx512_bf16" not in flags:
        return "this CPU has neither AMX (amx_tile, amx_bf16) nor AVX-512 BF16 (avx512_bf16)"
    why = native_build.load_ffi(SOURCE, {TARGET: "JaxinferAmxGemm", GATED_TARGET: "JaxinferAmxGated"},
                                what="packed bfloat16 product", env_switch=ENV_SWITCH, logger=logger, cpu_flags=flags)
    return why if why is not None else _smoke_test()


def _smoke_test() -> str | None:
    """One small product through the registered kernel (`native_build.first_call`)."""
    packed = pack(np.ones((1, 32, 32), np.float32).astype(jnp.bfloat16))
    return native_build.first_call("packed bfloat16 product", lambda: jax.ffi.ffi_call(
        TARGET, jax.ShapeDtypeStruct((1, 32), jnp.float32))(jnp.full((1, 32), 0.5, jnp.bfloat16), jnp.asarray(packed),
                                                             jnp.int32(0), jnp.int32(1)), 16.0)


def instruction_set(flags: frozenset[str]) -> str:
    """The products' instructions on a CPU with ``flags`` (/proc/cpuinfo's): AMX tiles where it
    has them, else AVX-512 BF16's VDPBF16PS (the kernel is built with ``-march=native``, which
    picks the path)."""
    return "AMX tiles" if AMX_FLAGS <= flags else "AVX-512 BF16, VDPBF16PS"


def available(flags: frozenset[str]) -> bool:
    """Whether the kernel can run on a CPU with ``flags`` (`jaxinfer.platform.cpu_features.host_cpu_flags`,
    which the execution plan reads): checked, built and registered on first call."""
    why = _load(frozenset(flags))
    if why is not None:
        logger.info("AMX bfloat16 products off (%s); XLA's dot is used", why)
    return why is None


def packable(k: int, n: int) -> bool:
    """Whether a ``[k, n]`` weight fits the kernel: both multiples of 32, ``k <= MAX_K``."""
    return k % 32 == 0 and n % 32 == 0 and k <= MAX_K


def _blocks(bits: np.ndarray) -> np.ndarray:
    """uint16 ``[L, K, N]`` (K a multiple of 32, N of 16) -> its 16 x 32 blocks, `pack`'s layout."""
    L, K, N = bits.shape
    blocks = bits.reshape(L, K // 32, 16, 2, N // 16, 16)  # [l, b, p, e, j, c]
    return np.ascontiguousarray(blocks.transpose(0, 4, 1, 2, 5, 3))


def pack(w) -> np.ndarray:
    """Weights ``[L, K, N]`` (bfloat16, or its uint16 bits) -> uint16 ``[L, N/16, K/32, 16, 16, 2]``:
    element ``[l, j, b, p, c, e] = w[l, 32b + 2p + e, 16j + c]`` (the kernel's header: AMX's
    pair-interleaved B operand, one 16 x 32 block after another).

    Raises:
      ValueError: not 3-D, or K / N not multiples of 32 (`packable`).
    """
    bits = np.asarray(w).view(np.uint16)  # bfloat16 or its bits: the same 16-bit patterns
    if bits.ndim != 3 or not packable(bits.shape[1], bits.shape[2]):
        raise ValueError(f"amx pack: expected [L, K, N] with K, N multiples of 32 (K <= {MAX_K}), got {bits.shape}")
    return _blocks(bits)


def gated_packable(k: int, f: int) -> bool:
    """Whether gate and up weights ``[k, f]`` fit `pack_gated`: the interleaved ``[k, 2f]`` is
    `packable` (``k`` a multiple of 32, ``f`` of 16)."""
    return packable(k, 2 * f)


def pack_gated(w_gate, w_up) -> np.ndarray:
    """Gate and up weights ``[L, K, F]`` (bfloat16, or their uint16 bits) -> `pack` of the
    ``[L, K, 2F]`` matrix whose 16-column blocks alternate gate block q, up block q: uint16
    ``[L, 2F/16, K/32, 16, 16, 2]`` with ``[:, 2q] = pack(w_gate)[:, q]`` and ``[:, 2q + 1] =
    pack(w_up)[:, q]``, so that the kernel's column-block pair q holds the gate and up
    columns 16q .. 16q + 15 (`gated_matmul`).

    Raises:
      ValueError: shapes differ, not 3-D, or K / F not multiples of 32 / 16 (`gated_packable`).
    """
    gate, up = np.asarray(w_gate).view(np.uint16), np.asarray(w_up).view(np.uint16)
    if gate.shape != up.shape or gate.ndim != 3 or not gated_packable(*gate.shape[1:]):
        raise ValueError(f"amx pack_gated: expected two [L, K, F] with K a multiple of 32 (<= {MAX_K}) and F of 16, "
                         f"got {gate.shape} and {up.shape}")
    pair = np.stack([_blocks(gate), _blocks(up)], axis=2)  # [L, F/16, 2, K/32, 16, 16, 2]
    return pair.reshape(gate.shape[0], -1, *pair.shape[3:])


def packed_shape_kn(packed) -> tuple[int, int]:
    """``(K, N)`` of a packed array."""
    return packed.shape[2] * 32, packed.shape[1] * 16


def matmul(x, packed, layer, rows=None):
    """``x [M, K] @ w[layer]`` -> float32 ``[M, N]`` for ``packed`` = `pack` (w) of ``w [L, K, N]``;
    ``x`` is cast to bfloat16, ``layer`` is an int32 scalar (traced or not). ``rows`` (int32
    scalar, traced or not; None: M): only x's first ``rows`` rows (clamped to [0, M]) are
    multiplied and the output's later rows are zeros, so that a step's padding tokens cost
    nothing. Call only where `available` is True."""
    k, n = packed_shape_kn(packed)
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"amx matmul: x {x.shape} does not contract with a packed [{k}, {n}] weight")
    out = jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32)
    return jax.ffi.ffi_call(TARGET, out)(x.astype(jnp.bfloat16), packed, jnp.asarray(layer, jnp.int32),
                                         _rows(x, rows))


def _rows(x, rows) -> jax.Array:
    """The kernels' ``rows`` operand: ``rows``, or all of x's rows."""
    return jnp.asarray(x.shape[0] if rows is None else rows, jnp.int32)


def gated_matmul(x, packed, layer, act: str, rows=None):
    """The gated MLP's first half in one kernel call: ``x [M, K]`` -> bfloat16 ``[M, F]``,
    ``act(x @ wg[layer]) * (x @ wu[layer])`` for ``packed`` = `pack_gated` (wg, wu) of
    ``wg, wu [L, K, F]``: bfloat16 operands, float32 sums (as `matmul`), act and product in
    float32, rounded to bfloat16 (nearest even). ``act``: "silu" (SwiGLU, Shazeer 2020, "GLU
    variants improve transformer") or "gelu_pytorch_tanh" (GeGLU, the tanh-approximated GELU),
    the keys of `GATED_ACTS`. ``x`` is cast to bfloat16, ``layer`` is an int32 scalar (traced
    or not); ``rows`` as `matmul`'s. Call only where `available` is True."""
    k, n = packed_shape_kn(packed)
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"amx gated_matmul: x {x.shape} does not contract with a packed [{k}, {n}] weight")
    if act not in GATED_ACTS:
        raise ValueError(f"amx gated_matmul: act {act!r} is not one of {', '.join(GATED_ACTS)}")
    out = jax.ShapeDtypeStruct((x.shape[0], n // 2), jnp.bfloat16)
    return jax.ffi.ffi_call(GATED_TARGET, out)(x.astype(jnp.bfloat16), packed, jnp.asarray(layer, jnp.int32),
                                               _rows(x, rows), act=np.int32(GATED_ACTS[act]))
