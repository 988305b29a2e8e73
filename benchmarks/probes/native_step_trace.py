"""Scratch probe (2026-12-01, reused 2026-12-02 with its results): the brief's fixed load offline, step by step.
JAXINFER_NATIVE_DECODE=0 runs the jnp B1 loop instead of the C++ decode kernel; the JSON gets the
switch's value in its name.

N prompts of 512 random token ids, 256 greedy output tokens each (ignore_eos), all added at once
to one LLMEngine (server defaults: max_num_seqs 32, max_num_batched_tokens 512; 1,537 blocks,
no prefix caching); each step's execute time and its prefill tokens / decode rows.

    JAXINFER_NATIVE_DECODE=1 python step_trace.py 32; JAXINFER_NATIVE_DECODE=0 python step_trace.py 32
"""
import time, sys, json, collections
import numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from jaxinfer import LLM, SamplingParams
llm = LLM(max_model_len=1024, num_blocks=1537, enable_prefix_caching=False, use_tqdm=False)
eng = llm.engine
rng = np.random.default_rng(0)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 32
for i in range(N):
    ids = rng.integers(100, 40000, 512).tolist()
    eng.add_request(f"r{i}", ids, SamplingParams(max_tokens=256, ignore_eos=True, temperature=0.0))
rows = []
orig = eng.runner.execute
def timed(inputs):
    t = time.perf_counter(); r = orig(inputs); rows.append([time.perf_counter() - t]); return r
eng.runner.execute = timed
sched_orig = eng.scheduler.schedule
info = []
def sch():
    s = sched_orig()
    pre = sum(n for r, n in s.scheduled if r.num_computed_tokens < r.num_prompt_tokens)
    dec = sum(1 for r, n in s.scheduled if r.num_computed_tokens >= r.num_prompt_tokens)
    info.append((pre, dec))
    return s
eng.scheduler.schedule = sch
t0 = time.perf_counter()
while eng.has_unfinished_requests():
    eng.step()
wall = time.perf_counter() - t0
info = [x for x in info if x != (0, 0)]
kinds = collections.defaultdict(lambda: [0, 0.0, 0])
for (pre, dec), (dt,) in zip(info, rows):
    k = "prefill-only" if dec == 0 else ("decode-only" if pre == 0 else "mixed")
    kinds[k][0] += 1; kinds[k][1] += dt; kinds[k][2] += dec
print(f"wall {wall:.1f}s steps {len(rows)} out tok/s {N*256/wall:.1f}")
for k, (n, t, d) in kinds.items():
    print(f"{k:14s} steps {n:4d} time {t:7.1f}s mean {t/n*1e3:7.1f} ms decode tokens {d}")
json.dump({"info": info, "dt": [r[0] for r in rows]}, open(__import__("pathlib").Path(__file__).with_name(f"step_trace_{N}_native{__import__('os').environ.get('JAXINFER_NATIVE_DECODE', '1')}.json"), "w"))
