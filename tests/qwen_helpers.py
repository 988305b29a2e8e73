"""Tiny random Qwen2 / Qwen3 checkpoints made by transformers itself, and its greedy reference.

The weights are drawn wider than transformers' init (linear N(0, 0.25), embeddings N(0, 0.5),
an untied LM head N(0, 0.6), biases N(0, 0.1), RMSNorm weights 1 + N(0, 0.1)) so that the
top-2 logit margins are well separated and a float32 engine should match every greedy token;
steps whose margin is below `TIE` are near-ties, where rounding may pick the other token.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

TIE = 0.01  # a top-1 minus top-2 logit margin below this is a near-tie

SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)


def hf_qwen(model_type: str, seed: int = 0, **overrides):
    """A float32 transformers ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` (eager attention) with
    `SHAPE` plus ``overrides`` as its config and the module docstring's wide random weights."""
    import torch
    import transformers

    cls = {"qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[model_type]
    cfg = cls[0](**{**SHAPE, **overrides})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls[1](cfg).eval().to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
            elif "embed_tokens" in name:
                p.normal_(0, 0.5)
            elif "lm_head" in name:
                p.normal_(0, 0.6)
            else:
                p.normal_(0, 0.25)
    return model


def save_hf(model, path: Path) -> Path:
    """``save_pretrained`` (safetensors, no tokenizer) into ``path``; returns it."""
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of ``prompt`` (``generate``, KV cache, no EOS stop) and
    each step's top-1 minus top-2 margin (one full-sequence forward, as the shared references'
    records)."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        ids = out[0, len(prompt):].tolist()
        logits = model(torch.tensor([prompt + ids[:-1]])).logits[0, len(prompt) - 1:].numpy()
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return ids, (top2[:, 1] - top2[:, 0]).tolist()


def hf_logits(model, token_ids: list[int]) -> np.ndarray:
    """Float32 logits ``[T, V]`` of one forward over ``token_ids``."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].numpy()


def assert_greedy_matches(got: list[int], want: list[int], margins: list[float], what: str = "") -> None:
    """``got`` equals ``want`` up to the first step where they differ, which must be a near-tie."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            assert margins[i] < TIE, f"{what} step {i}: {g} != {w} (margin {margins[i]:.4f})"
            return
    assert len(got) == len(want), what


# llama.cpp's per-layer GGUF names of the HF ones (gguf-py TENSOR_NAMES, qwen2 / qwen3 archs)
_GGUF_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}
_GGUF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}


def gguf_name(hf_name: str) -> str:
    """The GGUF tensor name llama.cpp gives a Qwen2/Qwen3 HF tensor (no permutation: NeoX RoPE)."""
    if hf_name in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[hf_name]
    _, _, i, rest = hf_name.split(".", 3)
    module, _, kind = rest.rpartition(".")
    return f"blk.{i}.{_GGUF_LAYER[module]}.{kind}"


def write_qwen_gguf(model, tokenizer_dir: Path, path: Path) -> Path:
    """A float32 GGUF of a transformers Qwen2/Qwen3 model as llama.cpp's converter lays it out
    (architecture ``qwen2`` / ``qwen3``, its metadata keys, ``gpt2`` BPE tokenizer from
    ``tokenizer_dir``'s ``tokenizer.json``); a tied model has no ``output.weight``."""
    import json

    import gguf

    c = model.config
    arch = c.model_type
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    rope = c.rope_parameters
    w.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "yarn":  # llama.cpp's keys for Qwen's yarn configs
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    tj = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    tokens = sorted(tj["model"]["vocab"], key=tj["model"]["vocab"].get)
    special = {t["content"] for t in tj["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        w.add_tensor(gguf_name(name), t.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
