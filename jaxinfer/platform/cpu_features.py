"""What the host CPU can do: owns reading its feature flags (`host_cpu_flags`) and
`has_native_bf16`, which changes the default dtype.

Plain Python (reads ``/proc/cpuinfo`` on Linux); no JAX import, so `jaxinfer.config` can ask.
"""
from __future__ import annotations

import functools
from pathlib import Path

# x86 flags of an instruction that multiplies bfloat16 pairs into float32 sums
# (VDPBF16PS of AVX512_BF16: Zen 4, Cooper Lake, Sapphire Rapids; AMX-BF16 tiles:
# Sapphire Rapids). XLA:CPU's bfloat16 dots use them through YNNPACK / oneDNN.
BF16_DOT_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The ``flags`` of the first processor in ``/proc/cpuinfo`` text (empty if none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@functools.lru_cache(maxsize=4)
def host_cpu_flags(cpuinfo_path: str = "/proc/cpuinfo") -> frozenset[str]:
    """`cpu_flags` of ``cpuinfo_path``; empty where it cannot be read (not Linux)."""
    try:
        return cpu_flags(Path(cpuinfo_path).read_text())
    except OSError:
        return frozenset()


def has_native_bf16(cpuinfo_path: str = "/proc/cpuinfo") -> bool:
    """True when the CPU has a bfloat16 dot instruction (`BF16_DOT_FLAGS`).

    False where ``cpuinfo_path`` cannot be read (not Linux): then bfloat16 would be
    emulated, and float32 is the faster CPU dtype.
    """
    return bool(host_cpu_flags(cpuinfo_path) & BF16_DOT_FLAGS)
