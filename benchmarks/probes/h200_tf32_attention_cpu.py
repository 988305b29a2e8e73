"""CPU probe of the float32 engine-check failure on the H200: does TF32 rounding in the xla
attention path alone move the logits by ~0.1?

Runs the engine's xla backend twice on the same SmolLM2-shaped random weights and prompts
(backend_check.py's), everything in XLA (native CPU kernels off, as on a GPU): once in float32,
once with every attention einsum's operands rounded to TF32 (8 exponent, 10 mantissa bits,
`lax.reduce_precision`), which is what the GPU's default float32 dot does. The dense layers are
left in float32 (on the GPU they are the same in both backends). Then compares as
backend_check.py does.

Usage: JAXINFER_NATIVE_DECODE=0 JAXINFER_NATIVE_AMX=0 JAXINFER_NATIVE_GEMV=0 \
  JAXINFER_NATIVE_ARGMAX=0 .venv/bin/python benchmarks/probes/h200_tf32_attention_cpu.py
"""
import importlib.util
import json
import pathlib
import sys
import types

import jax
import jax.numpy as jnp
from jax import lax

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
spec = importlib.util.spec_from_file_location("backend_check", ROOT / "benchmarks" / "backend_check.py")
bc = importlib.util.module_from_spec(spec)
sys.modules["backend_check"] = bc
spec.loader.exec_module(bc)

from jaxinfer import attention  # noqa: E402
from jaxinfer.config import ModelConfig  # noqa: E402
from jaxinfer.models.params import init_params  # noqa: E402


def tf32(x):
    return lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10) if x.dtype == jnp.float32 else x


def tf32_einsum(spec, *ops, **kw):
    return jnp.einsum(spec, *(tf32(o) for o in ops), **kw)


mc = ModelConfig.from_dict(json.loads((ROOT / "configs" / "smollm2-135m.json").read_text()))
params = init_params(mc, "float32", seed=0, scale=4.0)
prompts = bc.make_prompts(mc.vocab_size, 512 - 16 - 1)
runs = {}
for name in ("float32", "tf32-attention"):
    if name == "tf32-attention":
        proxy = types.SimpleNamespace(**{k: getattr(jnp, k) for k in dir(jnp) if not k.startswith("__")})
        proxy.einsum = tf32_einsum
        attention.jnp = proxy
    llm = bc.build_llm(mc, params, "xla", "float32", 512, 0)
    runs[name] = bc.run_backend(llm, prompts, 16)
    del llm
    jax.clear_caches()
result = bc.compare(runs["float32"], runs["tf32-attention"], "float32", 0.1)
for row in result["prompts"]:
    print(row)
print("max |logit diff|", max(r["max_logit_diff"] for r in result["prompts"]))
