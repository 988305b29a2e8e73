"""Whole engine (`LLM`, server defaults), this checkout against the same engine with 6949f94's attention kernel and without
the gated MLP call (gate and up packed one by one, XLA's act * u), two engines in one process,
alternated: 32 prompts x 512 tokens submitted at once, 64 output tokens each (greedy), 3 alternated rounds. Usage: engine_ab.py [REV=6949f94] [OUT=64]."""
import statistics, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from jaxinfer import LLM, SamplingParams
from jaxinfer.kernels.cpu import amx as native_amx
from jaxinfer.kernels.cpu import attention as native_attention
import prefillruns_kernel_variant as kernel_variant  # noqa: E402  (benchmarks/probes)
assert native_attention.available() and native_amx.available()
rev = sys.argv[1] if len(sys.argv) > 1 else "6949f94"
old_target = kernel_variant.register_at(rev)
OUT = int(sys.argv[2]) if len(sys.argv) > 2 else 64
sp = SamplingParams(temperature=0.0, max_tokens=OUT, ignore_eos=True)
prompts = [[(i * 7 + j) % 40000 + 100 for j in range(512)] for i in range(32)]
main_target, gated = native_attention.TARGET, dict(native_amx.GATED_ACTS)
def configure(name):
    native_attention.TARGET = main_target if name == "new" else old_target
    native_amx.GATED_ACTS.clear()
    if name == "new":
        native_amx.GATED_ACTS.update(gated)
llms = {}
for name in ("new", rev):
    configure(name)
    llms[name] = LLM(str(ROOT / "weights/smollm2-135m-instruct"), use_tqdm=False, enable_prefix_caching=False)
    llms[name].generate(prompts[:4], sp, use_tqdm=False)
configure("new")
times = {n: [] for n in llms}
for _ in range(3):
    for n, llm in llms.items():
        t = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        times[n].append(time.perf_counter() - t)
for n, ts in times.items():
    print(f"{n}: median {statistics.median(ts):.2f} s for 32 x (512 in, {OUT} out) (runs: {', '.join(f'{x:.2f}' for x in ts)})")
