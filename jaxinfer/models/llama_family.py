"""The Llama family's registry entry (`FAMILY`): its checkpoint names and config fields.

Owns how Llama checkpoints spell things: the Hugging Face and GGUF (llama.cpp gguf-py
``TENSOR_NAMES``, llama arch) tensor names, the llama.cpp row permutation of ``attn_q`` /
``attn_k`` (`unpermute_qk`), and the ``config.json`` fields written back. The decoder is
`jaxinfer.models.llama.LlamaForCausalLM`. Plain numpy, no JAX (read by the JAX-free
`jaxinfer.config.model_config` through `jaxinfer.models.registry`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from jaxinfer.models.family import GgufField, ModelFamily

if TYPE_CHECKING:
    from jaxinfer.config.model_config import ModelConfig

DECODER = "jaxinfer.models.llama:LlamaForCausalLM"

# Hugging Face per-layer names -> (path in the stacked tree, how to reshape [out, in]).
HF_LAYER = {
    "self_attn.q_proj.weight": ("attn/q_proj/kernel", "q"),
    "self_attn.k_proj.weight": ("attn/k_proj/kernel", "kv"),
    "self_attn.v_proj.weight": ("attn/v_proj/kernel", "kv"),
    "self_attn.o_proj.weight": ("attn/o_proj/kernel", "o"),
    "mlp.gate_proj.weight": ("mlp/gate_proj/kernel", "t"),
    "mlp.up_proj.weight": ("mlp/up_proj/kernel", "t"),
    "mlp.down_proj.weight": ("mlp/down_proj/kernel", "t"),
    "input_layernorm.weight": ("input_norm/scale", "id"),
    "post_attention_layernorm.weight": ("post_attention_norm/scale", "id"),
}
# ``attention_bias`` configs' biases (expected absent otherwise: `jaxinfer.weights.convert.build_tree`).
HF_LAYER_ATTN_BIAS = {
    "self_attn.q_proj.bias": ("attn/q_bias", "q_bias"),
    "self_attn.k_proj.bias": ("attn/k_bias", "kv_bias"),
    "self_attn.v_proj.bias": ("attn/v_bias", "kv_bias"),
    "self_attn.o_proj.bias": ("attn/o_bias", "id"),
}
# GGUF tensor names -> Hugging Face names.
GGUF_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_config_fields(d: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``attention_bias`` (biases on q, k, v and o, as transformers' ``LlamaAttention``); other
    fields are the `ModelConfig` defaults (Llama's); RoPE from ``rope_parameters``
    (transformers 5) or ``rope_scaling``."""
    bias = bool(d.get("attention_bias", False))
    return {"qkv_bias": bias, "o_proj_bias": bias}, d.get("rope_parameters") or d.get("rope_scaling") or {}


def hf_config_dict(cfg: "ModelConfig") -> dict[str, Any]:
    """``LlamaConfig`` fields after the layer shape."""
    if cfg.qkv_bias != cfg.o_proj_bias:
        raise ValueError("Llama's attention_bias sets the q/k/v and o_proj biases together")
    return {"rope_theta": cfg.rope_theta,
            "rope_scaling": cfg.rope_scaling.to_hf() if cfg.rope_scaling else None,
            "attention_bias": cfg.qkv_bias, **cfg.hf_common_fields(), "hidden_act": "silu"}


def gguf_config_fields(field: GgufField, hf: dict[str, Any]) -> dict[str, Any]:
    """The RoPE base (``llama.rope.freq_base``, 10000 when absent)."""
    return {"rope_theta": float(field("llama.rope.freq_base", 10000.0))}


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of a q or k projection.

    llama.cpp ``convert_hf_to_gguf.py`` ``LlamaModel.permute`` interleaves the two RoPE
    halves of each head; transformers ``modeling_gguf_pytorch_utils`` undoes it the same way.

    Args:
      w: ``[n_head * head_dim, d_in]`` as stored in GGUF (after dequantization), or a bias
        ``[n_head * head_dim]`` (llama.cpp permutes ``attention_bias`` biases alike).
      n_head: query heads for q, kv heads for k.
    Returns:
      ``w``'s shape in Hugging Face (rotate-half RoPE) row order.
    """
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, head_dim // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def gguf_tensor_fix(gguf_name: str, hf_name: str, w: np.ndarray, cfg: "ModelConfig") -> np.ndarray:
    """Un-permute the q and k projections (and their biases); other tensors are stored as in HF."""
    if hf_name.endswith(("q_proj.weight", "q_proj.bias")):
        return unpermute_qk(w, cfg.num_attention_heads)
    if hf_name.endswith(("k_proj.weight", "k_proj.bias")):
        return unpermute_qk(w, cfg.num_key_value_heads)
    return w


FAMILY = ModelFamily(
    model_type="llama", hf_architectures=("LlamaForCausalLM",), gguf_architecture="llama", decoder=DECODER,
    hf_config_fields=hf_config_fields, hf_config_dict=hf_config_dict, gguf_config_fields=gguf_config_fields,
    hf_layer_tensors={**HF_LAYER, **HF_LAYER_ATTN_BIAS}, gguf_tensors=GGUF_GLOBAL, gguf_layer_tensors=GGUF_LAYER,
    gguf_tensor_fix=gguf_tensor_fix)
