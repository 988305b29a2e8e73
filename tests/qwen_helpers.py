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
