"""Decode-only steps at row counts that do not fill their bucket, padded rows multiplied or not
(two engines in one process, alternated). Usage: rows_decode.py N1 N2 ..."""
import statistics, sys, time
sys.path.insert(0, "/work/main")
import jax.numpy as jnp
from jaxinfer import LLM, SamplingParams
from jaxinfer.models import llama

def build(padded: bool):
    real, head = llama.real_tokens, llama.lm_head_logits
    if padded:
        llama.real_tokens = lambda meta: jnp.int32(meta.positions.shape[0])
        llama.lm_head_logits = lambda *a, rows=None, **k: head(*a, **k)
    try:
        return LLM(max_num_seqs=64, max_num_batched_tokens=512, use_tqdm=False).engine
    finally:
        llama.real_tokens, llama.lm_head_logits = real, head

engines = {"padded": build(True), "real": build(False)}
sp = SamplingParams(max_tokens=3000, ignore_eos=True, temperature=0.0)
added = 0
for n in map(int, sys.argv[1:]):
    for e in engines.values():
        for i in range(added, n):
            e.add_request(f"r{i}", [1000 + (7 * i + j) % 3000 for j in range(160)], sp)
        for _ in range(4): e.step()
    added = n
    t = {k: [] for k in engines}
    for _ in range(15):
        for k, e in engines.items():
            t0 = time.perf_counter(); e.step(); t[k].append((time.perf_counter() - t0) * 1e3)
    print(f"{n} rows: " + "  ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in t.items()), flush=True)
