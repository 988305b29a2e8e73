"""The Qwen3-MoE family's registry entry (`FAMILY`): Qwen3 attention with a sparse mixture of
experts (transformers ``Qwen3MoeForCausalLM``; Qwen3 technical report, Yang et al. 2025).

Owns how Qwen3-MoE checkpoints spell things: the attention block is Qwen3's
(`jaxinfer.models.qwen3_family.attention_fields`: per-head q/k norms, explicit head_dim); the
router ``mlp.gate`` and the experts ``mlp.experts.<e>.{gate,up,down}_proj``; ``num_experts``
(hub configs; transformers 5 also writes ``num_local_experts``: either is read) experts of
width ``moe_intermediate_size``, ``num_experts_per_tok`` per token, renormalised when
``norm_topk_prob``; layers in ``mlp_only_layers`` or off the ``decoder_sparse_step`` keep a
dense MLP of width ``intermediate_size`` (``mlp.{gate,up,down}_proj``). Its GGUFs (llama.cpp
architecture ``qwen3moe``) stack each layer's experts (``ffn_{gate,up,down}_exps``, router
``ffn_gate_inp``); llama.cpp always renormalises the top k for this architecture, and so do
the GGUFs read here. The decoder is `jaxinfer.models.llama.LlamaForCausalLM` with its MoE
option. Plain numpy, no JAX.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jaxinfer.models import qwen2_family, qwen3_family
from jaxinfer.models.family import GgufField, ModelFamily
from jaxinfer.models.llama_family import DECODER, GGUF_GLOBAL, GGUF_LAYER, HF_LAYER

if TYPE_CHECKING:
    from jaxinfer.config.model_config import ModelConfig

HF_LAYER_QWEN3_MOE = {**HF_LAYER, **qwen3_family.HF_LAYER_ATTN, "mlp.gate.weight": ("moe/router", "t")}
HF_EXPERTS = {
    "mlp.experts.gate_proj.weight": ("moe/gate_proj", "t"),
    "mlp.experts.up_proj.weight": ("moe/up_proj", "t"),
    "mlp.experts.down_proj.weight": ("moe/down_proj", "t"),
}
GGUF_LAYER_QWEN3_MOE = {**GGUF_LAYER, **qwen3_family.GGUF_LAYER_ATTN, "ffn_gate_inp": "mlp.gate"}
GGUF_EXPERTS = {"ffn_gate_exps": "mlp.experts.gate_proj.weight", "ffn_up_exps": "mlp.experts.up_proj.weight",
                "ffn_down_exps": "mlp.experts.down_proj.weight"}


def moe_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The MoE fields of a Qwen3-MoE ``config.json`` (transformers ``Qwen3MoeConfig`` defaults)."""
    experts = d.get("num_experts") or d.get("num_local_experts")
    if not experts:
        raise ValueError("a qwen3_moe config needs num_experts (or num_local_experts)")
    return dict(num_experts=int(experts), num_experts_per_tok=int(d.get("num_experts_per_tok", 8)),
                moe_intermediate_size=int(d.get("moe_intermediate_size", 768)),
                norm_topk_prob=bool(d.get("norm_topk_prob", False)),
                decoder_sparse_step=int(d.get("decoder_sparse_step", 1)),
                mlp_only_layers=tuple(int(i) for i in d.get("mlp_only_layers") or ()))


def hf_config_fields(d: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Qwen3-MoE config -> (Qwen3's attention fields and the MoE fields, RoPE dict)."""
    return {**qwen3_family.attention_fields(d), **moe_fields(d)}, qwen2_family.hf_rope_fields(d)


def hf_config_dict(cfg: "ModelConfig") -> dict[str, Any]:
    """``Qwen3MoeConfig`` fields after the layer shape."""
    return {**qwen3_family.hf_config_dict(cfg), **cfg.hf_moe_fields()}


def gguf_config_fields(field: GgufField, hf: dict[str, Any]) -> dict[str, Any]:
    """``qwen3moe.*`` metadata: RoPE, the experts, their width; top k renormalised (llama.cpp's rule)."""
    out = qwen2_family.gguf_rope_fields(field, "qwen3moe")
    out.update(num_experts=int(field("qwen3moe.expert_count")),
               num_experts_per_tok=int(field("qwen3moe.expert_used_count", 8)),
               moe_intermediate_size=int(field("qwen3moe.expert_feed_forward_length", 768)), norm_topk_prob=True)
    return out


FAMILY = ModelFamily(
    model_type="qwen3_moe", hf_architectures=("Qwen3MoeForCausalLM",), gguf_architecture="qwen3moe",
    decoder=DECODER, hf_config_fields=hf_config_fields, hf_config_dict=hf_config_dict,
    gguf_config_fields=gguf_config_fields, hf_layer_tensors=HF_LAYER_QWEN3_MOE, gguf_tensors=GGUF_GLOBAL,
    gguf_layer_tensors=GGUF_LAYER_QWEN3_MOE, gguf_tensor_fix=qwen2_family.gguf_tensor_fix,
    hf_expert_tensors=HF_EXPERTS, gguf_expert_tensors=GGUF_EXPERTS)
