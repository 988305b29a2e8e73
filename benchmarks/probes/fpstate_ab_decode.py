import sys, time, numpy as np
sys.path.insert(0, ".")
from jaxinfer import LLM, SamplingParams
llm = LLM("smollm2-135m-instruct", max_model_len=1024, use_tqdm=False)
rng = np.random.RandomState(0)
prompts = [rng.randint(100, 40000, 300).tolist() for _ in range(32)]
sp = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
best = []
for rep in range(3):
    t0 = time.perf_counter(); outs = llm.generate(prompts, sp, use_tqdm=False); dt = time.perf_counter() - t0
    best.append(32 * 96 / dt)
print(sys.argv[1], "tok/s", [round(b, 1) for b in best], "subnormals kept:", np.float32(1e-40) * np.float32(1) != 0)
