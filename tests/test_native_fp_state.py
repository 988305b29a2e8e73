"""Loading the native kernels must leave the process's floating-point state alone.

With ``-ffast-math`` on the link line, GCC adds crtfastmath.o to a shared library, and its
constructor sets flush-to-zero / denormals-are-zero in MXCSR when the library is loaded:
every later numpy or JAX computation in the process then lost its subnormals (hypothesis'
float strategies refused to run). `jaxinfer.kernels.cpu.build.FLAGS` spells out the reassociation
flags instead.
"""
from __future__ import annotations

import numpy as np

from jaxinfer.kernels.cpu import amx as native_amx
from jaxinfer.kernels.cpu import argmax as native_argmax
from jaxinfer.kernels.cpu import attention as native_attention
from jaxinfer.kernels.cpu import gemv as native_gemv
from jaxinfer.kernels.cpu import int8 as native_int8
from jaxinfer.kernels.cpu import build as native_build
from jaxinfer.platform.cpu_features import host_cpu_flags


def test_fast_math_is_not_on_the_compile_line():
    assert "-ffast-math" not in native_build.FLAGS and "-Ofast" not in native_build.FLAGS


def test_subnormals_survive_loading_every_native_kernel():
    smallest = np.nextafter(np.float32(0), np.float32(1))  # 1.4e-45, a subnormal
    assert smallest * np.float32(2) > 0
    loaded = [m.__name__ for m in (native_amx, native_int8, native_attention, native_gemv, native_argmax)
              if (m.available(host_cpu_flags()) if m in (native_amx, native_int8) else m.available())]
    assert np.float32(1e-40) * np.float32(1) != 0, f"FTZ/DAZ set after loading {loaded}"
    assert smallest * np.float32(2) > 0
