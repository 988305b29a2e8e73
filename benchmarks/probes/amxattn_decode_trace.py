"""Where a decode step's time goes at R rows: R requests with P-token prompts decode; 10 steps are
timed, then 10 more traced with jax.profiler, and the trace's events are summed by name (the
custom calls are ffi_call.N: the attention kernel is the one called once per layer per step, 30
per step; the AMX products are the ones called 30 times per step each as well, the LM head once).
Usage: decode_trace.py R [P]; prints the median step and the 25 largest event totals."""
import collections
import glob
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from jax.profiler import ProfileData

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from jaxinfer import LLM, SamplingParams  # noqa: E402


def print_trace_totals(step, n=10):
    """Runs ``step()`` n times under jax.profiler and prints the 25 largest event totals per step
    (custom calls, fusions and while loops, summed by name)."""
    out = tempfile.mkdtemp()
    jax.profiler.start_trace(out)
    for _ in range(n):
        step()
    jax.profiler.stop_trace()
    total, count = collections.Counter(), collections.Counter()
    for plane in ProfileData.from_file(glob.glob(f"{out}/plugins/profile/*/*.xplane.pb")[0]).planes:
        for line in plane.lines:
            for ev in line.events:
                if ev.name.startswith("ffi_call") or "fusion" in ev.name or ev.name.startswith("while"):
                    total[ev.name] += ev.duration_ns
                    count[ev.name] += 1
    for name, ns in total.most_common(25):
        print(f"  {ns / (n * 1e6):7.2f} ms per step  {count[name] / n:5.1f} calls per step  {name}")


def main():
    rows = int(sys.argv[1])
    prompt = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    llm = LLM(str(ROOT / "weights/smollm2-135m-instruct"), use_tqdm=False, enable_prefix_caching=False)
    e = llm.engine
    rs = np.random.RandomState(0)
    sp = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    for i in range(rows):
        e.add_request(f"d{i}", rs.randint(256, 16000, prompt).tolist(), sp)
    while any(r.num_output_tokens == 0 for r in e.requests.values()):
        e.step()
    times = []
    for _ in range(15):
        t = time.perf_counter()
        e.step()
        times.append(time.perf_counter() - t)
    print(f"{rows} rows, context ~{prompt + 10}: median step {1e3 * statistics.median(times[5:]):.1f} ms (untraced)")
    print_trace_totals(e.step)


if __name__ == "__main__":
    main()
