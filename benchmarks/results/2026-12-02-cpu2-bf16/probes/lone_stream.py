import time, sys
from jaxinfer import LLM, SamplingParams
dt=sys.argv[1]
llm = LLM("smollm2-135m-instruct", dtype=dt, max_model_len=1024, max_num_seqs=32, max_num_batched_tokens=512, num_blocks=512, warmup=False)
sp=SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
p="The history of the city begins with"
llm.generate([p], sp, use_tqdm=False)
ts=[]
for _ in range(3):
    t=time.perf_counter(); o=llm.generate([p], sp, use_tqdm=False); ts.append(time.perf_counter()-t)
print(dt, "128 tokens: s", [round(x,2) for x in ts], "ms/token", round(min(ts)/128*1e3,1), repr(o[0].outputs[0].text[:80]))
