"""The model registry: architecture name -> `ModelFamily` (after vLLM's ``ModelRegistry``).

Owns the list of supported families and the lookups the rest of jaxinfer uses instead of
branching on family names: `by_model_type` (Hugging Face ``model_type``, also
`ModelConfig.model_type`), `by_gguf_architecture` (GGUF ``general.architecture``),
`decoder_class`, and the supported-name lists for messages (`model_types`,
`gguf_architectures`). Adding a family means its model file, its ``<family>_family.py``
entry listed in `FAMILIES`, and its tests.

Plain Python: decoders are named as ``"module:Class"`` strings and imported only by
`decoder_class`, so the JAX-free `jaxinfer.config.model_config` can use this module.
"""
from __future__ import annotations

import importlib
from typing import Any

from jaxinfer.models import gemma3_family, llama_family, mixtral_family, qwen2_family, qwen3_family, qwen3_moe_family
from jaxinfer.models.family import ModelFamily

FAMILIES: tuple[ModelFamily, ...] = (llama_family.FAMILY, gemma3_family.FAMILY, qwen2_family.FAMILY,
                                     qwen3_family.FAMILY, mixtral_family.FAMILY, qwen3_moe_family.FAMILY)
_BY_MODEL_TYPE: dict[str, ModelFamily] = {f.model_type: f for f in FAMILIES}
_BY_GGUF: dict[str, ModelFamily] = {f.gguf_architecture: f for f in FAMILIES if f.gguf_architecture}


def model_types() -> tuple[str, ...]:
    """The supported Hugging Face ``model_type`` names, in registry order."""
    return tuple(_BY_MODEL_TYPE)


def gguf_architectures() -> tuple[str, ...]:
    """The supported GGUF ``general.architecture`` names, in registry order."""
    return tuple(_BY_GGUF)


def by_model_type(model_type: Any) -> ModelFamily:
    """The family of a Hugging Face ``model_type``.

    Raises:
      ValueError: an unregistered name (the message lists the supported ones).
    """
    return _lookup(_BY_MODEL_TYPE, model_type, "model_type")


def by_gguf_architecture(arch: Any) -> ModelFamily:
    """The family of a GGUF ``general.architecture``.

    Raises:
      ValueError: an unregistered name (the message lists the supported ones).
    """
    return _lookup(_BY_GGUF, arch, "GGUF architecture")


def _lookup(table: dict[str, ModelFamily], name: Any, what: str) -> ModelFamily:
    family = table.get(name)
    if family is None:
        raise ValueError(f"{what} {name!r} is not supported; supported: {', '.join(table)}")
    return family


def decoder_class(model_type: Any) -> type:
    """The flax decoder class of a family, imported on first use.

    Args:
      model_type: a ``model_type`` name, or anything with a ``model_type`` attribute
        (a `jaxinfer.config.model_config.ModelConfig`).
    Returns:
      The class (e.g. `jaxinfer.models.llama.LlamaForCausalLM`), built as
      ``cls(cfg, backend, dtype, param_dtype, ...)``.
    Raises:
      ValueError: an unregistered ``model_type``.
    """
    name = getattr(model_type, "model_type", model_type)
    module, _, cls = by_model_type(name).decoder.partition(":")
    return getattr(importlib.import_module(module), cls)


def register(family: ModelFamily) -> None:
    """Add (or replace) a family at run time, e.g. one defined outside jaxinfer or in a test."""
    _BY_MODEL_TYPE[family.model_type] = family
    if family.gguf_architecture:
        _BY_GGUF[family.gguf_architecture] = family


def unregister(model_type: str) -> None:
    """Remove a family added by `register` (tests clean up with it).

    Raises:
      ValueError: an unregistered ``model_type``.
    """
    family = by_model_type(model_type)
    del _BY_MODEL_TYPE[model_type]
    if _BY_GGUF.get(family.gguf_architecture) is family:
        del _BY_GGUF[family.gguf_architecture]
