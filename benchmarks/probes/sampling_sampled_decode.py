"""Decode throughput of SmolLM2 (server dtype) at 32 sequences, greedy against sampled
(temperature 1, the OpenAI API's default), in the working tree this is run from.

32 prompts of 96 random token ids, 64 new tokens each (ignore_eos), submitted at once; each
workload runs once to compile, then ``--reps`` times timed. Prints one JSON line.
Usage: python sampled_decode.py [--reps 2] [--label NAME]
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--reps", type=int, default=2)
ap.add_argument("--label", default="")
ap.add_argument("--root", default=".")
a = ap.parse_args()
sys.path.insert(0, a.root)
from jaxinfer import LLM, SamplingParams  # noqa: E402

llm = LLM(max_num_seqs=32, warmup=False, use_tqdm=False, enable_prefix_caching=False)
rng = np.random.default_rng(0)
prompts = [rng.integers(100, 40000, size=96).tolist() for _ in range(32)]
cases = {"greedy": [SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)] * 32,
         "temperature1": [SamplingParams(temperature=1.0, max_tokens=64, ignore_eos=True, seed=i) for i in range(32)],
         "temperature1_top_p0.9": [SamplingParams(temperature=1.0, top_p=0.9, max_tokens=64, ignore_eos=True, seed=i)
                                   for i in range(32)]}
out = {"label": a.label}
for name, params in cases.items():
    llm.generate(prompts, params, use_tqdm=False)
    times = []
    for _ in range(a.reps):
        t = time.perf_counter()
        res = llm.generate(prompts, params, use_tqdm=False)
        times.append(time.perf_counter() - t)
    n = sum(len(r.outputs[0].token_ids) for r in res)
    out[name] = round(n / statistics.median(times), 1)
print(json.dumps(out), flush=True)
