"""Scratch probe (2026-12-02): cold warm-up time of a small engine, compilation cache empty.

    rm -rf /tmp/xla-w0 /tmp/xla-w1
    JAX_COMPILATION_CACHE_DIR=/tmp/xla-w0 JAXINFER_NATIVE_DECODE=0 python cold_warmup_probe.py   # 108.7 s
    JAX_COMPILATION_CACHE_DIR=/tmp/xla-w1 JAXINFER_NATIVE_DECODE=1 python cold_warmup_probe.py   # 98.2 s
(figures as printed on 2026-12-02 at 19d8b7a~ with the kernel wiring; not kept as JSON)
"""
import os, sys, time, json
import pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
os.environ.setdefault("JAXINFER_UNROLL_MAX_TOKENS", "0")
t0 = time.perf_counter()
from jaxinfer import LLM
llm = LLM(max_model_len=512, max_num_seqs=8, max_num_batched_tokens=128, num_blocks=64, use_tqdm=False)
t1 = time.perf_counter()
print(json.dumps(dict(native=os.environ.get("JAXINFER_NATIVE_DECODE", "1"), init_s=round(t1 - t0, 1),
      used=llm.engine.runner.model.attention.native_decode if hasattr(llm.engine, "runner") else None)))
