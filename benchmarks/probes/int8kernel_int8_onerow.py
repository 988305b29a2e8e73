"""SmolLM2-135M with --quantization int8 (dtype auto: bfloat16 here): three greedy completions and
the median one-row decode step (128-token prompt, 100 steps). JAXINFER_NATIVE_INT8=0 runs XLA's
dequantize-then-dot instead of the int8 kernel."""
import os, sys, time, statistics; sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import numpy as np
from jaxinfer import LLM, SamplingParams
llm = LLM(str(__import__("pathlib").Path(__file__).resolve().parents[2] / "weights/smollm2-135m-instruct"), use_tqdm=False, enable_prefix_caching=False, quantization="int8",
          dtype=os.environ.get("DT", "auto"))
r = llm.engine.runner if hasattr(llm.engine, "runner") else None
print("packed:", r is not None and r.amx is not None and list(r.amx["layers"].get("attn", {})))
prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24))
for o in outs: print(repr(o.outputs[0].text))
e = llm.engine
sp = SamplingParams(temperature=0.0, max_tokens=3000, ignore_eos=True)
e.add_request("x", list(range(1000, 1128)), sp)
for _ in range(10): e.step()
ts = []
for _ in range(100):
    t = time.perf_counter(); e.step(); ts.append(time.perf_counter() - t)
print(f"one-row step median {1e3*statistics.median(ts):.2f} ms")
