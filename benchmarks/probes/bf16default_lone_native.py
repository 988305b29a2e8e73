"""Lone-stream (and two-stream) decode, bfloat16: C++ few-row products on against off, one process."""
import sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import numpy as np
from jaxinfer import LLM, SamplingParams
from jaxinfer.runner import model_runner
orig = model_runner.use_native_products
llms = {}
for native in (True, False):
    model_runner.use_native_products = (lambda *a: orig(*a)) if native else (lambda *a: False)
    llms[native] = LLM(str(__import__("pathlib").Path(__file__).resolve().parents[2] / "weights/smollm2-135m-instruct"), dtype="bfloat16", max_model_len=512, max_num_seqs=4,
                       max_num_batched_tokens=256, num_blocks=200, use_tqdm=False, enable_prefix_caching=False)
    print("native_products", llms[native].engine.runner.native_products, flush=True)
sp = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
prompt = list(range(100, 228))
res = {}
for rep in range(3):
    for native in (True, False):
        for n in (1, 2):
            t = time.perf_counter()
            outs = llms[native].generate([prompt] * n, sp, use_tqdm=False)
            dt = time.perf_counter() - t
            res.setdefault((native, n), []).append(dt / 128 * 1e3)
            if rep == 0 and n == 1:
                res.setdefault(("tok", native), outs[0].outputs[0].token_ids)
for k, v in res.items():
    if k[0] != "tok":
        print(f"native={k[0]} streams={k[1]}: ms per decode step (incl. prefill share) {['%.1f' % x for x in v]}")
print("same tokens:", res[("tok", True)] == res[("tok", False)])
