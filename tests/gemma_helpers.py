"""A tiny random Gemma 3 model and its transformers twin (``Gemma3ForCausalLM``) for tests."""
from __future__ import annotations

import numpy as np

from jaxinfer.config import ModelConfig
from jaxinfer.models.params import init_params


def tiny_gemma_config(vocab=256, hidden=64, layers=6, heads=4, kv_heads=1, head_dim=32, inter=128, window=8,
                      max_pos=512) -> ModelConfig:
    """Gemma 3's structure at toy size: 5 sliding layers : 1 global, qk-norm, sandwich norms."""
    return ModelConfig.from_dict(dict(
        model_type="gemma3_text", vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        sliding_window=window, max_position_embeddings=max_pos, rms_norm_eps=1e-6, tie_word_embeddings=True,
        query_pre_attn_scalar=head_dim, bos_token_id=2, eos_token_id=1))


def tiny_gemma_params(cfg: ModelConfig, seed: int = 1) -> dict:
    """Random weights (std 0.1) with random norm weights too (the init's zeros would hide the offset)."""
    params = init_params(cfg, scale=5.0, seed=seed)
    rng = np.random.default_rng(seed)

    def fill(tree, path=""):
        for k, v in tree.items():
            if isinstance(v, dict):
                fill(v, f"{path}/{k}")
            elif "norm" in path:
                tree[k] = rng.normal(0, 0.3, v.shape).astype(v.dtype)
    fill(params)
    return params


def to_hf_gemma_state_dict(cfg: ModelConfig, params) -> dict[str, np.ndarray]:
    """Our params tree -> transformers Gemma3ForCausalLM state dict (the inverse of convert)."""
    D = cfg.hidden_size
    lay, a, m = params["layers"], params["layers"]["attn"], params["layers"]["mlp"]
    sd = {"model.embed_tokens.weight": params["embed"]["embedding"], "model.norm.weight": params["final_norm"]["scale"]}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = a["q_proj"]["kernel"][i].reshape(D, -1).T
        sd[p + "self_attn.k_proj.weight"] = a["k_proj"]["kernel"][i].reshape(D, -1).T
        sd[p + "self_attn.v_proj.weight"] = a["v_proj"]["kernel"][i].reshape(D, -1).T
        sd[p + "self_attn.o_proj.weight"] = a["o_proj"]["kernel"][i].reshape(-1, D).T
        sd[p + "self_attn.q_norm.weight"] = a["q_norm"]["scale"][i]
        sd[p + "self_attn.k_norm.weight"] = a["k_norm"]["scale"][i]
        sd[p + "mlp.gate_proj.weight"] = m["gate_proj"]["kernel"][i].T
        sd[p + "mlp.up_proj.weight"] = m["up_proj"]["kernel"][i].T
        sd[p + "mlp.down_proj.weight"] = m["down_proj"]["kernel"][i].T
        sd[p + "input_layernorm.weight"] = lay["input_norm"]["scale"][i]
        sd[p + "post_attention_layernorm.weight"] = lay["attn_out_norm"]["scale"][i]
        sd[p + "pre_feedforward_layernorm.weight"] = lay["post_attention_norm"]["scale"][i]
        sd[p + "post_feedforward_layernorm.weight"] = lay["mlp_out_norm"]["scale"][i]
    return {k: np.ascontiguousarray(v) for k, v in sd.items()}


def hf_gemma(cfg: ModelConfig, params):
    """A float32 transformers Gemma3ForCausalLM (eager attention) holding our weights."""
    import torch
    import transformers

    hf_cfg = transformers.Gemma3TextConfig(**{k: v for k, v in cfg.to_hf_dict().items() if k != "architectures"})
    hf_cfg._attn_implementation = "eager"
    model = transformers.Gemma3ForCausalLM(hf_cfg).eval().to(torch.float32)
    sd = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in to_hf_gemma_state_dict(cfg, params).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("lm_head" in k or "rotary" in k for k in missing), (missing, unexpected)
    model.tie_weights()
    return model
