"""What ``--dtype auto`` means on a platform: `auto_dtype`, a hardware decision, so it lives here
beside the CPU's feature flags (`jaxinfer.platform.cpu_features`) rather than in the config.

Plain Python; no JAX import (the builder passes the platform name).
"""
from __future__ import annotations

import os

from jaxinfer.platform.cpu_features import has_native_bf16

CPU_DTYPE_ENV_VAR = "JAXINFER_CPU_DTYPE"  # overrides what "auto" means on a CPU


def auto_dtype(platform: str) -> str:
    """The dtype ``"auto"`` stands for on a JAX platform.

    * accelerators (``"gpu"``, ``"tpu"``, ...): bfloat16, as vLLM does for float32/bf16
      checkpoints;
    * ``"cpu"``: ``$JAXINFER_CPU_DTYPE`` when set (``float32`` or ``bfloat16``; the test suite
      pins float32 to compare with float32 references), else bfloat16 on a CPU with a
      bfloat16 dot instruction (`jaxinfer.platform.cpu_features.has_native_bf16`: AVX-512 BF16 or
      AMX), else float32. (vLLM's CPU backend defaults to bfloat16 on any AVX-512 CPU; this
      bfloat16 path was measured only where the instruction exists.) With such an
      instruction, bfloat16 serves faster here than float32 (96.0 against 71.6 output tok/s
      at 32 clients, `benchmarks/results/2026-12-02-cpu2-bf16/`; `jaxinfer.layers.cpu_bf16`
      keeps XLA:CPU from converting the weights inside the step). Outputs then match the
      float32 reference up to near-ties.

    Raises:
      ValueError: ``$JAXINFER_CPU_DTYPE`` is set to anything else.
    """
    if platform != "cpu":
        return "bfloat16"
    forced = os.environ.get(CPU_DTYPE_ENV_VAR, "")
    if forced:
        if forced not in ("float32", "bfloat16"):
            raise ValueError(f"{CPU_DTYPE_ENV_VAR} must be float32 or bfloat16, got {forced!r}")
        return forced
    return "bfloat16" if has_native_bf16() else "float32"
