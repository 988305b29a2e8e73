"""Decode-only steps at row counts that do not fill their bucket, padded rows multiplied or not
(two engines in one process, alternated). Usage: rows_decode.py N1 N2 ..."""
import statistics, sys, time
from padding_padded_engine import build  # benchmarks/probes
from jaxinfer import SamplingParams

engines = {"padded": build(True), "real": build(False)}
sp = SamplingParams(max_tokens=3000, ignore_eos=True, temperature=0.0)
added = 0
for n in map(int, sys.argv[1:]):
    for e in engines.values():
        for i in range(added, n):
            e.add_request(f"r{i}", [1000 + (7 * i + j) % 3000 for j in range(160)], sp)
        for _ in range(4): e.step()
    added = n
    t = {k: [] for k in engines}
    for _ in range(15):
        for k, e in engines.items():
            t0 = time.perf_counter(); e.step(); t[k].append((time.perf_counter() - t0) * 1e3)
    print(f"{n} rows: " + "  ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in t.items()), flush=True)
