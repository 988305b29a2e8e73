"""32 decoding rows: the step in the T = 40 bucket (default ladder) against a ladder with a
32 rung, two engines alternated in one process. Usage: rung32.py [ROWS] [CTX]"""
import statistics, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))  # the repository root
from jaxinfer import LLM, SamplingParams
from jaxinfer.runner import buckets
ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 32
CTX = int(sys.argv[2]) if len(sys.argv) > 2 else 300
orig = buckets.BucketLadders.token_ladder
def engine(extra):
    llm = LLM(max_num_seqs=32, use_tqdm=False)
    class With(buckets.BucketLadders):
        token_ladder = property(lambda self: sorted(set(orig.fget(self)) | set(extra)))
    object.__setattr__(llm.engine.layout.ladders, "__class__", With)
    return llm.engine
engines = {"default (T=40)": engine([]), "with a 32 rung": engine([32])}
sp = SamplingParams(max_tokens=2000, ignore_eos=True, temperature=0)
for name, e in engines.items():
    print(name, e.layout.ladders.token_ladder if hasattr(e, "layout") else "")
    for i in range(ROWS):
        e.add_request(f"r{i}", [1000 + (i * 7 + j) % 3000 for j in range(CTX)], sp)
    while any(r.num_computed_tokens < CTX for r in e.requests.values()):
        e.step()
    for _ in range(3): e.step()
times = {n: [] for n in engines}
for _ in range(40):
    for n, e in engines.items():
        t0 = time.perf_counter(); e.step(); times[n].append((time.perf_counter() - t0) * 1e3)
print(f"{ROWS} rows, context ~{CTX}: " + " | ".join(f"{n}: {statistics.median(v):.1f} ms" for n, v in times.items()))
