"""The two source formats a conversion reads: a GGUF file (architecture ``llama`` or ``gemma3``)
and a Hugging Face folder (Llama or Gemma 3 text: ``config.json`` + ``*.safetensors``).

Each gives a `ModelConfig` (`gguf_config`, `hf_config`) and yields its tensors under Hugging
Face names in PyTorch ``[out, in]`` order (`read_gguf`, `read_safetensors`), which
`jaxinfer.convert.build_tree` maps onto the parameter tree. GGUF tensors are dequantized with
``gguf.quants.dequantize`` and the llama.cpp row permutation of ``attn_q`` / ``attn_k`` is
undone (llama.cpp ``convert_hf_to_gguf.py`` ``LlamaModel.permute``; transformers
``modeling_gguf_pytorch_utils`` does the same inverse), so the weights equal transformers' own
GGUF load bit for bit. Gemma 3 GGUFs (architecture ``gemma3``) have no permutation but store
every RMSNorm weight as ``w + 1`` (llama.cpp ``Gemma3Model.modify_tensors``): 1 is subtracted
to get transformers' ``w`` back, and the hyperparameters llama.cpp hard-codes (5 local : 1
global layers, local RoPE base 1e4) are filled in as transformers' ``Gemma3TextConfig`` defaults.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from jaxinfer.model_config import ModelConfig

# GGUF tensor names (llama.cpp gguf-py TENSOR_NAMES, llama arch) -> Hugging Face names.
_GGUF_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3 (transformers Gemma3DecoderLayer): four norms per layer, and q/k norms.
_GEMMA3_GGUF_LAYER = dict(_GGUF_LAYER, post_attention_norm="post_attention_layernorm",
                          ffn_norm="pre_feedforward_layernorm", post_ffw_norm="post_feedforward_layernorm",
                          attn_q_norm="self_attn.q_norm", attn_k_norm="self_attn.k_norm")
GEMMA3_END_OF_TURN = "<end_of_turn>"  # a stop token of Gemma 3 besides EOS (its generation_config lists both)


# ---------------------------------------------------------------- sources: GGUF

def gguf_config(reader) -> ModelConfig:
    """Hyperparameters from GGUF metadata (``llama.*`` / ``gemma3.*`` and ``tokenizer.ggml.*`` keys).

    Raises:
      ValueError: an architecture other than ``llama`` or ``gemma3``, or RoPE scaling (read from
        Hugging Face checkpoints only).
    """
    def field(key, default=None):
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    if arch not in ("llama", "gemma3"):
        raise ValueError(f"GGUF architecture {arch!r} is not supported (only 'llama' and 'gemma3')")
    if field(f"{arch}.rope.scaling.type") not in (None, "none") or "rope_freqs.weight" in _tensor_names(reader):
        raise ValueError("GGUF RoPE scaling is not supported; convert the Hugging Face checkpoint instead")
    n_head = field(f"{arch}.attention.head_count")
    d = field(f"{arch}.embedding_length")
    eos = field("tokenizer.ggml.eos_token_id")
    hf = {
        "vocab_size": field(f"{arch}.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data),
        "hidden_size": d,
        "intermediate_size": field(f"{arch}.feed_forward_length"),
        "num_hidden_layers": field(f"{arch}.block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": field(f"{arch}.attention.head_count_kv", n_head),
        "head_dim": field(f"{arch}.attention.key_length", d // n_head),
        "rms_norm_eps": float(field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "max_position_embeddings": field(f"{arch}.context_length", 4096),
        "tie_word_embeddings": "output.weight" not in _tensor_names(reader),
        "bos_token_id": field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": [] if eos is None else [int(eos)],
    }
    if arch == "llama":
        hf["rope_theta"] = float(field("llama.rope.freq_base", 10000.0))
        return ModelConfig.from_dict(hf)
    tokens = field("tokenizer.ggml.tokens") or []
    if GEMMA3_END_OF_TURN in tokens:
        hf["eos_token_id"].append(tokens.index(GEMMA3_END_OF_TURN))
    hf.update(model_type="gemma3_text", rope_theta=float(field("gemma3.rope.freq_base", 1_000_000.0)),
              sliding_window=field("gemma3.attention.sliding_window"),
              query_pre_attn_scalar=hf["head_dim"])  # llama.cpp: scale 1/sqrt(head_dim) for all but 27B
    return ModelConfig.from_dict(hf)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of a q or k projection.

    Args:
      w: ``[n_head * head_dim, d_in]`` as stored in GGUF (after dequantization).
      n_head: query heads for q, kv heads for k.
    Returns:
      ``[n_head * head_dim, d_in]`` in Hugging Face (rotate-half RoPE) row order.
    """
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, head_dim // 2, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def read_gguf(reader, cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(hf_name, float32 [out, in] array)`` for every tensor of a llama or gemma3 GGUF.

    Raises:
      ValueError: a tensor name outside the llama layout.
    """
    from gguf.quants import dequantize

    gemma = cfg.model_type == "gemma3_text"
    for t in tqdm(reader.tensors, desc="dequantize", unit="tensor"):
        name = _gguf_to_hf(t.name, _GEMMA3_GGUF_LAYER if gemma else _GGUF_LAYER)
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if gemma:
            if t.name.endswith("norm.weight"):  # llama.cpp stores Gemma norm weights as w + 1
                w = w - np.float32(1.0)
        elif name.endswith("q_proj.weight"):
            w = unpermute_qk(w, cfg.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            w = unpermute_qk(w, cfg.num_key_value_heads)
        yield name, w


def _gguf_to_hf(name: str, layer_names: dict[str, str]) -> str:
    if name in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", name)
    if not m or m.group(2) not in layer_names:
        raise ValueError(f"unsupported GGUF tensor {name!r}")
    return f"model.layers.{m.group(1)}.{layer_names[m.group(2)]}.weight"


def _tensor_names(reader) -> set[str]:
    return {t.name for t in reader.tensors}


# ---------------------------------------------------------------- sources: HF folder

def hf_config(src: Path) -> ModelConfig:
    """`ModelConfig` of a Hugging Face folder (``config.json`` + ``generation_config.json``).

    Raises:
      ValueError: ``model_type`` other than ``llama`` or ``gemma3_text``, an unsupported RoPE
        scaling type (llama3, linear, dynamic and yarn are supported: `jaxinfer.model_config.RopeScaling`),
        biases, or Gemma features that are not supported (`jaxinfer.model_config.ModelConfig.from_dict`).
    """
    d = json.loads((src / "config.json").read_text())
    if d.get("model_type") not in ("llama", "gemma3_text"):
        raise ValueError(f"{src}: model_type {d.get('model_type')!r} is not supported (only 'llama' and "
                         "'gemma3_text')")
    if d.get("attention_bias") or d.get("mlp_bias"):
        raise ValueError(f"{src}: attention/MLP biases are not supported")
    gen = src / "generation_config.json"
    try:
        return ModelConfig.from_dict(d, json.loads(gen.read_text()) if gen.exists() else None)
    except ValueError as e:
        raise ValueError(f"{src}: {e}") from e


def read_safetensors(src: Path) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(hf_name, array)`` from every ``*.safetensors`` file of ``src`` (shards too).

    bfloat16 tensors come back as ``ml_dtypes.bfloat16`` numpy arrays: safetensors' numpy
    backend cannot read them, so the flax backend is used, pinned to the host CPU device.
    """
    import jax
    from safetensors import safe_open

    files = sorted(src.glob("*.safetensors"))
    with jax.default_device(jax.devices("cpu")[0]):
        handles = [safe_open(str(f), framework="flax") for f in files]
        names = [(h, k) for h in handles for k in h.keys()]
        for h, k in tqdm(names, desc="read", unit="tensor"):
            yield k, np.asarray(h.get_tensor(k))
