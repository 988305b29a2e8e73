import sys, time, os
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from jaxinfer import LLM, SamplingParams
sp = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
llm = LLM(str(__import__("pathlib").Path(__file__).resolve().parents[2] / "weights/smollm2-135m-instruct"), max_model_len=1024, max_num_seqs=32, max_num_batched_tokens=512,
          num_blocks=1200, use_tqdm=False, enable_prefix_caching=False, warmup=False)
prompts = [[(i * 7 + j) % 40000 + 100 for j in range(512)] for i in range(16)]
llm.generate(prompts, sp, use_tqdm=False)
open("/tmp/prefill_ready", "w").write("1")
t = time.perf_counter()
while time.perf_counter() - t < 25:
    llm.generate(prompts, sp, use_tqdm=False)
