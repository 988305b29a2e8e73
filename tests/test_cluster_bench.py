"""Smoke run of benchmarks/cluster_bench.py: two tiny-model instances behind HAProxy, a few
short multi-turn chats of the ``chat`` preset's kind (sized messages, think time, a KV pool
sized in sessions) with consistent hashing. The real comparison (SmolLM2, 24 sessions,
hashing vs round robin) is run by hand on an idle machine."""
from __future__ import annotations

import json
import sys

import pytest

from api_helpers import REPO
from cluster_helpers import haproxy_or_skip, server_env, tiny_server_args

sys.path.insert(0, str(REPO / "benchmarks"))

pytestmark = pytest.mark.slow  # two server processes plus warm-up on first use: ~1 min on 2 cores


def test_smoke_hash_mode_writes_consistent_figures(tmp_path, monkeypatch, smollm2_dir):
    haproxy_or_skip()
    import cluster_bench

    for key, value in server_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    flags = tiny_server_args(tmp_path)
    model = flags[flags.index("--model") + 1]
    flags = flags[:flags.index("--model")] + flags[flags.index("--model") + 2:]
    i = flags.index("--served-model-name")  # served as the model's path below (names are repeatable, one per model)
    flags = flags[:i] + flags[i + 2:]
    flags[flags.index("--max-model-len") + 1] = "256"
    flags[flags.index("--max-num-batched-tokens") + 1] = "64"
    i = flags.index("--num-blocks")  # sized by --cache-sessions instead
    flags = flags[:i] + flags[i + 2:]
    out = tmp_path / "bench.json"
    cluster_bench.main(["--instances", "2", "--sessions", "3", "--turns", "3", "--answer-tokens", "4",
                        "--system-tokens", "20", "--user-tokens", "24", "--think-time", "0.2", "--cache-sessions", "4",
                        "--modes", "hash", "--model", model, "--tokenizer", str(smollm2_dir / "tokenizer.json"),
                        "--out", str(out), "--", *flags, "--served-model-name", model, "--no-warmup"])
    result = json.loads(out.read_text())
    measured = result["settings"]["measured"]
    assert abs(measured["system_tokens"] - 20) <= 1 and abs(measured["user_tokens_mean"] - 24) <= 1
    # 4 sessions of system + 3 x (user + answer), 6 template tokens each, in 16-token blocks, + the null block
    blocks = [-(-4 * (measured["system_tokens"] + 6 + 3 * (user + 6) + 3 * (4 + 6)) // 16) + 1 for user in (23, 25)]
    assert blocks[0] <= result["settings"]["num_blocks_per_instance"] <= blocks[1]
    h = result["modes"]["hash"]
    assert h["requests"] == 9 and h["errors"] == []
    assert h["instances_per_session_mean"] == 1.0  # every turn of a chat on one instance
    assert 0 < h["ttft_s"]["p50"] <= h["ttft_s"]["p90"]
    # the servers' counters and the clients' usage fields tell the same hit rate, and turns 2-3 hit
    assert h["hit_rate_metrics"] > 0.3
    assert h["hit_rate_usage"] == pytest.approx(h["hit_rate_metrics"], abs=0.02)
    tokens = h["prefix_cache_tokens"]
    assert tokens["misses"] == tokens["queries"] - tokens["hits"] > 0
    assert sum(h["requests_per_instance"].values()) == 9
