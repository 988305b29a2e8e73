"""Weight and KV quantization measured: memory, quality and speed per configuration.

Configurations: ``f32`` (float32), ``bf16``, ``int8-weights`` (float32 compute, int8
weights), ``int8-kv`` (float32, int8 KV cache), ``int8-both``. For each, from the live
engine (`jaxinfer.LLM`):
  * ``weight_bytes`` (all param buffers, scales included) and ``kv_bytes_per_token``
    (the live K/V buffers, scales included, over the pool's token slots);
  * ``kv_blocks_at_budget``: blocks the planner gives at ``--kv-budget`` (default 1 GiB);
  * ``greedy_agreement``: of the shared oracle prompts (``tests/data/smollm2_greedy.json``),
    how many give float32's first 16 greedy tokens exactly (run here in float32, not read
    from the file, so the comparison is engine against engine);
  * ``decode_tok_s_1`` / ``decode_tok_s_32``: decode-only throughput at 1 and 32 sequences
    (`benchmarks/offline_throughput.decode_only`);
  * ``perplexity``: `jaxinfer.entrypoints.eval.perplexity` through the same engine (GPL-3's first
    ``--ppl-tokens`` tokens in 1024-token windows; 8192 as ``python -m jaxinfer.eval``);
  * ``serving``: 32 clients x 512 in / 256 out against ``server.py`` with the same flags
    (`benchmarks/compare.py`'s ``fixed`` scenario, ``--serving-requests`` requests), for the
    ``--serving-configs`` (default all; ``--no-serving``: none).
Writes ``benchmarks/results/<date>-<device>/quantization.json``. ``--quick`` (about 15
minutes on an idle 2-core CPU) scores 2048 perplexity tokens, times 32 decode steps and
serves 32 requests for f32 and int8-both only. A smoke run (minutes):
``python benchmarks/quantization.py --configs f32 int8-both --prompts 2 --decode-steps 4 --ppl-tokens 64
--no-serving --no-warmup --out /tmp/qsmoke``.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxinfer import LLM, SamplingParams  # noqa: E402
from jaxinfer.engine.builder import kv_bytes_per_block, plan_num_blocks  # noqa: E402
from jaxinfer.config import CacheConfig  # noqa: E402
from jaxinfer.entrypoints.eval import perplexity  # noqa: E402

CONFIGS = {  # name: (dtype, quantization, kv_cache_dtype)
    "f32": ("float32", None, "auto"),
    "bf16": ("bfloat16", None, "auto"),
    "int8-weights": ("float32", "int8", "auto"),
    "int8-kv": ("float32", None, "int8"),
    "int8-both": ("float32", "int8", "int8"),
}
AGREE_TOKENS = 16
PPL_WINDOW = 1024  # perplexity window (tokens), as `jaxinfer.entrypoints.eval`'s default


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    if name in sys.modules:
        return sys.modules[name]
    mod = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def oracle_prompts(n: int | None) -> list[list[int]]:
    """Prompt token ids of the shared oracle records."""
    recs = json.loads((ROOT / "tests" / "data" / "smollm2_greedy.json").read_text())["results"]
    return [r["prompt_ids"] for r in recs][:n]


def greedy(llm: LLM, prompts) -> list[list[int]]:
    sp = SamplingParams(temperature=0.0, max_tokens=AGREE_TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]


def serving(a, dtype: str, quantization, kv_cache_dtype: str) -> dict | None:
    """compare.py's ``fixed`` scenario (32 x 512/256) against server.py with these flags."""
    compare = _sibling("compare")
    flags = f"--dtype {dtype} --kv-cache-dtype {kv_cache_dtype}" + (f" --quantization {quantization}"
                                                                    if quantization else "")
    with tempfile.TemporaryDirectory() as out:
        res = compare.main(["--systems", "jaxinfer", "--scenarios", "fixed", "--model", a.model,
                            "--num-requests", str(a.serving_requests), "--jaxinfer-args", flags, "--out", out])
    return res.get("scenarios", res).get("fixed", {}).get("jaxinfer") if isinstance(res, dict) else None


