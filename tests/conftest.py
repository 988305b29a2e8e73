"""Test-session setup: 8 fake CPU devices for mesh tests, a shared compilation cache,
and fixtures for the real default model."""
from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ORACLE = ROOT.parent / "shared" / "oracle"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The converted default model (converted on first use)."""
    from jaxinfer.weights import ensure_default_weights

    return ensure_default_weights(ROOT / "weights")


@pytest.fixture(scope="session")
def oracle() -> dict:
    import json

    path = ORACLE / "smollm2_greedy.json"
    if not path.exists():
        pytest.skip("shared/oracle not present")
    return json.loads(path.read_text())
