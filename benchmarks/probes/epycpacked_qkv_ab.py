"""q, k and v as one packed product against three: two engines in one process (the second built
with `native_amx.FUSED` lacking "qkv"), R rows decoding after P-token prompts, rounds of 20
steps alternated; prints the median and quartiles of each engine's step. Usage: qkv_ab.py [R] [P] [ROUNDS]"""
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from jaxinfer import LLM, SamplingParams
from jaxinfer.kernels.cpu import amx as native_amx  # noqa: E402

R, P, ROUNDS = (int(a) for a in (sys.argv[1:] + ["1", "128", "15"][len(sys.argv) - 1:])[:3])


def make(fused: bool):
    saved = native_amx.FUSED
    if not fused:
        native_amx.FUSED = {**saved, "attn": {"qkv": ()}}
    try:
        e = LLM(str(ROOT / "weights/smollm2-135m-instruct"), use_tqdm=False, enable_prefix_caching=False).engine
    finally:
        native_amx.FUSED = saved
    assert ("qkv_packed" in e.runner.amx["layers"]["attn"]) is fused
    rs = np.random.RandomState(0)
    sp = SamplingParams(temperature=0.0, max_tokens=3000, ignore_eos=True)
    for i in range(R):
        e.add_request(f"d{i}", rs.randint(256, 16000, P).tolist(), sp)
    while any(r.num_output_tokens == 0 for r in e.requests.values()):
        e.step()
    return e


engines = {"qkv one product": make(True), "q, k, v apart": make(False)}
times = {n: [] for n in engines}
for _ in range(ROUNDS):
    for n, e in engines.items():
        for _ in range(20):
            t = time.perf_counter()
            e.step()
            times[n].append(1e3 * (time.perf_counter() - t))
print(f"{R} rows, prompts of {P}, {ROUNDS} rounds of 20 steps: " + " | ".join(
    f"{n}: median {statistics.median(ts):.2f} ms (quartiles {np.percentile(ts, 25):.2f}-{np.percentile(ts, 75):.2f})"
    for n, ts in times.items()))
