"""The Qwen2 / Qwen2.5 family's registry entry (`FAMILY`): its config fields and checkpoint names.

Owns how Qwen2 checkpoints differ from Llama's (transformers ``Qwen2Config`` /
``Qwen2Attention``; Qwen2 technical report, Yang et al. 2024): biases on the q, k and v
projections (none on o_proj), RoPE under ``rope_parameters`` (transformers 5) or the older
top-level ``rope_theta`` / ``rope_scaling`` (Qwen2.5's long-context configs add yarn there),
and an optional sliding window on the layers from ``max_window_layers`` on when
``use_sliding_window`` is true (off in every released Qwen2.5 config). Its GGUFs (llama.cpp
architecture ``qwen2``) store q and k unpermuted (NeoX-style RoPE, like HF) with the biases as
``blk.<i>.attn_{q,k,v}.bias``. The decoder is `jaxinfer.models.llama.LlamaForCausalLM` (its
switches are `ModelConfig` fields). Plain numpy, no JAX.

`sliding_fields`, `rope_dict`, `hf_rope_fields` and `gguf_rope_fields` are shared with the
Qwen3 family (`jaxinfer.models.qwen3_family`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from jaxinfer.models.family import GgufField, ModelFamily
from jaxinfer.models.llama_family import DECODER, GGUF_GLOBAL, GGUF_LAYER, HF_LAYER

if TYPE_CHECKING:
    from jaxinfer.config.model_config import ModelConfig

# The q/k/v biases ([heads * head_dim] in HF, [heads, head_dim] in the tree).
HF_LAYER_BIAS = {
    "self_attn.q_proj.bias": ("attn/q_bias", "q_bias"),
    "self_attn.k_proj.bias": ("attn/k_bias", "kv_bias"),
    "self_attn.v_proj.bias": ("attn/v_bias", "kv_bias"),
}
HF_LAYER_QWEN2 = {**HF_LAYER, **HF_LAYER_BIAS}


def sliding_fields(d: dict[str, Any]) -> dict[str, Any]:
    """``sliding_window`` and ``layer_types`` of a Qwen2/Qwen3 config, as transformers reads them:
    no window unless ``use_sliding_window``; then ``layer_types`` if given, else layers
    ``max_window_layers`` and up slide (``Qwen2Config.__post_init__``)."""
    if not d.get("use_sliding_window"):
        return {"sliding_window": None, "layer_types": ()}
    n, window = d["num_hidden_layers"], d.get("sliding_window")
    if not window:
        raise ValueError(f"use_sliding_window is true but sliding_window is {window!r}")
    first = d.get("max_window_layers", n)
    types = d.get("layer_types") or ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    return {"sliding_window": int(window), "layer_types": tuple(types)}


def hf_rope_fields(d: dict[str, Any]) -> dict[str, Any]:
    """The RoPE dict of a Qwen config: transformers 5's ``rope_parameters`` or the older
    ``rope_scaling`` (with the top-level ``rope_theta``, which `ModelConfig.from_dict` reads)."""
    return d.get("rope_parameters") or d.get("rope_scaling") or {}


def hf_config_fields(d: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Qwen2 config fields -> (ModelConfig keyword arguments, RoPE dict): q/k/v biases, the
    activation and the sliding window (`sliding_fields`).

    Raises:
      ValueError: ``use_sliding_window`` without a window.
    """
    return dict(qkv_bias=True, hidden_act=d.get("hidden_act") or "silu", **sliding_fields(d)), hf_rope_fields(d)


def rope_dict(cfg: "ModelConfig") -> dict[str, Any]:
    """transformers 5's ``rope_parameters`` of ``cfg`` (type, theta and the scaling's fields)."""
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling:
        out.update(cfg.rope_scaling.to_hf())
    return out


def sliding_dict(cfg: "ModelConfig") -> dict[str, Any]:
    """The sliding-window fields `sliding_fields` reads back (``layer_types`` written out)."""
    types = list(cfg.layer_types) or ["full_attention"] * cfg.num_hidden_layers
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    return {"use_sliding_window": bool(sliding), "sliding_window": cfg.sliding_window,
            "max_window_layers": sliding[0] if sliding else cfg.num_hidden_layers, "layer_types": types}


def hf_config_dict(cfg: "ModelConfig") -> dict[str, Any]:
    """``Qwen2Config`` fields after the layer shape."""
    return {"rope_parameters": rope_dict(cfg), **sliding_dict(cfg), **cfg.hf_common_fields(),
            "hidden_act": cfg.hidden_act}


def gguf_rope_fields(field: GgufField, arch: str) -> dict[str, Any]:
    """RoPE base (``<arch>.rope.freq_base``, 1e6 when absent: Qwen's) and llama.cpp's yarn
    scaling keys (``<arch>.rope.scaling.type`` yarn, ``.factor``, ``.original_context_length``)
    as a ``rope_scaling`` dict."""
    out: dict[str, Any] = {"rope_theta": float(field(f"{arch}.rope.freq_base", 1_000_000.0))}
    kind = field(f"{arch}.rope.scaling.type")
    if kind == "yarn":
        out["rope_scaling"] = {"rope_type": "yarn", "factor": float(field(f"{arch}.rope.scaling.factor")),
                               "original_max_position_embeddings":
                                   field(f"{arch}.rope.scaling.original_context_length")}
    return out


def gguf_config_fields(field: GgufField, hf: dict[str, Any]) -> dict[str, Any]:
    """``qwen2.*`` metadata: the RoPE base and yarn scaling (`gguf_rope_fields`)."""
    return gguf_rope_fields(field, "qwen2")


def gguf_tensor_fix(gguf_name: str, hf_name: str, w: np.ndarray, cfg: "ModelConfig") -> np.ndarray:
    """Nothing to undo: llama.cpp stores Qwen2's q and k as HF does (NeoX RoPE, no permutation)."""
    return w


FAMILY = ModelFamily(
    model_type="qwen2", hf_architectures=("Qwen2ForCausalLM",), gguf_architecture="qwen2", decoder=DECODER,
    hf_config_fields=hf_config_fields, hf_config_dict=hf_config_dict, gguf_config_fields=gguf_config_fields,
    hf_layer_tensors=HF_LAYER_QWEN2, gguf_tensors=GGUF_GLOBAL, gguf_layer_tensors=GGUF_LAYER,
    gguf_tensor_fix=gguf_tensor_fix)
