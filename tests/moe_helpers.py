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
           list(range(1, 35))]
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


def write_moe_gguf(hf_dir: Path, tokenizer_dir: Path, path: Path) -> Path:
    """A float32 GGUF of a saved transformers Mixtral or Qwen3-MoE folder as llama.cpp's converter
    lays it out: Mixtral as architecture ``llama`` with ``llama.expert_count`` and q/k rows
    permuted (llama.cpp's ``LlamaModel.permute``), Qwen3-MoE as ``qwen3moe``; each layer's experts
    stacked into ``ffn_{gate,up,down}_exps`` ``[E, out, in]``, the router as ``ffn_gate_inp``;
    the ``gpt2`` BPE tokenizer of ``tokenizer_dir``'s ``tokenizer.json``."""
    import json
    import re

    import gguf
    from safetensors.numpy import load_file

    from jaxinfer.models import registry

    c = json.loads((hf_dir / "config.json").read_text())
    family = registry.by_model_type(c["model_type"])
    arch = "llama" if c["model_type"] == "mixtral" else "qwen3moe"
    n_head, n_kv = c["num_attention_heads"], c["num_key_value_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // n_head
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    w.add_expert_count(c.get("num_experts") or c["num_local_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    if arch == "qwen3moe":
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    tj = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    tokens = sorted(tj["model"]["vocab"], key=tj["model"]["vocab"].get)
    special = {t["content"] for t in tj["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(c["bos_token_id"])
    w.add_eos_token_id(c["eos_token_id"])
    tensors = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    to_gguf = {v: k for k, v in family.gguf_layer_tensors.items()}
    glob = {v: k for k, v in family.gguf_tensors.items()}
    exps = {v: k for k, v in family.gguf_expert_tensors.items()}
    stacks: dict[str, dict[int, np.ndarray]] = {}
    for name, t in tensors.items():
        if name in glob:
            w.add_tensor(glob[name], t)
            continue
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", name)
        i, rest = m.group(1), m.group(2)
        e = re.fullmatch(r"(.+\.experts)\.(\d+)\.(.+)", rest)
        if e:
            stacks.setdefault(f"blk.{i}.{exps[e.group(1) + '.' + e.group(3) + '.weight']}.weight", {})[
                int(e.group(2))] = t
            continue
        if arch == "llama" and rest in ("self_attn.q_proj", "self_attn.k_proj"):
            n = n_head if rest.endswith("q_proj") else n_kv
            t = t.reshape(n, 2, t.shape[0] // n // 2, t.shape[1]).swapaxes(1, 2).reshape(t.shape)
        w.add_tensor(f"blk.{i}.{to_gguf[rest]}.weight", t)
    for name, per_expert in stacks.items():
        w.add_tensor(name, np.stack([per_expert[e] for e in sorted(per_expert)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
