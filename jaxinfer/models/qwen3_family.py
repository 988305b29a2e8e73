"""The Qwen3 (dense) family's registry entry (`FAMILY`): its config fields and checkpoint names.

Owns how Qwen3 checkpoints differ from Qwen2's (transformers ``Qwen3Config`` /
``Qwen3Attention``; Qwen3 technical report, Yang et al. 2025): RMSNorm over ``head_dim`` on
each q and k head before RoPE (``q_norm`` / ``k_norm``, weight ``[head_dim]``, plain ``w``
like every Qwen norm), an explicit ``head_dim`` that need not be hidden / heads (Qwen3-0.6B:
1024 / 16 heads, head_dim 128), and no biases unless ``attention_bias`` (then on q, k, v and
o, as in transformers). Sliding window and RoPE are read as for Qwen2
(`jaxinfer.models.qwen2_family`). Its GGUFs (llama.cpp architecture ``qwen3``) add
``attn_q_norm`` / ``attn_k_norm`` and store q and k unpermuted. The decoder is
`jaxinfer.models.llama.LlamaForCausalLM`; the Qwen3-MoE family reuses `HF_LAYER_ATTN` and
`attention_fields` for the same attention block. Plain numpy, no JAX.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jaxinfer.models import qwen2_family
from jaxinfer.models.family import GgufField, ModelFamily
from jaxinfer.models.llama_family import DECODER, GGUF_GLOBAL, GGUF_LAYER, HF_LAYER

if TYPE_CHECKING:
    from jaxinfer.config.model_config import ModelConfig

# Qwen3's attention tensors beyond Llama's: per-head q/k norms, and the biases of
# ``attention_bias`` configs (absent from the tree, and expected absent, otherwise).
HF_LAYER_ATTN = {
    "self_attn.q_norm.weight": ("attn/q_norm/scale", "id"),
    "self_attn.k_norm.weight": ("attn/k_norm/scale", "id"),
    **qwen2_family.HF_LAYER_BIAS,
    "self_attn.o_proj.bias": ("attn/o_bias", "id"),
}
HF_LAYER_QWEN3 = {**HF_LAYER, **HF_LAYER_ATTN}
GGUF_LAYER_ATTN = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
GGUF_LAYER_QWEN3 = {**GGUF_LAYER, **GGUF_LAYER_ATTN}


def attention_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The attention switches of a Qwen3 (or Qwen3-MoE) config: q/k norms, ``attention_bias``'s
    biases, the activation and the sliding window (`qwen2_family.sliding_fields`)."""
    bias = bool(d.get("attention_bias", False))
    return dict(qk_norm=True, qkv_bias=bias, o_proj_bias=bias, hidden_act=d.get("hidden_act") or "silu",
                **qwen2_family.sliding_fields(d))


def hf_config_fields(d: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Qwen3 config fields -> (ModelConfig keyword arguments, RoPE dict).

    Raises:
      ValueError: ``use_sliding_window`` without a window.
    """
    return attention_fields(d), qwen2_family.hf_rope_fields(d)


def attention_dict(cfg: "ModelConfig") -> dict[str, Any]:
    """The fields `attention_fields` reads back, plus RoPE, norms, context, tying, BOS/EOS."""
    return {"rope_parameters": qwen2_family.rope_dict(cfg), "attention_bias": cfg.qkv_bias,
            **qwen2_family.sliding_dict(cfg), **cfg.hf_common_fields(), "hidden_act": cfg.hidden_act}


def hf_config_dict(cfg: "ModelConfig") -> dict[str, Any]:
    """``Qwen3Config`` fields after the layer shape.

    Raises:
      ValueError: q/k/v biases without the o_proj one or the reverse (transformers' Qwen3 has
        one ``attention_bias`` for all four).
    """
    if cfg.qkv_bias != cfg.o_proj_bias:
        raise ValueError("Qwen3's attention_bias sets the q/k/v and o_proj biases together")
    return attention_dict(cfg)


def gguf_config_fields(field: GgufField, hf: dict[str, Any]) -> dict[str, Any]:
    """``qwen3.*`` metadata: the RoPE base and yarn scaling (`qwen2_family.gguf_rope_fields`)."""
    return qwen2_family.gguf_rope_fields(field, "qwen3")


FAMILY = ModelFamily(
    model_type="qwen3", hf_architectures=("Qwen3ForCausalLM",), gguf_architecture="qwen3", decoder=DECODER,
    hf_config_fields=hf_config_fields, hf_config_dict=hf_config_dict, gguf_config_fields=gguf_config_fields,
    hf_layer_tensors=HF_LAYER_QWEN3, gguf_tensors=GGUF_GLOBAL, gguf_layer_tensors=GGUF_LAYER_QWEN3,
    gguf_tensor_fix=qwen2_family.gguf_tensor_fix)
