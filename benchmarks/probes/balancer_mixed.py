"""Step times in one process: 6 decoding rows alone, and with one request whose prompt is
~300 tokens of which all but the last ~50 are in the prefix cache."""
import sys, time, statistics as st
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))  # the repository root
from jaxinfer import LLM, SamplingParams
llm = LLM(max_num_seqs=32)
e = llm.engine
sp = SamplingParams(max_tokens=400, ignore_eos=True, temperature=0)
for i in range(6):
    e.add_request(f"d{i}", [2000 + i] * 40, sp)
for _ in range(5):
    e.step()
def t_step():
    t0 = time.perf_counter(); e.step(); return (time.perf_counter() - t0) * 1e3
base = [2500 + (j % 300) for j in range(256)]
short = SamplingParams(max_tokens=1, temperature=0)
e.add_request("warm", base, short)
for _ in range(3): e.step()
for _ in range(3): e.step()
res = {"decode": [], "mixed48": [], "mixed136": [], "cold304": []}
for k in range(8):
    res["decode"] += [t_step() for _ in range(3)]
    for name, extra in (("mixed48", 48), ("mixed136", 136)):
        e.add_request(f"{name}{k}", base + [3000 + k] * extra, short)
        res[name].append(t_step())
        for _ in range(2): e.step()
    e.add_request(f"cold{k}", [3500 + k + j for j in range(304)], short)
    res["cold304"].append(t_step())
    for _ in range(2): e.step()
print({n: round(st.median(v), 1) for n, v in res.items()})
import collections
def phases(fn):
    before = dict(e.stats.phase_seconds); fn(); after = e.stats.phase_seconds
    return {k: round((after[k] - before.get(k, 0)) * 1e3, 1) for k in after}
print("decode", phases(e.step))
e.add_request("px", base + [3100] * 48, short)
print("mixed48", phases(e.step))
for _ in range(2): e.step()
e.add_request("py", base + [3200] * 48, short)
import jax
jax.profiler.start_trace("/tmp/cl/probe/trace48")
e.step()
jax.profiler.stop_trace()
