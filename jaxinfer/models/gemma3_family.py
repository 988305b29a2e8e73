"""The Gemma 3 (text) family's registry entry (`FAMILY`): its config fields and checkpoint names.

Owns how Gemma 3 checkpoints differ from Llama's (transformers ``Gemma3TextConfig`` /
``Gemma3DecoderLayer``, Gemma 3 technical report, 2025): sliding-window layers with their own
RoPE base, q/k norms, four norms per layer, scaled embeddings, ``1 + w`` RMSNorm. Its GGUFs
(architecture ``gemma3``) have no q/k permutation but store every RMSNorm weight as ``w + 1``
(llama.cpp ``Gemma3Model.modify_tensors``): 1 is subtracted to get transformers' ``w`` back,
and the hyperparameters llama.cpp hard-codes (5 local : 1 global layers, local RoPE base 1e4)
are filled in as transformers' defaults. The decoder is `jaxinfer.models.llama.LlamaForCausalLM`
(its switches are `ModelConfig` fields). Plain numpy, no JAX.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from jaxinfer.models.family import GgufField, ModelFamily
from jaxinfer.models.llama_family import DECODER, GGUF_GLOBAL, GGUF_LAYER, HF_LAYER

if TYPE_CHECKING:
    from jaxinfer.config.model_config import ModelConfig

SLIDING_PATTERN = 6  # transformers' default for configs without layer_types: every 6th layer is global
END_OF_TURN = "<end_of_turn>"  # a stop token of Gemma 3 besides EOS (its generation_config lists both)

# Four norms per layer, and q/k norms.
HF_LAYER_GEMMA3 = dict(
    HF_LAYER,
    **{"post_attention_layernorm.weight": ("attn_out_norm/scale", "id"),
       "pre_feedforward_layernorm.weight": ("post_attention_norm/scale", "id"),
       "post_feedforward_layernorm.weight": ("mlp_out_norm/scale", "id"),
       "self_attn.q_norm.weight": ("attn/q_norm/scale", "id"),
       "self_attn.k_norm.weight": ("attn/k_norm/scale", "id")})
GGUF_LAYER_GEMMA3 = dict(GGUF_LAYER, post_attention_norm="post_attention_layernorm",
                         ffn_norm="pre_feedforward_layernorm", post_ffw_norm="post_feedforward_layernorm",
                         attn_q_norm="self_attn.q_norm", attn_k_norm="self_attn.k_norm")


def hf_config_fields(d: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Gemma 3 text-config fields -> (ModelConfig keyword arguments, the global layers' RoPE dict).

    Reads transformers 5's nested ``rope_parameters`` (``full_attention`` /
    ``sliding_attention``) or the older ``rope_theta`` / ``rope_local_base_freq`` /
    ``rope_scaling``; ``layer_types`` or the older ``sliding_window_pattern`` (default 6).

    Raises:
      ValueError: attention-logit soft-capping, attention biases or bidirectional attention
        (not supported).
    """
    if d.get("attn_logit_softcapping") is not None:
        raise ValueError("attn_logit_softcapping is not supported (Gemma 2 style attention soft-capping)")
    if d.get("attention_bias"):
        raise ValueError("attention_bias is not supported for Gemma 3 (its checkpoints have no biases)")
    if d.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention is not supported (decoder-only serving)")
    n = d["num_hidden_layers"]
    rp = d.get("rope_parameters") or {}
    if "full_attention" in rp or "sliding_attention" in rp:
        full = dict(rp.get("full_attention") or {})
        local = rp.get("sliding_attention") or {}
    else:
        full = dict(d.get("rope_scaling") or rp or {})
        local = {}
    full.setdefault("rope_theta", d.get("rope_theta", 1_000_000.0))
    pattern = d.get("sliding_window_pattern") or SLIDING_PATTERN
    types = d.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                     for i in range(n)]
    softcap = d.get("final_logit_softcapping")
    fields = dict(
        hidden_act=d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh",
        sliding_window=d.get("sliding_window", 4096),
        layer_types=tuple(types),
        rope_local_base=float(local.get("rope_theta", d.get("rope_local_base_freq", 10_000.0))),
        qk_norm=True, sandwich_norm=True, scale_embeddings=True, norm_offset=1.0,
        query_pre_attn_scalar=float(d.get("query_pre_attn_scalar", 256)),
        final_logit_softcapping=None if softcap is None else float(softcap),
    )
    return fields, full


def _int_if_whole(v: float | None) -> float | int | None:
    return int(v) if v is not None and float(v).is_integer() else v  # transformers' Gemma3TextConfig wants an int


def hf_config_dict(cfg: "ModelConfig") -> dict[str, Any]:
    """``Gemma3TextConfig`` fields after the layer shape (transformers 5 ``rope_parameters``)."""
    full = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling:
        full.update(cfg.rope_scaling.to_hf())
    return {
        "hidden_activation": cfg.hidden_act,
        "rope_parameters": {"full_attention": full,
                            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_local_base}},
        "sliding_window": cfg.sliding_window,
        "layer_types": list(cfg.layer_types),
        "query_pre_attn_scalar": _int_if_whole(cfg.query_pre_attn_scalar),
        "final_logit_softcapping": cfg.final_logit_softcapping,
        "attn_logit_softcapping": None,
        **cfg.hf_common_fields(),
    }


def gguf_config_fields(field: GgufField, hf: dict[str, Any]) -> dict[str, Any]:
    """``gemma3.*`` metadata: RoPE base (1e6 when absent), sliding window, ``<end_of_turn>`` as
    a second EOS, and softmax scale ``1/sqrt(head_dim)`` (llama.cpp's for all but 27B)."""
    tokens = field("tokenizer.ggml.tokens") or []
    eos = list(hf["eos_token_id"])
    if END_OF_TURN in tokens:
        eos.append(tokens.index(END_OF_TURN))
    return {"eos_token_id": eos, "rope_theta": float(field("gemma3.rope.freq_base", 1_000_000.0)),
            "sliding_window": field("gemma3.attention.sliding_window"), "query_pre_attn_scalar": hf["head_dim"]}


def gguf_tensor_fix(gguf_name: str, hf_name: str, w: np.ndarray, cfg: "ModelConfig") -> np.ndarray:
    """Subtract the 1 llama.cpp adds to every RMSNorm weight."""
    return w - np.float32(1.0) if gguf_name.endswith("norm.weight") else w


FAMILY = ModelFamily(
    model_type="gemma3_text", hf_architectures=("Gemma3ForCausalLM",), gguf_architecture="gemma3",
    decoder=DECODER, hf_config_fields=hf_config_fields, hf_config_dict=hf_config_dict,
    gguf_config_fields=gguf_config_fields, hf_layer_tensors=HF_LAYER_GEMMA3, gguf_tensors=GGUF_GLOBAL,
    gguf_layer_tensors=GGUF_LAYER_GEMMA3, gguf_tensor_fix=gguf_tensor_fix)
