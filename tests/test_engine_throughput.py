"""benchmarks/engine_throughput.py (the GPU check's continuous-vs-static engine run) on a tiny
model, and `LLM(scheduler=...)`, which it relies on."""
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
    spec = importlib.util.spec_from_file_location("engine_throughput",
                                                  ROOT / "benchmarks" / "engine_throughput.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_both_schedulers_generate_every_token(tmp_path):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    rc = load_script().main(["--config", str(cfg), "--dtype", "float32", "--batch", "4",
                             "--input", "8", "--output", "5", "--backends", "xla",
                             "--out", str(tmp_path)])
    assert rc == 0
    report = json.loads((tmp_path / "engine_throughput.json").read_text())
    assert [r["scheduler"] for r in report["runs"]] == ["continuous", "static"]
    for run in report["runs"]:
        assert run["output_tokens"] == 4 * 5
        assert run["output_tok_per_s"] > 0
        assert run["executables"]  # the prefill and decode steps, compiled
        for step in run["executables"]:  # the donated cache is updated in place, never copied
            assert step["cache_shaped_copies"] == 0 and step["temp_bytes"] > 0


def test_llm_refuses_an_unknown_scheduler():
    from jaxinfer import LLM
    from jaxinfer.config.model_config import ModelConfig

    with pytest.raises(ValueError, match="scheduler must be"):
        LLM("dummy", dtype="float32", scheduler="round-robin", warmup=False,
            model_config=ModelConfig.from_dict(TINY), params={}, tokenizer=None)
