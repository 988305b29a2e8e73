"""The two source formats a conversion reads: a GGUF file and a Hugging Face folder
(``config.json`` + ``*.safetensors``), of any family in `jaxinfer.models.registry`.

Each gives a `ModelConfig` (`gguf_config`, `hf_config`) and yields its tensors under Hugging
Face names in PyTorch ``[out, in]`` order (`read_gguf`, `read_safetensors`), which
`jaxinfer.weights.convert.build_tree` maps onto the parameter tree. GGUF tensors are dequantized with
``gguf.quants.dequantize``, renamed by the family's GGUF tensor maps and passed through its
``gguf_tensor_fix``, which undoes what llama.cpp changed when it wrote them (Llama's q/k row
permutation: `unpermute_qk`; Gemma 3's ``w + 1`` norms), so the weights equal transformers'
own GGUF load bit for bit. The family-specific metadata keys are read by the family's
``gguf_config_fields``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from jaxinfer.config.model_config import ModelConfig
from jaxinfer.models import registry
from jaxinfer.models.family import ModelFamily
from jaxinfer.models.llama_family import unpermute_qk  # noqa: F401 (re-export)


# ---------------------------------------------------------------- sources: GGUF

def gguf_config(reader) -> ModelConfig:
    """Hyperparameters from GGUF metadata (``<arch>.*`` and ``tokenizer.ggml.*`` keys).

    Raises:
      ValueError: an architecture not in `jaxinfer.models.registry` (the message lists the
        supported ones), or RoPE scaling the family's ``gguf_config_fields`` does not read
        (Qwen's yarn keys are read; other scalings only from Hugging Face checkpoints).
    """
    def field(key, default=None):
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    family = registry.by_gguf_architecture(arch)
    if field(f"{arch}.expert_count") and arch in GGUF_EXPERT_FAMILIES:  # llama.cpp writes Mixtral as llama
        family = registry.by_model_type(GGUF_EXPERT_FAMILIES[arch])
    if "rope_freqs.weight" in _tensor_names(reader):
        raise ValueError("GGUF RoPE scaling is not supported; convert the Hugging Face checkpoint instead")
    n_head = field(f"{arch}.attention.head_count")
    d = field(f"{arch}.embedding_length")
    eos = field("tokenizer.ggml.eos_token_id")
    hf = {
        "model_type": family.model_type,
        "vocab_size": field(f"{arch}.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data),
        "hidden_size": d,
        "intermediate_size": field(f"{arch}.feed_forward_length"),
        "num_hidden_layers": field(f"{arch}.block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": field(f"{arch}.attention.head_count_kv", n_head),
        "head_dim": field(f"{arch}.attention.key_length", d // n_head),
        "rms_norm_eps": _f32_decimal(field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "max_position_embeddings": field(f"{arch}.context_length", 4096),
        "tie_word_embeddings": "output.weight" not in _tensor_names(reader),
        "attention_bias": "blk.0.attn_output.bias" in _tensor_names(reader),  # Llama's / Qwen3's q/k/v/o biases
        "bos_token_id": field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": [] if eos is None else [int(eos)],
    }
    hf.update(family.gguf_config_fields(field, hf))
    if family.gguf_expert_tensors:  # GGUF has no mlp_only_layers key: the layers without a router are dense
        names = _tensor_names(reader)
        dense = [i for i in range(hf["num_hidden_layers"]) if f"blk.{i}.ffn_gate_inp.weight" not in names]
        if dense:
            hf.update(mlp_only_layers=dense, decoder_sparse_step=1)
    scaling = field(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none") and "rope_scaling" not in hf:
        raise ValueError(f"GGUF RoPE scaling {scaling!r} of architecture {arch!r} is not supported; "
                         "convert the Hugging Face checkpoint instead")
    return ModelConfig.from_dict(hf)


# GGUF architectures whose files with ``<arch>.expert_count`` are another family's (llama.cpp's
# converter writes Mixtral as ``llama`` with experts).
GGUF_EXPERT_FAMILIES = {"llama": "mixtral"}


def _f32_decimal(v) -> float:
    """A float32 GGUF value as the shortest decimal that is the same float32 (the 1e-6 a
    config.json wrote, not 9.999999974752427e-07)."""
    return float(str(np.float32(v)))


def read_gguf(reader, cfg: ModelConfig) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(hf_name, float32 [out, in] array)`` for every tensor of a GGUF of ``cfg``'s family.
    A layer's stacked experts (``blk.<i>.ffn_gate_exps.weight`` ``[E, out, in]``, the family's
    ``gguf_expert_tensors``) come out as one tensor per expert under its HF name.

    Raises:
      ValueError: a tensor name outside the family's GGUF tensor maps.
    """
    from gguf.quants import dequantize

    family = registry.by_model_type(cfg.model_type)
    for t in tqdm(reader.tensors, desc="dequantize", unit="tensor"):
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", t.name)
        if m and m.group(2) in family.gguf_expert_tensors:
            prefix, _, leaf = family.gguf_expert_tensors[m.group(2)].rpartition(".experts.")
            for e in range(w.shape[0]):
                yield f"model.layers.{m.group(1)}.{prefix}.experts.{e}.{leaf}", w[e]
            continue
        name = _gguf_to_hf(t.name, family)
        yield name, family.gguf_tensor_fix(t.name, name, w, cfg)


def _gguf_to_hf(name: str, family: ModelFamily) -> str:
    if name in family.gguf_tensors:
        return family.gguf_tensors[name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if not m or m.group(2) not in family.gguf_layer_tensors:
        raise ValueError(f"unsupported GGUF tensor {name!r}")
    return f"model.layers.{m.group(1)}.{family.gguf_layer_tensors[m.group(2)]}.{m.group(3)}"


def _tensor_names(reader) -> set[str]:
    return {t.name for t in reader.tensors}


# ---------------------------------------------------------------- sources: HF folder

def hf_config(src: Path) -> ModelConfig:
    """`ModelConfig` of a Hugging Face folder (``config.json`` + ``generation_config.json``).

    Raises:
      ValueError: a ``model_type`` not in `jaxinfer.models.registry`, ``architectures`` that
        name none of its family's classes (a ``Qwen2ForSequenceClassification``), an unsupported RoPE
        scaling type (llama3, linear, dynamic and yarn are supported: `jaxinfer.config.model_config.RopeScaling`),
        biases, or family features that are not supported (`jaxinfer.config.model_config.ModelConfig.from_dict`).
    """
    d = json.loads((src / "config.json").read_text())
    try:
        family = registry.by_model_type(d.get("model_type"))
    except ValueError as e:
        raise ValueError(f"{src}: {e}") from e
    archs = d.get("architectures") or []
    if archs and not set(archs) & set(family.hf_architectures):
        raise ValueError(f"{src}: architecture {', '.join(archs)} is not supported; model_type "
                         f"{family.model_type!r} serves {', '.join(family.hf_architectures)}")
    if d.get("mlp_bias"):
        raise ValueError(f"{src}: MLP biases (mlp_bias) are not supported")
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
