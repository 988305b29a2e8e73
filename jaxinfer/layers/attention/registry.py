"""The attention-backend registry: backend name -> its class, the one list that the
``--attention-backend`` choices (`server`), the config check (`jaxinfer.config`) and the runner
(`jaxinfer.runner.model_runner`) read. As vLLM v1's attention-backend registry, a backend is a class
behind a name; adding one is its own module under ``jaxinfer/layers/attention/`` plus one line
in `ATTENTION_BACKENDS`.

No JAX import: the classes are named here as ``"module:Class"`` and imported on first use, so
that `jaxinfer.config` can validate a name without importing JAX.
"""
from __future__ import annotations

import dataclasses
import importlib

# name -> "module:Class" of its `jaxinfer.layers.attention.base.AttentionBackend` subclass
ATTENTION_BACKENDS: dict[str, str] = {
    "xla": "jaxinfer.layers.attention.xla:XlaAttention",
    "pallas": "jaxinfer.layers.attention.pallas:PallasAttention",
    "mosaic": "jaxinfer.layers.attention.mosaic:MosaicAttention",
}


def backend_class(name: str) -> type:
    """The backend class registered as ``name`` (its module imported on first call).

    Raises:
      ValueError: ``name`` is not a key of `ATTENTION_BACKENDS`.
    """
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r} (expected one of {', '.join(ATTENTION_BACKENDS)})")
    module, _, cls = ATTENTION_BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def get_attention_backend(name: str, **options):
    """An instance of the backend registered as ``name``, configured by ``options``.

    The runner passes every backend the same host facts (``mesh``, ``native``, ``interpret``);
    a backend takes those among them that are fields of its dataclass and ignores the rest.

    Raises:
      ValueError: an unknown ``name``.
    """
    cls = backend_class(name)
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in options.items() if k in fields})
