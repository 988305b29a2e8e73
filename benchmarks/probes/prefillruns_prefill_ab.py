"""Prefill rate with this checkout's attention kernel against REV's (default 6949f94), two engines in
one process (each traced with its own FFI target; everything else this checkout's), alternated: 16
prompts x 512 tokens, max_tokens=1, token budget 512, 5 rounds. Usage: prefill_ab.py [REV]."""
import statistics, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from jaxinfer import LLM, SamplingParams
from jaxinfer.kernels.cpu import attention as native_attention
import prefillruns_kernel_variant as kernel_variant  # noqa: E402  (benchmarks/probes)
assert native_attention.available()
rev = sys.argv[1] if len(sys.argv) > 1 else "6949f94"
old_target = kernel_variant.register_at(rev)
sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
prompts = [[(i * 7 + j) % 40000 + 100 for j in range(512)] for i in range(16)]
llms = {}
main = native_attention.TARGET
for name, t in [("new", main), (rev, old_target)]:
    native_attention.TARGET = t
    llms[name] = LLM(str(ROOT / "weights/smollm2-135m-instruct"), max_model_len=1024, max_num_seqs=32, max_num_batched_tokens=512,
                     num_blocks=1200, use_tqdm=False, enable_prefix_caching=False, warmup=False)
    llms[name].generate(prompts, sp, use_tqdm=False)
native_attention.TARGET = main
rates = {n: [] for n in llms}
for _ in range(5):
    for n, llm in llms.items():
        t = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        rates[n].append(16 * 512 / (time.perf_counter() - t))
for n, r in rates.items():
    print(f"{n}: median {statistics.median(r):.0f} prompt tok/s (runs: {', '.join(f'{x:.0f}' for x in r)})")
