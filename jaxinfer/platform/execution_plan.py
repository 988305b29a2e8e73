"""The execution plan: which implementation runs each part of a model step, chosen once.

Owns the hardware choice of the model/runner path. `resolve_plan` reads everything that
choice depends on, once per engine: the JAX platform (``jax.default_backend()``), the CPU's
flags (`jaxinfer.platform.cpu_features.host_cpu_flags`), the environment switches (every
``JAXINFER_NATIVE_*`` kernel switch and ``JAXINFER_UNROLL_MAX_TOKENS``), the compute dtype,
the quantization, whether the step runs on a mesh, and the model's shapes; it asks each C++
kernel module only whether its library builds here (``available``). The result is a frozen
`ExecutionPlan` whose fields are all `jaxinfer.runner.model_runner.ModelRunner` reads: nothing on
that path calls ``jax.default_backend()``, reads ``/proc/cpuinfo`` or a ``JAXINFER_NATIVE_*``
variable again. Tests pick a path with ``dataclasses.replace(plan, linear=...)``.

Linear methods are named here and built by `jaxinfer.layers.linear.get_linear_method`:
  ``dense``: XLA's dot (float32 accumulation), as given;
  ``dense_cpu``: the same on XLA:CPU, a one-row bfloat16 product as two rows (`cpu_bf16`);
  ``bf16_gemv``: ``dense_cpu`` with products of one or two rows in `jaxinfer.kernels.cpu.gemv`;
  ``amx_packed``: bfloat16 weights packed once, every row count in `jaxinfer.kernels.cpu.amx`;
  ``int8``: int8 weights with group scales, XLA's dequantize-then-dot (`models.quant.qdot`);
  ``int8_packed``: int8 weights packed once, every row count in `jaxinfer.kernels.cpu.int8`.
A packed method falls back to ``linear_fallback`` for the projections it could not pack and
for the unrolled layers (which get no packed weights).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Mapping

import jax.numpy as jnp

from jaxinfer.layers.attention.registry import ATTENTION_BACKENDS
from jaxinfer.platform.cpu_features import host_cpu_flags

# The environment switches of the C++ kernels: "0" turns one off (XLA's own ops run).
NATIVE_SWITCHES = {"attention": "JAXINFER_NATIVE_DECODE", "gemv": "JAXINFER_NATIVE_GEMV",
                   "amx": "JAXINFER_NATIVE_AMX", "int8": "JAXINFER_NATIVE_INT8", "argmax": "JAXINFER_NATIVE_ARGMAX"}
UNROLL_ENV_VAR = "JAXINFER_UNROLL_MAX_TOKENS"
# Buckets of up to this many tokens run unrolled layers on a CPU without packed weights
# (`jaxinfer.runner.model_runner`'s module docstring has the measurements).
UNROLL_MAX_TOKENS = 1
PACKED_METHODS = ("amx_packed", "int8_packed")


@dataclasses.dataclass(frozen=True)
class ExecutionPlan:
    """Which implementation each part of a model step runs (all static, hashable).

    Attributes:
      platform: JAX's default backend ("cpu", "gpu", "tpu").
      attention: the paged-attention backend (a key of `ATTENTION_BACKENDS`: "xla", "pallas", "mosaic").
      native_attention: on the XLA path, attention by the C++ kernel (`jaxinfer.kernels.cpu.attention`).
      pallas_interpret: run the Pallas kernels in interpret mode (Pallas or Mosaic GPU on CPU).
      linear: the layers' and the LM head's linear method (module docstring's names).
      linear_fallback: with a packed ``linear``, the method of what it left unpacked and of
        the unrolled layers; None otherwise.
      prompt_head: the linear method of the prompt-logprobs LM head (`jaxinfer.models.llama.LMHead`).
      native_argmax: each step's greedy ids by the C++ loop (`jaxinfer.kernels.cpu.argmax`).
      native_gemv: products of one or two bfloat16 rows in `jaxinfer.kernels.cpu.gemv`.
      unroll_max_tokens: buckets of at most this many tokens run unrolled layers (0: none).
      bf16_bits: bfloat16 layer stacks, embedding gathers and KV cache stored as uint16 bits.
      instruction_set: the packed products' instructions ("AMX tiles", "AVX-512 BF16,
        VDPBF16PS", "AVX-512 VNNI"), None where no packed method runs.
    """

    platform: str = "cpu"
    attention: str = "xla"
    native_attention: bool = False
    pallas_interpret: bool = False
    linear: str = "dense_cpu"
    linear_fallback: str | None = None
    prompt_head: str = "dense_cpu"
    native_argmax: bool = False
    native_gemv: bool = False
    unroll_max_tokens: int = 0
    bf16_bits: bool = False
    instruction_set: str | None = None

    @property
    def packed(self) -> bool:
        """Whether the layers' products read weights packed once at load (`PACKED_METHODS`)."""
        return self.linear in PACKED_METHODS

    def describe(self) -> str:
        """One short line for the server's settings line, e.g. ``platform=cpu attention=xla+native
        linear=amx_packed(bf16_gemv) argmax=native unroll=0``."""
        att = self.attention + ("+native" if self.native_attention else "") + (
            "+interpret" if self.pallas_interpret else "")
        linear = self.linear + (f"({self.linear_fallback})" if self.linear_fallback else "")
        isa = f" isa={self.instruction_set.replace(' ', '').replace(',', '/')}" if self.instruction_set else ""
        return (f"platform={self.platform} attention={att} linear={linear} head={self.prompt_head} "
                f"argmax={'native' if self.native_argmax else 'xla'} unroll={self.unroll_max_tokens}"
                f"{' bf16_bits' if self.bf16_bits else ''}{isa}")


MOSAIC_MIN_CAPABILITY = (9, 0)  # Hopper: TMA and WGMMA, which the Mosaic GPU kernel is built of


def gpu_compute_capability() -> tuple[int, int] | None:
    """The first device's CUDA compute capability as (major, minor), None off CUDA (or where
    the device does not say: ROCm)."""
    import jax

    cc = getattr(jax.devices()[0], "compute_capability", None)
    if not cc:
        return None
    major, _, minor = str(cc).partition(".")
    return int(major), int(minor or 0)


def default_attention_backend(platform: str, compute_capability: tuple[int, int] | None = None,
                              mosaic_unsupported: str | None = None) -> str:
    """The attention backend when none is asked for: on GPU the Mosaic GPU kernel from compute
    capability 9.0 (Hopper) on where it serves the model (``mosaic_unsupported`` None), else the
    Triton one ("pallas", sm80-sm89, deprecated upstream); XLA elsewhere."""
    if platform != "gpu":
        return "xla"
    hopper = compute_capability is not None and tuple(compute_capability) >= MOSAIC_MIN_CAPABILITY
    return "mosaic" if hopper and mosaic_unsupported is None else "pallas"


def unroll_from_env(environ: Mapping[str, str], platform: str, packed: bool) -> int:
    """``unroll_max_tokens`` when the caller gives none: `UNROLL_ENV_VAR` if set, else 0 with
    packed weights, `UNROLL_MAX_TOKENS` on other CPUs and 0 on other platforms.

    Raises:
      ValueError: the variable is not a non-negative integer.
    """
    env = environ.get(UNROLL_ENV_VAR)
    if env is None:
        return UNROLL_MAX_TOKENS if platform == "cpu" and not packed else 0
    if not env.strip().isdigit():
        raise ValueError(f"{UNROLL_ENV_VAR}={env!r}: expected a non-negative integer")
    return int(env)


def _switched_on(environ: Mapping[str, str], kernel: str) -> bool:
    return environ.get(NATIVE_SWITCHES[kernel], "1") != "0"


def _attention_fields(attention: str, platform: str, one_cpu: bool, cfg, block_size: int,
                      environ: Mapping[str, str]) -> dict:
    """``attention``, ``native_attention`` and ``pallas_interpret``: the C++ kernel on the XLA
    path on one CPU device (the custom call cannot be split by the SPMD partitioner), shapes
    within its limits, switched on and built; any cache dtype."""
    from jaxinfer.kernels.cpu import attention as native_attention

    native = (attention == "xla" and one_cpu and _switched_on(environ, "attention")
              and native_attention.supports(cfg.num_attention_heads, cfg.head_dim, block_size)
              and native_attention.available())
    return dict(attention=attention, native_attention=native,
                pallas_interpret=attention in ("pallas", "mosaic") and platform == "cpu")


def _mosaic_unsupported(cfg, dtype, block_size: int, kv_cache_dtype: str) -> str | None:
    """Why the Mosaic GPU kernel cannot serve this model and cache, or None
    (`jaxinfer.layers.attention.mosaic.supports`)."""
    from jaxinfer.layers.attention.mosaic import supports

    return supports(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, block_size, dtype, kv_cache_dtype)


def _packed_method(one_cpu: bool, bf16: bool, int8: bool, flags: frozenset[str],
                   environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The packed linear method and its instructions, or (None, None): bfloat16 unquantized
    weights on one CPU device with AMX or AVX-512 BF16 (`jaxinfer.kernels.cpu.amx`), or int8 weights
    on one CPU device with AVX-512 VNNI (`jaxinfer.kernels.cpu.int8`); switched on and built."""
    from jaxinfer.kernels.cpu import amx as native_amx
    from jaxinfer.kernels.cpu import int8 as native_int8

    if one_cpu and bf16 and _switched_on(environ, "amx") and native_amx.available(flags):
        return "amx_packed", native_amx.instruction_set(flags)
    if one_cpu and int8 and _switched_on(environ, "int8") and native_int8.available(flags):
        return "int8_packed", "AVX-512 VNNI"
    return None, None


def resolve_plan(cfg, dtype, attention: str | None = None, *, block_size: int = 16, sharded: bool = False,
                 unroll_max_tokens: int | None = None, platform: str | None = None,
                 cpu_flags: frozenset[str] | None = None, environ: Mapping[str, str] | None = None,
                 kv_cache_dtype: str = "auto", compute_capability: tuple[int, int] | None = None) -> ExecutionPlan:
    """The `ExecutionPlan` of one engine (the rules of the module docstring).

    Args:
      cfg: the `jaxinfer.config.ModelConfig` (``quantization`` and the attention shapes).
      dtype: the compute dtype (name or dtype). attention: a registered backend ("xla", "pallas",
        "mosaic") or None (`default_attention_backend`).
      block_size: the KV pool's block size (the attention kernel's limits).
      sharded: the step runs on a mesh (no C++ custom call: they have no sharding rule).
      unroll_max_tokens: as `jaxinfer.runner.model_runner.ModelRunner`'s; None: `unroll_from_env`.
      platform, cpu_flags, environ: the inputs read here when None (``jax.default_backend()``,
        `host_cpu_flags`, ``os.environ``); tests may give them.
      kv_cache_dtype: ``--kv-cache-dtype`` ("auto", "int8", "fp8"): the Mosaic GPU kernel reads
        16-bit float pages only.
      compute_capability: the GPU's (major, minor); None: `gpu_compute_capability` on GPU.
    Raises:
      ValueError: ``JAXINFER_UNROLL_MAX_TOKENS`` is not a non-negative integer, an unknown
        attention backend, or "mosaic" asked for a model or cache it does not serve.
    """
    if platform is None:
        import jax

        platform = jax.default_backend()
    environ = os.environ if environ is None else environ
    flags = host_cpu_flags() if cpu_flags is None and platform == "cpu" else (cpu_flags or frozenset())
    if attention is not None and attention not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {attention!r} (expected one of {', '.join(ATTENTION_BACKENDS)})")
    asks_mosaic = attention == "mosaic" or (attention is None and platform == "gpu")
    mosaic_unsupported = _mosaic_unsupported(cfg, dtype, block_size, kv_cache_dtype) if asks_mosaic else None
    if attention is None:
        if platform == "gpu" and compute_capability is None:
            compute_capability = gpu_compute_capability()
        attention = default_attention_backend(platform, compute_capability, mosaic_unsupported)
    elif attention == "mosaic" and mosaic_unsupported is not None:
        raise ValueError(f"--attention-backend mosaic: {mosaic_unsupported}")
    cpu = platform == "cpu"
    one_cpu = cpu and not sharded
    int8 = cfg.quantization == "int8"
    bf16 = jnp.dtype(dtype) == jnp.bfloat16 and cfg.quantization is None
    fields = _attention_fields(attention, platform, one_cpu, cfg, block_size, environ)
    from jaxinfer.kernels.cpu import argmax as native_argmax
    from jaxinfer.kernels.cpu import gemv as native_gemv

    gemv = one_cpu and bf16 and _switched_on(environ, "gemv") and native_gemv.available()
    packed, isa = _packed_method(one_cpu, bf16, int8, flags, environ)
    head = "int8" if int8 else ("dense_cpu" if cpu else "dense")
    base = "bf16_gemv" if gemv else head
    unroll = unroll_from_env(environ, platform, packed is not None) if unroll_max_tokens is None else unroll_max_tokens
    return ExecutionPlan(platform=platform, **fields, linear=packed or base, linear_fallback=base if packed else None,
                         prompt_head=head, native_gemv=gemv, unroll_max_tokens=unroll,
                         native_argmax=one_cpu and _switched_on(environ, "argmax") and native_argmax.available(),
                         bf16_bits=cpu and jnp.dtype(dtype) == jnp.bfloat16, instruction_set=isa)
