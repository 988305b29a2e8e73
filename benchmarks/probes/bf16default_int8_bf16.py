"""int8 weights under dtype bfloat16 vs float32 on CPU: oracle agreement and a 32-row decode timing."""
import json, sys, time
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from jaxinfer import LLM, SamplingParams
recs = json.load(open(ROOT / "tests/data/smollm2_greedy.json"))["results"]
for dtype in sys.argv[1:]:
    for q in (None, "int8"):
        llm = LLM(str(ROOT / "weights/smollm2-135m-instruct"), dtype=dtype, quantization=q, max_model_len=512,
                  max_num_seqs=32, max_num_batched_tokens=256, num_blocks=1200, warmup=False, use_tqdm=False,
                  enable_prefix_caching=False)
        outs = llm.generate([r["prompt_ids"] for r in recs], SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
        agree = sum(o.outputs[0].token_ids == r["generated_ids"][:16] for o, r in zip(outs, recs))
        p = [list(range(10, 138))] * 32
        sp = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
        llm.generate(p, sp, use_tqdm=False)  # compile
        t = time.perf_counter(); llm.generate(p, sp, use_tqdm=False); dt = time.perf_counter() - t
        print(f"dtype={dtype} quant={q}: oracle {agree}/9, 32x(128 in, 64 out) {dt:.1f} s = {32*64/dt:.1f} out tok/s", flush=True)
        del llm
