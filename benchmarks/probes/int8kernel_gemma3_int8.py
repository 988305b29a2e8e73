"""Gemma 3 270M with int8 weights through the int8 kernel and through XLA's dequantize-then-dot (the
runner's switch patched off), beside unquantized weights, under float32 and bfloat16 compute: greedy
agreement with the transformers float32 reference (tests/data/gemma3/, 8 prompts, first 16 tokens)
and the mean one-row decode step (128-token prompt, 40 steps). Usage: gemma3_int8.py WEIGHTS_DIR"""
import json, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from jaxinfer import LLM, SamplingParams
from jaxinfer.runner import model_runner
recs = json.load(open(ROOT / "tests/data/gemma3/gemma3_270m_greedy.json"))["prompts"]
native = model_runner.use_native_int8
for dtype in ("float32", "bfloat16"):
    for name, q, kernel in (("unquantized", None, True), ("int8 kernel", "int8", True), ("int8 XLA", "int8", False)):
        model_runner.use_native_int8 = native if kernel else (lambda *a: False)
        llm = LLM(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "weights/gemma3-270m"), dtype=dtype, quantization=q, max_model_len=2048, warmup=False,
                  use_tqdm=False, enable_prefix_caching=False)
        outs = llm.generate([r["prompt_ids"] for r in recs], SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
        agree = sum(o.outputs[0].token_ids == r["generated_ids"][:16] for o, r in zip(outs, recs))
        first = [next((i for i, (a, b) in enumerate(zip(o.outputs[0].token_ids, r["generated_ids"])) if a != b), 16) for o, r in zip(outs, recs)]
        e = llm.engine
        e.add_request("x", list(range(1000, 1128)), SamplingParams(temperature=0.0, max_tokens=300, ignore_eos=True))
        for _ in range(5): e.step()
        t = time.perf_counter()
        for _ in range(40): e.step()
        print(f"gemma3 dtype={dtype} {name}: {agree}/{len(recs)} (first differing {first}); one-row step {(time.perf_counter()-t)/40*1e3:.1f} ms", flush=True)
        e.abort_request("x")
        del llm, e
