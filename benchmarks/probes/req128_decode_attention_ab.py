"""The C++ paged-attention kernel's decode rows at two commits, alternated in one process: this
checkout's jaxinfer/kernels/cpu/csrc/paged_decode.cc against the same file at REV (built and registered
under its own FFI target). 32 decode rows over all 30 layers of SmolLM2's shapes (3 KV heads x 3
query heads, head dim 64, bfloat16 pages of 16 tokens), pages spread over 4 pools of 1,537
blocks in rotation (cold, as in a served step) or every row on the same pages (hot: the
kernel's compute alone). Median of 7 alternated rounds of 20 calls.

Usage: decode_attention_ab.py REV [CONTEXT ...]   (default contexts 281 and 600)
The results in benchmarks/results/2026-12-03-cpu2-128-requests/probes/ came with req128_split_order_decode_rows.patch applied (`git apply`) and REV
e19e3f2: the patch's loop against the kernel before it. The patch was not kept (README.md).
"""
import logging
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxinfer.kernels.cpu import attention as native_attention
from jaxinfer.kernels.cpu import build as native_build  # noqa: E402

REV = sys.argv[1]
CONTEXTS = [int(c) for c in sys.argv[2:]] or [281, 600]
R, K, G, H, bs, NB, L, NC = 32, 3, 3, 64, 16, 1537, 30, 4

assert native_attention.available()
variant = native_attention.SOURCE.parent / "_probe_before.cc"
variant.write_text(subprocess.check_output(["git", "show", f"{REV}:jaxinfer/kernels/cpu/csrc/paged_decode.cc"], cwd=ROOT, text=True))
try:
    why = native_build.register(variant, f"kernel at {REV}", "JAXINFER_NATIVE_DECODE",
                                {"probe_before": "JaxinferPagedDecode"}, logging.getLogger("probe"))
finally:
    variant.unlink()
assert why is None, why
TARGETS = {REV: "probe_before", "this checkout": native_attention.TARGET}

make = jax.jit(lambda key: jax.random.randint(key, (L, NB, bs, K, H), 0x3C00, 0x3F80).astype(jnp.uint16))
caches = [(make(jax.random.PRNGKey(2 * i)), make(jax.random.PRNGKey(2 * i + 1))) for i in range(NC)]
rng = np.random.default_rng(0)
q = jnp.asarray(rng.standard_normal((R, K, G, H)), jnp.float32) * 0.125


def all_layers(target):
    out = (jax.ShapeDtypeStruct((R, K, G), jnp.float32),) * 2 + (jax.ShapeDtypeStruct((R, K, G, H), jnp.float32),)
    call = jax.ffi.ffi_call(target, out)

    def run(q, kc, vc, t, c, p):
        ls = []
        for layer in range(L):
            m, l, acc = call(q, kc, vc, jnp.int32(layer), t, c, p, jnp.int32(0))
            ls.append(l)
            q = q + 1e-3 * acc
        return q, jnp.stack(ls)
    return jax.jit(run)


fns = {name: all_layers(t) for name, t in TARGETS.items()}
print(f"jax {jax.__version__}; before = {REV}", flush=True)
for ctx_mean in CONTEXTS:
    W = (ctx_mean + 96) // bs + 1
    ctx = jnp.asarray(rng.integers(ctx_mean - 80, ctx_mean + 80, R), jnp.int32)
    pos = ctx - 1
    spread = jnp.asarray(rng.permutation(NB - 1)[: R * W].reshape(R, W) + 1, jnp.int32)
    hot = jnp.asarray(np.tile(np.arange(1, W + 1), (R, 1)), jnp.int32)
    for label, tables in (("spread", spread), ("hot", hot)):
        outs = {name: [np.asarray(x) for x in f(q, *caches[0], tables, ctx, pos)] for name, f in fns.items()}
        (a_q, a_l), (b_q, b_l) = outs.values()
        diff = max(float(np.max(np.abs(a_q - b_q))), float(np.max(np.abs(a_l - b_l) / np.abs(a_l))))
        times = {name: [] for name in fns}
        for _ in range(7):
            for name, f in fns.items():
                t0 = time.perf_counter()
                for i in range(20):
                    out = f(q, *caches[i % NC if label == "spread" else 0], tables, ctx, pos)
                jax.block_until_ready(out)
                times[name].append((time.perf_counter() - t0) / 20 * 1e3)
        kv_gb = int(np.sum(np.asarray(ctx))) * L * 2 * K * H * 2 / 1e9
        cells = "; ".join(f"{name} {np.median(t):.2f} ms ({kv_gb / np.median(t) * 1e3:.1f} GB/s of K/V)"
                          for name, t in times.items())
        print(f"context ~{ctx_mean}, pages {label}: {cells}; largest difference {diff:.1e}", flush=True)
