"""Where a prefill step's time goes: N prompts of P tokens (max_tokens 1, so every step is one
512-token chunk of one prompt, with the server's default budget), the default engine of
``LLM`` (bfloat16 on a CPU with AVX-512 BF16). 6 steps are timed, then 6 more traced with
jax.profiler, and the trace's events are summed by name (custom calls are ffi_call.N: the
attention kernel and each AMX product are called 30 times per step, once per layer; `while`
events contain the layer scan's others, so totals overlap).
Usage: prefill_trace.py [P=512]; prints the median step, prompt tok/s and the 25 largest totals."""
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from jaxinfer import LLM, SamplingParams  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from amxattn_decode_trace import print_trace_totals  # noqa: E402

prompt = int(sys.argv[1]) if len(sys.argv) > 1 else 512
llm = LLM(str(ROOT / "weights/smollm2-135m-instruct"), use_tqdm=False, enable_prefix_caching=False)
e = llm.engine
rs = np.random.RandomState(0)
sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
for i in range(16):
    e.add_request(f"p{i}", rs.randint(256, 16000, prompt).tolist(), sp)
for _ in range(2):  # warm
    e.step()
times = []
for _ in range(6):
    t = time.perf_counter()
    e.step()
    times.append(time.perf_counter() - t)
step = statistics.median(times)
print(f"prompts of {prompt}: median step {1e3 * step:.1f} ms (untraced), {prompt / step:.0f} prompt tok/s")
print_trace_totals(e.step, 6)
