"""Prefill throughput (bf16 default) at different per-step token budgets: 16 prompts x 512 tokens, max_tokens=1."""
import sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from jaxinfer import LLM, SamplingParams
sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
for budget in [int(a) for a in sys.argv[1:]]:
    llm = LLM(str(__import__("pathlib").Path(__file__).resolve().parents[2] / "weights/smollm2-135m-instruct"), max_model_len=1024, max_num_seqs=32, max_num_batched_tokens=budget,
              num_blocks=1200, use_tqdm=False, enable_prefix_caching=False, warmup=False)
    prompts = [[(i * 7 + j) % 40000 + 100 for j in range(512)] for i in range(16)]
    llm.generate(prompts[:4], sp, use_tqdm=False)  # compile the buckets used
    llm.generate(prompts, sp, use_tqdm=False)
    t = time.perf_counter(); llm.generate(prompts, sp, use_tqdm=False); dt = time.perf_counter() - t
    print(f"budget {budget}: {16*512/dt:.0f} prompt tok/s ({dt:.2f} s for 8192 tokens)", flush=True)
    del llm
