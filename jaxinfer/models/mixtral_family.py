"""The Mixtral family's registry entry (`FAMILY`): Llama attention with a sparse mixture of
experts in every layer (Jiang et al. 2024, "Mixtral of Experts"; transformers
``MixtralForCausalLM``).

Owns how Mixtral checkpoints spell things: ``num_local_experts`` experts of width
``intermediate_size``, ``num_experts_per_tok`` per token, weights renormalised over the top k;
the router ``block_sparse_moe.gate`` and the experts ``block_sparse_moe.experts.<e>.{w1,w3,w2}``
(gate, up, down). A ``sliding_window`` makes every layer sliding. GGUFs of Mixtral say
``general.architecture`` ``llama`` with ``llama.expert_count`` (llama.cpp writes Mixtral as a
Llama with experts): `jaxinfer.weights.sources.gguf_config` sends those here; their experts are
stacked per layer (``ffn_{gate,up,down}_exps``, router ``ffn_gate_inp``) and q/k are permuted
like Llama's. The decoder is `jaxinfer.models.llama.LlamaForCausalLM` with its MoE option. Plain
numpy, no JAX.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jaxinfer.models.family import GgufField, ModelFamily
from jaxinfer.models.llama_family import DECODER, GGUF_GLOBAL, GGUF_LAYER, HF_LAYER, gguf_tensor_fix

if TYPE_CHECKING:
    from jaxinfer.config.model_config import ModelConfig

HF_LAYER_MIXTRAL = {k: v for k, v in HF_LAYER.items() if not k.startswith("mlp.")}
HF_LAYER_MIXTRAL["block_sparse_moe.gate.weight"] = ("moe/router", "t")
HF_EXPERTS = {
    "block_sparse_moe.experts.w1.weight": ("moe/gate_proj", "t"),
    "block_sparse_moe.experts.w3.weight": ("moe/up_proj", "t"),
    "block_sparse_moe.experts.w2.weight": ("moe/down_proj", "t"),
}
GGUF_LAYER_MIXTRAL = {k: v for k, v in GGUF_LAYER.items() if not k.startswith("ffn_") or k == "ffn_norm"}
GGUF_LAYER_MIXTRAL["ffn_gate_inp"] = "block_sparse_moe.gate"
GGUF_EXPERTS = {"ffn_gate_exps": "block_sparse_moe.experts.w1.weight",
                "ffn_up_exps": "block_sparse_moe.experts.w3.weight",
                "ffn_down_exps": "block_sparse_moe.experts.w2.weight"}


def hf_config_fields(d: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``MixtralConfig`` -> the MoE fields (every layer sparse, top k renormalised) and the
    sliding window; RoPE as Llama's."""
    fields: dict[str, Any] = dict(num_experts=int(d.get("num_local_experts", 8)),
                                  num_experts_per_tok=int(d.get("num_experts_per_tok", 2)),
                                  moe_intermediate_size=int(d["intermediate_size"]), norm_topk_prob=True)
    if d.get("sliding_window"):
        fields.update(sliding_window=int(d["sliding_window"]),
                      layer_types=("sliding_attention",) * d["num_hidden_layers"])
    return fields, d.get("rope_parameters") or d.get("rope_scaling") or {}


def hf_config_dict(cfg: "ModelConfig") -> dict[str, Any]:
    """``MixtralConfig`` fields after the layer shape."""
    return {"rope_theta": cfg.rope_theta,
            "rope_scaling": cfg.rope_scaling.to_hf() if cfg.rope_scaling else None,
            **cfg.hf_common_fields(), "hidden_act": "silu", "intermediate_size": cfg.moe_intermediate_size,
            "num_local_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
            "sliding_window": cfg.sliding_window}


def gguf_config_fields(field: GgufField, hf: dict[str, Any]) -> dict[str, Any]:
    """The RoPE base and the experts (``llama.expert_count``, ``llama.expert_used_count``)."""
    return {"rope_theta": float(field("llama.rope.freq_base", 10000.0)),
            "num_local_experts": int(field("llama.expert_count")),
            "num_experts_per_tok": int(field("llama.expert_used_count", 2))}


FAMILY = ModelFamily(
    model_type="mixtral", hf_architectures=("MixtralForCausalLM",), gguf_architecture=None, decoder=DECODER,
    hf_config_fields=hf_config_fields, hf_config_dict=hf_config_dict, gguf_config_fields=gguf_config_fields,
    hf_layer_tensors=HF_LAYER_MIXTRAL, gguf_tensors=GGUF_GLOBAL, gguf_layer_tensors=GGUF_LAYER_MIXTRAL,
    gguf_tensor_fix=gguf_tensor_fix, hf_expert_tensors=HF_EXPERTS, gguf_expert_tensors=GGUF_EXPERTS)