def measure(a, name: str, ref_tokens) -> dict:
    dtype, quantization, kv = CONFIGS[name]
    offline = _sibling("offline_throughput")
    llm = LLM(a.model, dtype=dtype, quantization=quantization, kv_cache_dtype=kv, max_model_len=PPL_WINDOW + 32,
              max_num_seqs=32, max_num_batched_tokens=512, kv_cache_memory=a.kv_budget, use_tqdm=False,
              warmup=a.warmup)
    runner = llm.engine.runner
    cfg, cache = llm.engine.model_config, llm.engine.config.cache
    slots = runner.kv_shape[1] * runner.kv_shape[2]
    tokens = greedy(llm, a.prompts_ids)
    row = {"dtype": dtype, "quantization": quantization, "kv_cache_dtype": kv,
           "weight_bytes": int(sum(x.nbytes for x in jax.tree.leaves(runner.params))),
           "kv_bytes_per_token": runner.kv_cache_bytes / slots,
           "kv_bytes_per_block_planned": kv_bytes_per_block(cfg, cache.block_size, dtype, 1, kv),
           "kv_blocks_at_budget": plan_num_blocks(cfg, CacheConfig(kv_cache_memory=a.kv_budget, kv_cache_dtype=kv),
                                                  dtype)[0],
           "kv_budget_bytes": a.kv_budget}
    if ref_tokens is not None:
        row["greedy_agreement"] = sum(t == r for t, r in zip(tokens, ref_tokens))
        row["greedy_prompts"] = len(ref_tokens)
    row["perplexity"] = perplexity(llm, max_tokens=a.ppl_tokens, window=PPL_WINDOW)
    row["perplexity_tokens"] = a.ppl_tokens
    for batch in (1, 32):
        row[f"decode_tok_s_{batch}"] = offline.decode_only(llm, batch, 64, a.decode_steps)["decode_tok_s"]
    del llm, runner
    row["serving"] = serving(a, dtype, quantization, kv) if name in a.serving_configs else None
    return row, tokens


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--prompts", type=int, default=None, help="oracle prompts to compare (default: all)")
    ap.add_argument("--decode-steps", type=int, default=64, help="decode steps timed per batch size")
    ap.add_argument("--kv-budget", type=int, default=1 << 30, help="KV bytes for the block count (1 GiB)")
    ap.add_argument("--ppl-tokens", type=int, default=8192, help="perplexity: tokens of the text scored")
    ap.add_argument("--serving", action=argparse.BooleanOptionalAction, default=True,
                    help="run the 32 x 512/256 serving scenario (--no-serving: for no configuration)")
    ap.add_argument("--serving-configs", nargs="+", default=None, choices=list(CONFIGS),
                    help="configurations served (default: all measured)")
    ap.add_argument("--serving-requests", type=int, default=64, help="requests of the serving scenario")
    ap.add_argument("--quick", action="store_true",
                    help="about 15 minutes on an idle 2-core CPU: --ppl-tokens 2048 --decode-steps 32 "
                         "--serving-requests 32 --serving-configs f32 int8-both")
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                    help="compile every bucket first (--no-warmup: compile on demand, smoke runs)")
    ap.add_argument("--out", default=None, help="default benchmarks/results/<date>-<device>")
    a = ap.parse_args(argv)
    if a.quick:
        a.ppl_tokens, a.decode_steps, a.serving_requests = 2048, 32, 32
        a.serving_configs = a.serving_configs or ["f32", "int8-both"]
    a.serving_configs = [] if not a.serving else (a.serving_configs or a.configs)
    a.prompts_ids = oracle_prompts(a.prompts)
    compare = _sibling("compare")
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"{datetime.date.today()}-{compare.device_label()}")
    out.mkdir(parents=True, exist_ok=True)
    results, ref = {}, None
    for name in ["f32"] + [c for c in a.configs if c != "f32"]:  # float32 first: the reference tokens
        row, tokens = measure(a, name, ref)
        ref = tokens if name == "f32" else ref
        if name in a.configs:
            results[name] = row
        print(name, json.dumps({k: v for k, v in row.items() if k != "serving"}), flush=True)
    doc = {"model": a.model, "device": compare.device_label(), "date": str(datetime.date.today()),
           "agreement_tokens": AGREE_TOKENS, "configs": results}
    (out / "quantization.json").write_text(json.dumps(doc, indent=2))
    print(f"wrote {out / 'quantization.json'}")
    return doc


if __name__ == "__main__":
    main()
