"""benchmarks/backend_check.py (the GPU machine's stand-in for the oracle tests) on a tiny
model: the pallas backend (interpret mode) equals the xla backend in float32 and
bfloat16, prompts mixing fresh prefills, continuing chunks and decodes.

bfloat16 + pallas once failed at trace time (q stayed float32 against a bfloat16 cache);
this is its regression test.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from helpers import tiny_hf_config

ROOT = Path(__file__).resolve().parents[1]
TINY = tiny_hf_config()


def load_script():
    spec = importlib.util.spec_from_file_location("backend_check", ROOT / "benchmarks" / "backend_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


# ~170 s on 2 busy cores (every bucket of both backends, twice, Pallas interpreted); the Pallas
# kernels' own tests and tests/test_oracle.py's Pallas engine run stay in `make test`.
@pytest.mark.slow
def test_pallas_equals_xla_in_the_engine(tmp_path):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    script = load_script()
    rc = script.main(["--config", str(cfg), "--max-model-len", "200", "--max-tokens", "8",
                      "--decode-batch", "0", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "backend_check.json").read_text())
    assert rc == 0, report
    by_dtype = {r["dtype"]: r for r in report["results"]}
    assert set(by_dtype) == {"float32", "bfloat16"}
    f32 = by_dtype["float32"]["prompts"]
    assert all(p["same_tokens"] == p["of"] == 8 for p in f32)
    assert max(p["max_logit_diff"] for p in f32) < 1e-4
    # The long prompt is prefilled in two chunks of at most 128 tokens.
    assert by_dtype["float32"]["prompt_lengths"][-1] == 200 - 8 - 1


def test_compare_flags_a_split_that_is_not_a_near_tie():
    import numpy as np

    script = load_script()
    logits = [np.array([5.0, 1.0, 0.0]), np.array([3.0, 2.5, 0.0])]
    ref = script.BackendRun([[0, 0]], [logits], 0.0)
    tie_split = script.BackendRun([[0, 1]], [logits], 0.0)  # gap 0.5 at the split
    assert script.compare(ref, ref, "float32", tie_gap=0.1)["ok"]
    assert not script.compare(ref, tie_split, "float32", tie_gap=0.1)["ok"]
    assert script.compare(ref, tie_split, "float32", tie_gap=1.0)["ok"]


def test_pallas_warmup_compiles_every_bucket_it_serves():
    """Warm-up with the Pallas backend (the GPU default) once crashed on the W = 0 buckets,
    which that backend never uses (its block table covers the new tokens); after warm-up,
    serving compiles nothing."""
    from jaxinfer import LLM, SamplingParams
    from jaxinfer.config import ModelConfig
    from jaxinfer.runner.model_runner import CompileCounter
    from jaxinfer.models.params import init_params

    cfg = ModelConfig.from_dict(TINY)
    llm = LLM("tiny", max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, num_blocks=24, warmup=True,
              attention_backend="pallas", enable_prefix_caching=False, model_config=cfg,
              params=init_params(cfg, seed=0, scale=4.0), tokenizer=None)
    assert 0 not in llm.engine.layout.ladders.width_ladder
    CompileCounter.install()
    before = CompileCounter.count
    outs = llm.generate([[5, 6, 7], list(range(20, 50)), [9]], SamplingParams(temperature=0.0, max_tokens=20,
                                                                          ignore_eos=True), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [20, 20, 20]
    assert CompileCounter.count == before
