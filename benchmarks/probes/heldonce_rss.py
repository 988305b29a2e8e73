"""RSS of LLM() with the defaults after warm-up, then the step time of a lone stream; argv[1] 'keep' keeps the stacked kernels."""
import sys, time, statistics as st, psutil
from jaxinfer import LLM
from jaxinfer.kernels.cpu import amx as native_amx
from jaxinfer.sampling_params import SamplingParams
if sys.argv[1] == "keep":
    native_amx.without_packed = lambda params, packed: params
llm = LLM(use_tqdm=False)
rss = psutil.Process().memory_info().rss
eng = llm.engine
eng.add_request("r", list(range(1000, 1128)), SamplingParams(max_tokens=96, temperature=0.0, ignore_eos=True))
times = []
while eng.has_unfinished_requests():
    t = time.perf_counter(); eng.step(); times.append(time.perf_counter() - t)
print(sys.argv[1], "rss GB", round(rss / 1e9, 3), "after stream", round(psutil.Process().memory_info().rss / 1e9, 3),
      "step ms", round(st.median(times[2:]) * 1e3, 2))
