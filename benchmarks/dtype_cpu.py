"""float32 against bfloat16 on this device, in one run: single-request latency and decode
throughput of `LLM` on the default model and the default KV pool.

Written for the CPU bfloat16 KV-cache fix (the cache held as uint16 bits, see
``jaxinfer.layers.attention.kv_storage.kv_storage_dtype``): before it, XLA:CPU rewrote the whole pool on every
KV write, so bfloat16 steps grew with the pool size.

Three runs: float32; bfloat16; and bfloat16 with the cache stored as bfloat16 (the
behaviour before the fix, by patching ``kv_storage_dtype``), so before/after share one run.
Per run: `LLM(dtype=..., warmup=False, max_num_seqs=8, max_num_batched_tokens=128)`, one
untimed greedy request (compiles), then the median of 3 timed greedy 16-token requests on
"The capital of France is", then ``offline_throughput.decode_only`` at 8 sequences.
Writes benchmarks/results/dtype-<date>-<platform>.json with the commit and settings.

Usage: python benchmarks/dtype_cpu.py [--out FILE]
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from offline_throughput import decode_only  # noqa: E402

from jaxinfer import LLM, SamplingParams  # noqa: E402
from jaxinfer.bench.metadata import git_commit, host_info  # noqa: E402

PROMPT = "The capital of France is"


def measure(dtype: str, bit_storage: bool = True) -> dict:
    import jaxinfer.runner.model_runner as runner_mod

    storage = runner_mod.kv_storage_dtype
    if not bit_storage:  # the cache in its own dtype, as before the fix
        runner_mod.kv_storage_dtype = lambda dtype, platform: dtype
    try:
        llm = LLM(dtype=dtype, warmup=False, max_num_seqs=8, max_num_batched_tokens=128)
    finally:
        runner_mod.kv_storage_dtype = storage
    sp = SamplingParams(temperature=0.0, max_tokens=16)
    llm.generate([PROMPT], sp, use_tqdm=False)
    times, text = [], None
    for _ in range(3):
        t0 = time.perf_counter()
        text = llm.generate([PROMPT], sp, use_tqdm=False)[0].outputs[0].text
        times.append(time.perf_counter() - t0)
    return {"dtype": dtype, "bit_storage": bit_storage, "kv_blocks": llm.engine.num_total_blocks,
            "kv_storage_dtype": str(llm.engine.runner.kv_dtype), "request_16_tokens_s": statistics.median(times),
            "request_times_s": times, "text": text, "decode": decode_only(llm, 8, 128, 32)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import jax

    result = {"benchmark": "dtype_cpu", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "commit": git_commit()["commit"], "device": str(jax.devices()[0]), "jax": jax.__version__,
              "host": host_info(), "model": "smollm2-135m-instruct",
              "runs": [measure("float32"), measure("bfloat16"), measure("bfloat16", bit_storage=False)]}
    print(json.dumps(result["runs"], indent=1))
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / (
        f"dtype-{datetime.date.today()}-{jax.devices()[0].platform}.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
