"""SmolLM2-135M with int8 weights through the int8 kernel (jaxinfer/kernels/cpu/csrc/int8_gemm.cc) and through
XLA's dequantize-then-dot (`quant.qdot`, the runner's switch patched off), beside unquantized
weights, under compute dtypes bfloat16 and float32: greedy agreement with the float32
transformers reference on the 9 oracle prompts (first 16 tokens), and offline output tok/s of
32 prompts of 128 tokens x 64 greedy tokens (one timed run after a compiling one).
Usage: int8_agreement.py DTYPE [DTYPE ...]"""
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from jaxinfer import LLM, SamplingParams
from jaxinfer.runner import model_runner  # noqa: E402

recs = json.load(open(ROOT / "tests/data/smollm2_greedy.json"))["results"]
native = model_runner.use_native_int8
for dtype in sys.argv[1:]:
    for name, q, kernel in (("unquantized", None, True), ("int8, kernel", "int8", True), ("int8, XLA", "int8", False)):
        model_runner.use_native_int8 = native if kernel else (lambda *a: False)
        llm = LLM(str(ROOT / "weights/smollm2-135m-instruct"), dtype=dtype, quantization=q, max_model_len=512,
                  max_num_seqs=32, max_num_batched_tokens=256, num_blocks=1200, warmup=False, use_tqdm=False,
                  enable_prefix_caching=False)
        outs = llm.generate([r["prompt_ids"] for r in recs], SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
        agree = sum(o.outputs[0].token_ids == r["generated_ids"][:16] for o, r in zip(outs, recs))
        first = [next((i for i, (a, b) in enumerate(zip(o.outputs[0].token_ids, r["generated_ids"])) if a != b), 16)
                 for o, r in zip(outs, recs)]
        p = [list(range(10, 138))] * 32
        sp = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
        llm.generate(p, sp, use_tqdm=False)  # compile
        t = time.perf_counter()
        llm.generate(p, sp, use_tqdm=False)
        dt = time.perf_counter() - t
        print(f"dtype={dtype} {name}: oracle {agree}/9 (first differing token {' '.join(map(str, first))}), "
              f"32x(128 in, 64 out) {dt:.1f} s = {32 * 64 / dt:.1f} out tok/s", flush=True)
        del llm
