"""Shared pieces of the cluster tests: HAProxy or a skip, tiny-model server flags, the servers' environment."""
from __future__ import annotations

import json
import os
import sys

import pytest

from api_helpers import REPO
from helpers import tiny_config
from jaxinfer.cluster import haproxy_runtime


def haproxy_or_skip() -> None:
    """Make sure ``haproxy`` is there (installing it like the launcher does), else skip with the reason."""
    try:
        haproxy_runtime.ensure_haproxy(say=lambda m: print(m, file=sys.stderr))
    except haproxy_runtime.HAProxyError as e:
        pytest.skip(f"HAProxy is needed for the cluster tests: {e}")


def tiny_server_args(tmp_path) -> list[str]:
    """``server.py`` flags for a tiny random-weight Llama (written to ``tmp_path/tiny.json``) with
    SmolLM2's tokenizer, served as ``tiny``. ``--no-warmup``: each of the 8 small buckets is
    compiled (or read from the persistent XLA cache) on first use, which takes ~20 s off every
    one of the tests' server starts; ``/health`` still gates traffic exactly as after a warm-up."""
    model = tmp_path / "tiny.json"
    config = tiny_config(vocab=49152, hidden=32, layers=1, heads=2, kv_heads=1, inter=64)  # SmolLM2's vocabulary
    model.write_text(json.dumps(config.to_hf_dict()))
    return ["--model", str(model), "--load-format", "dummy", "--tokenizer", str(REPO / "weights/smollm2-135m-instruct"),
            "--served-model-name", "tiny", "--max-model-len", "64", "--max-num-seqs", "4",
            "--max-num-batched-tokens", "8", "--num-blocks", "64", "--shutdown-timeout", "10",
            "--disable-log-requests", "--no-warmup"]


def server_env() -> dict:
    """The servers' environment: this one without the tests' 8 fake devices."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, not the tests' eight
    return {**env, "JAX_PLATFORMS": "cpu"}
