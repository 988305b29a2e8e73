"""The 32-row decode step of four engines in one process, timed in alternation: with and without
the AMX weight prefetch (kAhead 4 against 0: the 0 variant is this checkout's amx_gemm.cc rebuilt
under its own FFI target) and with and without the C++ argmax. Each engine decodes 32 sequences
with 400-token prompts; rounds of 8 steps per engine, median step per engine. With "prefill": the
prompt rate instead (8 prompts of 512 tokens, max_tokens 1, per round). Usage: step_ab.py [rounds] [prefill]."""
import itertools
import logging
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from jaxinfer import LLM, SamplingParams
from jaxinfer.runner import model_runner
from jaxinfer.kernels.cpu import amx as native_amx
from jaxinfer.kernels.cpu import build as native_build  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
prefill = "prefill" in sys.argv[2:]
variant = native_amx.SOURCE.parent / "_probe_ahead0.cc"
variant.write_text(re.sub(r"constexpr int64_t kAhead = \d+;", "constexpr int64_t kAhead = 0;", native_amx.SOURCE.read_text()))
try:
    assert native_build.register(variant, "probe kAhead=0", "JAXINFER_NATIVE_AMX", {"probe_ahead0": "JaxinferAmxGemm"},
                                 logging.getLogger("probe")) is None
finally:
    variant.unlink()

sp = SamplingParams(temperature=0.0, max_tokens=2000, ignore_eos=True)
engines = {}
real_target, real_use_argmax = native_amx.TARGET, model_runner.use_native_argmax
for prefetch, argmax in itertools.product((True, False), (True, False)):
    native_amx.TARGET = real_target if prefetch else "probe_ahead0"  # read when the step is traced
    model_runner.use_native_argmax = real_use_argmax if argmax else (lambda shardings: False)
    llm = LLM(str(ROOT / "weights/smollm2-135m-instruct"), use_tqdm=False, enable_prefix_caching=False, warmup=False)
    e = llm.engine
    rs = np.random.RandomState(0)
    if prefill:
        prompts = [rs.randint(256, 16000, 512).tolist() for _ in range(8)]
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)  # compiles
        engines[(prefetch, argmax)] = (llm, prompts)
        continue
    for i in range(32):
        e.add_request(f"d{i}", rs.randint(256, 16000, 400).tolist(), sp)
    while any(r.num_output_tokens == 0 for r in e.requests.values()):
        e.step()
    for _ in range(3):
        e.step()  # compiles the 32-row bucket with this engine's targets
    engines[f"prefetch {'on ' if prefetch else 'off'}, argmax {'C++' if argmax else 'jnp'}"] = e
native_amx.TARGET, model_runner.use_native_argmax = real_target, real_use_argmax
if prefill:
    rates = {k: [] for k in engines}
    for _ in range(rounds):
        for k, (llm, prompts) in engines.items():
            t0 = time.perf_counter()
            llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
            rates[k].append(8 * 512 / (time.perf_counter() - t0))
    for (pf, am), r in rates.items():
        print(f"prefetch {'on ' if pf else 'off'}, argmax {'C++' if am else 'jnp'}: median {statistics.median(r):.0f} prompt tok/s")
    sys.exit()
times = {name: [] for name in engines}
for _ in range(rounds):
    for name, e in engines.items():
        for _ in range(8):
            t0 = time.perf_counter()
            e.step()
            times[name].append(time.perf_counter() - t0)
for name, t in times.items():
    print(f"{name}: median 32-row decode step {1e3 * statistics.median(t):.1f} ms ({len(t)} steps)")
