"""Decode steps of SmolLM2-135M at R rows (128-token prompts), bfloat16 weights (packed kernel)
against int8 weights (int8 kernel), one engine each, alternated step by step in one process.
Usage: step_ab.py R [R ...]"""
import os, statistics, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import numpy as np
from jaxinfer import LLM, SamplingParams

def engine(rows, **kw):
    e = LLM(str(__import__("pathlib").Path(__file__).resolve().parents[2] / "weights/smollm2-135m-instruct"), use_tqdm=False, enable_prefix_caching=False, **kw).engine
    rs = np.random.RandomState(0)
    sp = SamplingParams(temperature=0.0, max_tokens=3000, ignore_eos=True)
    for i in range(rows):
        e.add_request(f"d{i}", rs.randint(256, 16000, 128).tolist(), sp)
    while any(r.num_output_tokens == 0 for r in e.requests.values()):
        e.step()
    for _ in range(5): e.step()
    return e

for rows in [int(a) for a in sys.argv[1:]]:
    engines = {"bfloat16": engine(rows), "int8": engine(rows, quantization="int8")}
    ts = {n: [] for n in engines}
    for _ in range(int(os.environ.get("STEPS", 100))):
        for n, e in engines.items():
            t0 = time.perf_counter(); e.step(); ts[n].append(time.perf_counter() - t0)
    print(f"R={rows}: " + " | ".join(f"{n} {1e3*statistics.median(v):.2f} ms (q1 {1e3*np.percentile(v,25):.2f} q3 {1e3*np.percentile(v,75):.2f})" for n, v in ts.items()), flush=True)
    del engines
