"""Prefill rate with the attention kernel's AMX loop on and off, alternated in one process
(the kernel reads JAXINFER_NATIVE_AMX per call; the AMX products stay as loaded): 16 prompts x
512 tokens, max_tokens=1, token budget 512. Usage: prefill_ab.py [rounds]."""
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from jaxinfer import LLM, SamplingParams  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
llm = LLM(str(ROOT / "weights/smollm2-135m-instruct"), max_model_len=1024, max_num_seqs=32, max_num_batched_tokens=512,
          num_blocks=1200, use_tqdm=False, enable_prefix_caching=False, warmup=False)
prompts = [[(i * 7 + j) % 40000 + 100 for j in range(512)] for i in range(16)]
llm.generate(prompts, sp, use_tqdm=False)
rates = {"1": [], "0": []}
for _ in range(rounds):
    for amx in ("1", "0"):
        os.environ["JAXINFER_NATIVE_AMX"] = amx
        t = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        rates[amx].append(16 * 512 / (time.perf_counter() - t))
for amx, r in rates.items():
    print(f"attention AMX {'on ' if amx == '1' else 'off'}: median {statistics.median(r):.0f} prompt tok/s "
          f"(runs: {', '.join(f'{x:.0f}' for x in r)})")
