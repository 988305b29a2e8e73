"""Lone-stream decode step through the engine: LLM() with the defaults, a 128-token prompt, 128
greedy tokens, three times; prints the median `LLMEngine.step` time of each. Run with
``JAXINFER_UNROLL_MAX_TOKENS`` and `native_amx.MIN_ROWS` set by the caller (README). `MIN_ROWS`
(the fewest rows a product took on AMX) existed at bf8836d and b91556a, then went: every row
count takes the packed weights when they are passed."""
import time, sys, statistics as st
from jaxinfer import LLM
from jaxinfer.sampling_params import SamplingParams
llm = LLM()
eng = llm.engine if hasattr(llm,'engine') else llm._engine
prompt = list(range(1000, 1128))
sp = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
for rep in range(3):
    eng.add_request(f"r{rep}", prompt, sp) if hasattr(eng,'add_request') else None
    times=[]
    while eng.has_unfinished_requests():
        t=time.perf_counter(); eng.step(); times.append(time.perf_counter()-t)
    print(rep, len(times), 'median step ms', round(st.median(times[2:])*1e3,2), 'first', round(times[0]*1e3,1))
