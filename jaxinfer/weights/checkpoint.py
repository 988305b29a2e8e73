"""Parameter checkpoints: the ``params/`` folder of a converted model, saved and restored with orbax.

Owns the layout of the parameter tree (`param_shapes`) and its storage (`save_params`,
`load_params`). The tree is the value of the Flax linen ``'params'`` collection of our Llama
model, with the L layers stacked on axis 0 (einsum letters as in the design: D model, N query
heads, K kv heads, H head dim, F ffn, V vocab)::

    embed/embedding                   [V, D]
    layers/attn/q_proj/kernel         [L, D, N, H]
    layers/attn/k_proj/kernel         [L, D, K, H]
    layers/attn/v_proj/kernel         [L, D, K, H]
    layers/attn/o_proj/kernel         [L, N, H, D]
    layers/mlp/gate_proj/kernel       [L, D, F]
    layers/mlp/up_proj/kernel         [L, D, F]
    layers/mlp/down_proj/kernel       [L, F, D]   (layers/mlp/*: only when some layer is dense)
    layers/moe/router                 [L, D, E]   (layers/moe/*: only with experts, E of them,
    layers/moe/{gate,up}_proj         [L, E, D, Fe]  Fe = moe_intermediate_size;
    layers/moe/down_proj              [L, E, Fe, D]  jaxinfer.models.moe_block)
    layers/input_norm/scale           [L, D]
    layers/post_attention_norm/scale  [L, D]   (the norm before the MLP)
    layers/attn/{q,k}_norm/scale      [L, H]   (only with ``qk_norm``: Gemma 3, Qwen3)
    layers/attn/q_bias                [L, N, H] (only with ``qkv_bias``: Qwen2)
    layers/attn/{k,v}_bias            [L, K, H] (only with ``qkv_bias``)
    layers/attn/o_bias                [L, D]   (only with ``o_proj_bias``)
    layers/{attn,mlp}_out_norm/scale  [L, D]   (only with ``sandwich_norm``: Gemma 3)
    final_norm/scale                  [D]
    lm_head/kernel                    [D, V]   (only when embeddings are untied)

Storage is an orbax ``StandardCheckpointer`` folder (OCDBT + tensorstore). Restoring reads
the tree structure from the checkpoint metadata and passes per-leaf restore arguments
(``PyTreeCheckpointer`` + ``args.PyTreeRestore``): ``RestoreArgs(restore_type=np.ndarray)``
for host numpy arrays, whatever sharding the saver had, or ``ArrayRestoreArgs(sharding=...)``
to read each array straight into its device shards; both take the dtype to cast to.

Integrity: `save_params` also writes `MANIFEST` into the folder, the size and sha256 of
every file orbax wrote. `load_params` checks them before reading (a truncated, missing or
altered file is named at once; orbax itself would load a flipped bit silently); every failure to read a checkpoint is a `CheckpointError` that names the file at fault (or
the folder, for a checkpoint written before manifests) and says how to redo it, never a
traceback from inside orbax.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxinfer.config import ModelConfig

DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(jax.numpy.bfloat16)}
MANIFEST = "jaxinfer_files.json"  # {"files": {relative path: {"size": bytes, "sha256": hex}}}
REDO_HINT = "convert the model again (python -m jaxinfer.convert [SRC] --force)"


class CheckpointError(ValueError):
    """A parameter checkpoint that cannot be read: missing, truncated or corrupt.

    Attributes:
      path: the file at fault, or the checkpoint folder when no single file can be named.
    """

    def __init__(self, message: str, path: Path):
        super().__init__(message)
        self.path = path


def as_dtype(dtype: Any) -> np.dtype:
    """Normalise ``"float32"`` / ``"bfloat16"`` / a numpy or jnp dtype to a numpy dtype.

    Raises:
      ValueError: a string other than the names in `DTYPES`.
    """
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"unsupported dtype {dtype!r}; choose one of {sorted(DTYPES)}")
        return DTYPES[dtype]
    return np.dtype(dtype)


def param_shapes(cfg: ModelConfig) -> dict[str, Any]:
    """The nested dict of parameter shapes (tuples) for ``cfg``; see the module docstring."""
    L, D, F, V = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    N, K, H = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    tree: dict[str, Any] = {
        "embed": {"embedding": (V, D)},
        "layers": {
            "attn": {
                "q_proj": {"kernel": (L, D, N, H)},
                "k_proj": {"kernel": (L, D, K, H)},
                "v_proj": {"kernel": (L, D, K, H)},
                "o_proj": {"kernel": (L, N, H, D)},
            },
            "mlp": {
                "gate_proj": {"kernel": (L, D, F)},
                "up_proj": {"kernel": (L, D, F)},
                "down_proj": {"kernel": (L, F, D)},
            },
            "input_norm": {"scale": (L, D)},
            "post_attention_norm": {"scale": (L, D)},
        },
        "final_norm": {"scale": (D,)},
    }
    if not cfg.has_dense_mlp:
        del tree["layers"]["mlp"]
    if cfg.is_moe:
        E, Fe = cfg.num_experts, cfg.moe_intermediate_size
        tree["layers"]["moe"] = {"router": (L, D, E), "gate_proj": (L, E, D, Fe), "up_proj": (L, E, D, Fe),
                                 "down_proj": (L, E, Fe, D)}
    if cfg.qk_norm:
        tree["layers"]["attn"].update({"q_norm": {"scale": (L, H)}, "k_norm": {"scale": (L, H)}})
    if cfg.qkv_bias:
        tree["layers"]["attn"].update({"q_bias": (L, N, H), "k_bias": (L, K, H), "v_bias": (L, K, H)})
    if cfg.o_proj_bias:
        tree["layers"]["attn"]["o_bias"] = (L, D)
    if cfg.sandwich_norm:
        tree["layers"].update({"attn_out_norm": {"scale": (L, D)}, "mlp_out_norm": {"scale": (L, D)}})
    if not cfg.tie_word_embeddings:
        tree["lm_head"] = {"kernel": (D, V)}
    return tree


def check_tree(tree: dict[str, Any], cfg: ModelConfig) -> None:
    """Check that ``tree`` has exactly the leaves and shapes of `param_shapes` (``cfg``).

    Raises:
      ValueError: naming every missing, unexpected or mis-shaped leaf.
    """
    want = _flatten(param_shapes(cfg))
    got = {k: tuple(v.shape) for k, v in _flatten(tree).items()}
    problems = [f"missing {k} {s}" for k, s in want.items() if k not in got]
    problems += [f"unexpected {k} {s}" for k, s in got.items() if k not in want]
    problems += [f"{k}: shape {got[k]} != {s}" for k, s in want.items() if k in got and got[k] != s]
    if problems:
        raise ValueError("parameter tree does not match the config: " + "; ".join(problems))


def save_params(path: str | Path, tree: dict[str, Any]) -> None:
    """Write a parameter tree (nested dict of numpy or jax arrays) as an orbax checkpoint.

    Args:
      path: folder to create (must not exist yet; orbax writes to a temporary name and
        renames it on commit, so a crash never leaves a half-written ``path``).
      tree: nested dict of arrays, stored with their own dtypes and shapes.
    Raises:
      ValueError (from orbax): ``path`` already exists.
    """
    path = Path(path).absolute()
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path, tree)
        ckptr.wait_until_finished()
    files = {str(f.relative_to(path)): {"size": f.stat().st_size, "sha256": _sha256(f)}
             for f in sorted(path.rglob("*")) if f.is_file()}
    with open(path / MANIFEST, "w") as f:
        json.dump({"files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def verify_files(path: str | Path, hashes: bool = False) -> None:
    """Check a checkpoint folder's files against its `MANIFEST` (no manifest: nothing to check).

    Args:
      path: the ``params/`` folder.
      hashes: also compare sha256 digests (reads every byte; sizes alone are a few stats).
    Raises:
      CheckpointError: naming the first missing, truncated (or grown) or altered file.
    """
    path = Path(path)
    manifest = path / MANIFEST
    if not manifest.is_file():
        return
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"the checkpoint manifest {manifest} is corrupt ({e}); {REDO_HINT}", manifest) from None
    for rel, want in files.items():
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"the parameter checkpoint file {f} is missing; {REDO_HINT}", f)
        size = f.stat().st_size
        if size != want["size"]:
            raise CheckpointError(f"the parameter checkpoint file {f} is truncated or damaged: {size} bytes, "
                                  f"{want['size']} expected; {REDO_HINT}", f)
        if hashes and _sha256(f) != want["sha256"]:
            raise CheckpointError(f"the parameter checkpoint file {f} is corrupt (its sha256 differs from the one "
                                  f"recorded when it was written); {REDO_HINT}", f)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def load_params(path: str | Path, dtype: Any = None, shardings: Any = None) -> dict[str, Any]:
    """Restore a parameter tree written by `save_params`.

    Args:
      path: the ``params/`` folder, or a converted model folder that contains one.
      dtype: cast every leaf to this dtype on restore (``"float32"``, ``"bfloat16"`` or a
        dtype); None keeps the stored dtype.
      shardings: optional pytree with the same structure as the stored tree whose leaves are
        ``jax.sharding.Sharding``s; each array is then read straight into its sharding
        (each device reads only its shard). None restores host ``np.ndarray``s.
    Returns:
      Nested dict of ``np.ndarray`` (no ``shardings``) or ``jax.Array`` (with ``shardings``).
    Raises:
      FileNotFoundError: no checkpoint at ``path``.
      CheckpointError: a file of the checkpoint is missing, truncated or corrupt (named).
      ValueError: ``shardings`` does not match the stored tree structure.
    """
    path = Path(path).absolute()
    if (path / "params").is_dir():
        path = path / "params"
    if not path.is_dir():
        raise FileNotFoundError(f"no parameter checkpoint at {path}")
    verify_files(path, hashes=True)  # ~0.3 s per 300 MB: a flipped bit would otherwise load silently
    cast = None if dtype is None else as_dtype(dtype)
    with ocp.PyTreeCheckpointer() as ckptr:
        meta = _readable(path, lambda: ckptr.metadata(path).item_metadata)
        meta = getattr(meta, "tree", meta)
        if shardings is None:
            args = jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray, dtype=cast), meta)
        else:
            try:
                args = jax.tree.map(
                    lambda m, s: ocp.ArrayRestoreArgs(sharding=s, dtype=cast, global_shape=tuple(m.shape)),
                    meta, shardings)
            except ValueError as e:
                raise ValueError(f"shardings do not match the stored parameter tree: {e}") from e
        return _readable(path, lambda: ckptr.restore(path, args=ocp.args.PyTreeRestore(restore_args=args)))


def _readable(path: Path, read):
    """``read()``; any failure (orbax, tensorstore, a JSON decoder) becomes a `CheckpointError`
    naming the folder (the manifest, checked before, found no damaged file, or there is none)."""
    try:
        return read()
    except Exception as e:  # noqa: BLE001 - every way an unreadable checkpoint fails inside orbax
        failure = e
    text = str(failure).strip()
    first = text.splitlines()[0][:300] if text else ""
    raise CheckpointError(f"cannot read the parameter checkpoint {path} ({type(failure).__name__}: {first}); "
                          f"{REDO_HINT}", path) from None


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": x}}`` -> ``{"a/b": x}``."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out
