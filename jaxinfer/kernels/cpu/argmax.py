"""Row-wise argmax of float32 logits on CPU (`jaxinfer/kernels/cpu/csrc/argmax.cc`): the build, the XLA FFI
registration and the jnp-side call.

Every step returns the greedy token id of each row (`jaxinfer.runner.model_runner`). XLA:CPU (jax 0.10.2)
lowers ``jnp.argmax`` to a variadic (value, index) reduce that read SmolLM2's ``[32, 49152]``
logits at ~1 GB/s, 4.2 ms of an 89 ms 32-row decode step
(`benchmarks/results/2026-12-03-cpu2-amx-attention/`). The C++ loop gives the same ids (the first
index of the maximum; the first NaN where a row has one) in two vector passes per row.

Built on first use by `jaxinfer.kernels.cpu.build` (``~/.cache/jaxinfer/native/argmax-<hash>.so``).
Used on one CPU device only (a custom call has no sharding rule). With no compiler, or
``JAXINFER_NATIVE_ARGMAX=0``, `available` says why and ``jnp.argmax`` runs.
"""
from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp

from jaxinfer.kernels.cpu import build as native_build

logger = logging.getLogger(__name__)

TARGET = "jaxinfer_argmax"
SOURCE = native_build.NATIVE_DIR / "argmax.cc"
ENV_SWITCH = "JAXINFER_NATIVE_ARGMAX"  # "0" turns the loop off (jnp.argmax runs)


@functools.cache
def _load() -> str | None:
    """Build (once per machine), load and register; returns None, or why not."""
    return native_build.load_ffi(SOURCE, {TARGET: "JaxinferArgmax"}, what="CPU argmax", env_switch=ENV_SWITCH,
                                 logger=logger)


def available() -> bool:
    """Whether the loop can run here (built and registered on first call; if not, logged why)."""
    why = _load()
    if why is not None:
        logger.warning("CPU argmax loop off (%s); jnp.argmax is used", why)
    return why is None


def argmax(logits: jax.Array) -> jax.Array:
    """``jnp.argmax(logits, axis=-1)`` as int32 ``[R]`` for ``logits [R, V]`` (cast to float32).
    Call only where `available` is True, on one CPU device."""
    if logits.ndim != 2 or logits.shape[1] < 1:
        raise ValueError(f"argmax: expected logits [R, V >= 1], got {logits.shape}")
    out = jax.ShapeDtypeStruct((logits.shape[0],), jnp.int32)
    return jax.ffi.ffi_call(TARGET, out)(logits.astype(jnp.float32))


def greedy_ids(logits: jax.Array, native: bool) -> jax.Array:
    """The greedy token id of each row, int32 ``[R]``: `argmax` where ``native``, else ``jnp.argmax``."""
    return argmax(logits) if native else jnp.argmax(logits, axis=-1).astype(jnp.int32)
