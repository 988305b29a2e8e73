"""Padding rows multiplied or not: two engines in one process, one built with the products'
`rows` forced to the bucket's T (and the LM head's to R) as before, alternated step by step.
Steps: 6 decoding rows (T = 8); plus one request with 256 cached and 48 new prompt tokens
(54 tokens, T = 64); 136 new (142, T = 144); a cold 304-token prompt (310, T = 328); and 33
decoding rows (T = 40)."""
import statistics, time
from padding_padded_engine import build  # benchmarks/probes
from jaxinfer import SamplingParams

engines = {"padded rows multiplied": build(True), "real rows only": build(False)}
sp = SamplingParams(max_tokens=1000, ignore_eos=True, temperature=0)
short = SamplingParams(max_tokens=1, temperature=0)
base = [2500 + (j % 300) for j in range(256)]
for e in engines.values():
    for i in range(6):
        e.add_request(f"d{i}", [2000 + i] * 40, sp)
    e.add_request("warm", base, short)
    for _ in range(8): e.step()

def timed(e):
    t0 = time.perf_counter(); e.step(); return (time.perf_counter() - t0) * 1e3

res = {n: {"decode6": [], "mixed54": [], "mixed142": [], "cold310": []} for n in engines}
for k in range(10):
    for n, e in engines.items():
        res[n]["decode6"].append(timed(e))
        for name, extra in (("mixed54", 48), ("mixed142", 136)):
            e.add_request(f"{name}{k}", base + [3000 + k] * extra, short)
            res[n][name].append(timed(e)); e.step()
        e.add_request(f"cold{k}", [3500 + 3 * k + j for j in range(304)], short)
        res[n]["cold310"].append(timed(e)); e.step()
for n, e in engines.items():  # 33 decoding rows
    for i in range(27):
        e.add_request(f"m{i}", [2100 + i] * 40, sp)
    for _ in range(6): e.step()
    res[n]["decode33"] = []
for k in range(10):
    for n, e in engines.items():
        res[n]["decode33"].append(timed(e))
for n in engines:
    print(f"{n:24s} " + "  ".join(f"{s} {statistics.median(v):6.1f} ms" for s, v in res[n].items()))
