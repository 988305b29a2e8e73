"""The tensor-parallel step updates the KV cache in place: no whole-pool copy in its program.

XLA:CPU once turned the decode step's one-token K/V write into a dynamic-update-slice that
it fused a second time into the attention's page gather; copy insertion then copied the
whole carried V cache twice per layer, so a TP 2 decode step cost time in proportion to
the pool (6.6 s per token for SmolLM2 at 600 blocks; `jaxinfer.layers.attention.kv_storage.write_kv`). The
check reads the optimized HLO of every compiled step (XLA's own output, independent of
our code) for a ``copy`` whose shape is the whole cache.
"""
from __future__ import annotations

import json
import re

from helpers import tiny_config

from jaxinfer import LLM, SamplingParams

NUM_BLOCKS = 3001  # a pool size that appears nowhere else in the program


def whole_cache_copies(hlo_text: str, kv_shape) -> list[str]:
    """Instructions of ``hlo_text`` that copy an array of the cache's per-device shape."""
    dims = ",".join(str(d) for d in kv_shape)
    pattern = re.compile(rf"\[{re.escape(dims)}\]\{{[0-9,]*\}} copy\(")
    return [line.strip()[:160] for line in hlo_text.splitlines() if pattern.search(line)]


def test_tp2_steps_never_copy_the_kv_cache(tmp_path):
    cfg = tiny_config(vocab=256, hidden=64, layers=2, heads=8, kv_heads=4, inter=128)
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(cfg.to_hf_dict()))
    llm = LLM(str(path), load_format="dummy", tensor_parallel_size=2, max_model_len=256, max_num_seqs=2,
              max_num_batched_tokens=16, num_blocks=NUM_BLOCKS, warmup=False)
    for prompt in ([5, 6, 7], list(range(3, 43))):  # one at a time: one-token decode steps at two widths
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True), use_tqdm=False)
    runner = llm.engine.runner
    shard_shape = runner.k_cache.addressable_shards[0].data.shape
    assert shard_shape[1] == NUM_BLOCKS
    buckets = list(runner._executables)
    assert any(b.num_tokens == 1 for b in buckets), buckets  # a decode bucket was compiled
    for bucket, executable in runner._executables.items():
        assert whole_cache_copies(executable.as_text(), shard_shape) == [], bucket
