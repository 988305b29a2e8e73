"""Scratch probe (2026-12-01, kept with its results): a lone stream's decode steps through
`LLMEngine.step` for the checkout given, in its own process (so any commit can be measured; the
checkout needs the default model's weights in its weights/ folder).

    python lone_stream_ab.py REPO OUT.json

Three requests of 128 random prompt ids and 128 greedy tokens one after another (no warm-up, so
the first compiles); the median step of the two later requests' decode steps (first two skipped).
"""
import sys, os, time, json, statistics
repo = os.path.abspath(sys.argv[1]); os.chdir(repo); sys.path.insert(0, repo)
import numpy as np
from jaxinfer import LLM, SamplingParams
llm = LLM(max_model_len=1024, warmup=False, use_tqdm=False) if "use_tqdm" in LLM.__init__.__code__.co_varnames else LLM(max_model_len=1024, warmup=False)
e = llm.engine
rng = np.random.default_rng(0)
res = []
for rep in range(3):
    ids = rng.integers(100, 40000, 128).tolist()
    e.add_request(f"r{rep}", ids, SamplingParams(max_tokens=128, ignore_eos=True, temperature=0.0))
    times = []
    while e.has_unfinished_requests():
        t = time.perf_counter(); e.step(); times.append(time.perf_counter() - t)
    res.append(times)
dec = [t * 1e3 for times in res[1:] for t in times[2:]]  # warm requests, decode steps
import jaxinfer
out = {"repo": repo, "jaxinfer_file": jaxinfer.__file__, "median_ms": statistics.median(dec), "p10_ms": float(np.percentile(dec, 10)), "p90_ms": float(np.percentile(dec, 90)),
       "prefill_ms": [times[0] * 1e3 for times in res], "n": len(dec)}
print(json.dumps(out))
json.dump(out, open(sys.argv[2], "w"))
