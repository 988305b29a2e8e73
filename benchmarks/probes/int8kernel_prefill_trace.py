"""Usage: prefill_trace.py [P] (Q=int8 for int8 weights). Where a 512-token prefill step's time goes: one request with a P-token prompt, chunk = P;
the step that prefills it is timed (several fresh requests), then traced; trace events summed."""
import collections, glob, os, statistics, sys, tempfile, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import jax, numpy as np
from jax.profiler import ProfileData
from jaxinfer import LLM, SamplingParams
P = int(sys.argv[1]) if len(sys.argv) > 1 else 512
llm = LLM(str(__import__("pathlib").Path(__file__).resolve().parents[2] / "weights/smollm2-135m-instruct"), use_tqdm=False, enable_prefix_caching=False,
          quantization=os.environ.get("Q") or None)
e = llm.engine
sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
rs = np.random.RandomState(0)
def one():
    e.add_request(f"r{rs.randint(1<<30)}", rs.randint(256, 16000, P).tolist(), sp)
    t = time.perf_counter()
    while e.has_unfinished_requests(): e.step()
    return time.perf_counter() - t
for _ in range(3): one()
ts = [one() for _ in range(7)]
print(f"prompt {P}: median prefill {1e3*statistics.median(ts):.1f} ms")
out = tempfile.mkdtemp(); jax.profiler.start_trace(out)
for _ in range(3): one()
jax.profiler.stop_trace()
total, count = collections.Counter(), collections.Counter()
for plane in ProfileData.from_file(glob.glob(f"{out}/plugins/profile/*/*.xplane.pb")[0]).planes:
    for line in plane.lines:
        for ev in line.events:
            if ev.name.startswith("ffi_call") or "fusion" in ev.name or ev.name.startswith("while"):
                total[ev.name] += ev.duration_ns; count[ev.name] += 1
for name, ns in total.most_common(16):
    print(f"  {ns / 3e6:7.2f} ms per prefill  {count[name] / 3:5.1f} calls  {name}")
