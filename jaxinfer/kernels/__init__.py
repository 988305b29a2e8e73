"""Every kernel, importing nothing else of jaxinfer: `pallas` (Pallas GPU kernels and their
pure-jnp references) and `cpu` (C++ kernels called as XLA FFI custom calls on CPU). Which one
runs is the execution plan's choice (`jaxinfer.platform.execution_plan`).
"""
