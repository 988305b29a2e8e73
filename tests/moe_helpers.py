"""Small random mixture-of-experts checkpoints made with transformers itself, and transformers'
greedy tokens on them (the reference of tests/test_moe.py).

Weights are redrawn wider than transformers' init (linear and expert weights N(0, 0.25),
embeddings N(0, 0.5), an untied LM head N(0, 0.6), routers N(0, 0.5), RMSNorm weights
1 + N(0, 0.1)), so that logits and router choices are well separated (the recipe of the
reference checkpoints the MoE work was developed against).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

MIXTRAL = dict(cls="MixtralForCausalLM", cfg="MixtralConfig", seed=7,
               config=dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                           rope_theta=10000.0, sliding_window=None))
QWEN3_MOE = dict(cls="Qwen3MoeForCausalLM", cfg="Qwen3MoeConfig", seed=8,
                 config=dict(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=48,
                             num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                             num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                             mlp_only_layers=[1], max_position_embeddings=512, rms_norm_eps=1e-6,
                             tie_word_embeddings=False, rope_theta=10000.0, use_sliding_window=False))

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [200, 3, 99, 41, 17, 250, 8, 8, 9, 100, 101, 33], [77] * 20,
           [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
            32, 33, 34]]
NEAR_TIE = 0.01  # top-1 minus top-2 logit below this: float differences may flip the token


def reinit(model) -> None:
    """Redraw every parameter from torch's global RNG (module docstring)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(0.5 * torch.randn_like(p))
            elif name.endswith("lm_head.weight"):
                p.copy_(0.6 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight"):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(0.25 * torch.randn_like(p))


def make_hf_checkpoint(spec: dict, out: Path, **overrides):
    """Build, re-draw and save a transformers MoE model of ``spec`` to ``out``; returns the model."""
    import torch
    import transformers

    torch.manual_seed(spec["seed"])
    cfg = getattr(transformers, spec["cfg"])(**{**spec["config"], **overrides}, bos_token_id=1, eos_token_id=2,
                                             dtype="float32", attn_implementation="eager",
                                             experts_implementation="eager")
    model = getattr(transformers, spec["cls"])(cfg).to(torch.float32).eval()
    reinit(model)
    model.save_pretrained(str(out))
    return model


def hf_greedy(model, prompt: list[int], steps: int) -> tuple[list[int], list[float], np.ndarray]:
    """transformers' float32 greedy tokens (full forwards, no cache, EOS ignored), each step's
    top-1 minus top-2 logit, and the first step's logits computed in float64 by the same
    model (the exact value both float32 computations approximate)."""
    import copy

    import torch

    ids, margins = list(prompt), []
    with torch.no_grad():
        first = copy.deepcopy(model).double()(torch.tensor([ids])).logits[0, -1].numpy()
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[0, -1].numpy()
            top2 = np.sort(logits)[-2:]
            margins.append(float(top2[1] - top2[0]))
            ids.append(int(np.argmax(logits)))
    return ids[len(prompt):], margins, first


def agree_until_near_tie(got: list[int], want: list[int], margins: list[float]) -> bool:
    """Whether ``got`` equals ``want`` up to (not including) the first near-tie step."""
    upto = next((i for i, m in enumerate(margins) if m < NEAR_TIE), len(want))
    return got[:upto] == want[:upto]
