import time, os
from jaxinfer import LLM, SamplingParams
llm = LLM("smollm2-135m-instruct", dtype="bfloat16", max_model_len=1024, max_num_seqs=32, max_num_batched_tokens=512, num_blocks=1024, warmup=False, enable_prefix_caching=False)
import numpy as np
rs = np.random.RandomState(0)
prompts = [rs.randint(100, 40000, 256).tolist() for _ in range(32)]
sp = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
eng = llm.engine
for i, p in enumerate(prompts):
    eng.add_request(str(i), p, sp) if hasattr(eng, "add_request") else None
# run until all prefilled, then time decode steps
for _ in range(40): eng.step()
open("/tmp/bf/perf_ready", "w").write("1")
t = time.perf_counter(); n = 0
while time.perf_counter() - t < 12:
    eng.step(); n += 1
print("steps", n, "ms/step", (time.perf_counter() - t) / n * 1e3)
