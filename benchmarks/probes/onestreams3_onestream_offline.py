"""One stream, offline: per-token time of LLM.generate (no HTTP), 128 prompt / 128 out, greedy."""
import statistics, time, numpy as np, sys
from jaxinfer import LLM, SamplingParams
llm = LLM(max_num_seqs=32, use_tqdm=False)
rng = np.random.default_rng(0)
p = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
res = []
for i in range(6):
    prompt = rng.integers(100, 40000, size=128).tolist()
    t = time.perf_counter(); out = llm.generate([prompt], p, use_tqdm=False)[0]; dt = time.perf_counter() - t
    m = out.metrics
    res.append(dt)
    print(i, round(dt * 1000, 1), "ms total", {k: getattr(m, k, None) for k in ("first_token_time", "arrival_time", "last_token_time")} if m else None, flush=True)
print("per token (total/128) median ms:", round(statistics.median(res[2:]) / 128 * 1000, 2))
