"""`ModelFamily`: what the rest of jaxinfer needs to know about one model architecture.

One value per architecture (Llama, Gemma 3, Qwen2, Qwen3, ...), defined in the family's own
module (`jaxinfer.models.llama_family`, `jaxinfer.models.qwen3_family`, ...) and listed by
`jaxinfer.models.registry`, which the config reader, the converters and the model builder
ask instead of branching on family names. Plain Python: no JAX or flax import, so the
JAX-free `jaxinfer.config.model_config` can use it.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:  # annotations only: model_config imports the registry, not the reverse
    import numpy as np

    from jaxinfer.config.model_config import ModelConfig

GgufField = Callable[..., Any]  # field(key, default=None) -> the GGUF metadata value


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """One architecture's names, config hooks, tensor maps and decoder.

    Attributes:
      model_type: the Hugging Face ``model_type`` (``"llama"``, ``"gemma3_text"``): the
        registry key, and `jaxinfer.config.model_config.ModelConfig.model_type`.
      hf_architectures: the ``config.json`` ``architectures`` names of the family; the first
        is written back into converted folders.
      gguf_architecture: its GGUF ``general.architecture`` (``"llama"``, ``"gemma3"``), or
        None when its GGUFs are not read.
      decoder: ``"module:Class"`` of the flax decoder, imported only when asked for
        (`jaxinfer.models.registry.decoder_class`), so this stays JAX-free.
      hf_config_fields: ``config.json`` dict -> (family keyword arguments of `ModelConfig`,
        the RoPE dict of its global layers for `RopeScaling.from_hf`); raises ValueError
        for features the family's decoder lacks.
      hf_config_dict: `ModelConfig` -> the family's ``config.json`` fields after
        ``architectures``, ``model_type`` and the layer shape (`ModelConfig.to_hf_dict`).
      gguf_config_fields: (GGUF metadata reader ``field(key, default=None)``, the common
        ``config.json``-style dict read so far) -> the family's extra ``config.json`` keys.
      hf_layer_tensors: HF per-layer tensor name (after ``model.layers.<i>.``) -> (path in
        the stacked params tree, reshape kind ``"q"``, ``"kv"``, ``"o"``, ``"t"``, ``"id"``, or
        ``"q_bias"`` / ``"kv_bias"`` for a bias ``[heads * head_dim]``; see
        `jaxinfer.weights.convert.build_tree`). Entries whose path the config does not have
        (a Qwen3 bias with ``attention_bias`` false) are expected absent.
      gguf_tensors: GGUF whole-model tensor name -> HF name.
      gguf_layer_tensors: GGUF per-layer tensor name (``blk.<i>.<name>.weight`` or ``.bias``)
        -> HF name (without ``model.layers.<i>.`` and ``.weight`` / ``.bias``).
      gguf_tensor_fix: (GGUF name, HF name, float32 ``[out, in]`` array, config) -> the array as
        the HF checkpoint holds it (undoing llama.cpp's storage changes).
      hf_expert_tensors: a mixture of experts' per-expert HF tensor names with the expert
        index left out (``block_sparse_moe.experts.w1.weight`` for
        ``block_sparse_moe.experts.<e>.w1.weight``) -> (path in the stacked tree, reshape
        kind); the experts are stacked on the axis after the layers'.
      gguf_expert_tensors: GGUF per-layer stacked-expert tensor names (``ffn_gate_exps``) ->
        the HF name with the expert index left out (as in ``hf_expert_tensors``).
    """

    model_type: str
    hf_architectures: tuple[str, ...]
    gguf_architecture: str | None
    decoder: str
    hf_config_fields: Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, Any]]]
    hf_config_dict: Callable[["ModelConfig"], dict[str, Any]]
    gguf_config_fields: Callable[[GgufField, dict[str, Any]], dict[str, Any]]
    hf_layer_tensors: Mapping[str, tuple[str, str]]
    gguf_tensors: Mapping[str, str]
    gguf_layer_tensors: Mapping[str, str]
    gguf_tensor_fix: Callable[[str, str, "np.ndarray", "ModelConfig"], "np.ndarray"]
    hf_expert_tensors: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    gguf_expert_tensors: Mapping[str, str] = dataclasses.field(default_factory=dict)
