"""Greedy SmolLM2 (offline, LLM.generate): one 40-token prompt alone, then beside 8 others of
10-300 tokens; how far its logits move before the tokens part. Usage: batch_invariance.py DTYPE"""
import sys, numpy as np
from jaxinfer import LLM, SamplingParams
dtype = sys.argv[1]
llm = LLM(dtype=dtype, max_num_seqs=16, warmup=False, use_tqdm=False, return_logits=True, enable_prefix_caching=False)
rng = np.random.default_rng(0)
target = rng.integers(100, 40000, size=40).tolist()
others = [rng.integers(100, 40000, size=int(n)).tolist() for n in rng.integers(10, 300, size=8)]
p = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
alone = llm.generate([target], p, use_tqdm=False)[0].outputs[0]
batch = llm.generate([target] + others, p, use_tqdm=False)[0].outputs[0]
same = next((i for i, (a, b) in enumerate(zip(alone.token_ids, batch.token_ids)) if a != b), len(alone.token_ids))
diff = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(alone.logits[:same + 1], batch.logits[:same + 1]))
print(dtype, "tokens equal", same, "of", len(alone.token_ids), "max |logit diff| before parting", diff)
