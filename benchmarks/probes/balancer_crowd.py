"""One of N processes sharing the CPU: decode 4 streams x 128 tokens, 3 rounds; print tok/s per round."""
import sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))  # the repository root
from jaxinfer import LLM, SamplingParams
llm = LLM(max_num_seqs=8, warmup=False)
sp = SamplingParams(max_tokens=128, ignore_eos=True, temperature=0)
prompts = [[1000 + i] * 32 for i in range(4)]
llm.generate(prompts, sp, use_tqdm=False)  # compile
open(sys.argv[1], "w").write("ready\n")
while not __import__("os").path.exists(sys.argv[2]):
    time.sleep(0.05)
for r in range(3):
    t0 = time.perf_counter(); llm.generate(prompts, sp, use_tqdm=False); dt = time.perf_counter() - t0
    print(f"round {r}: {4*128/dt:.1f} tok/s", flush=True)
