"""The attention kernel alone on a 512-token prompt's chunk (SmolLM2-135M's shapes, bfloat16 pages,
30 layers, AMX on): REV's paged_decode.cc (default 6949f94, runs of 16 queries) beside this
checkout's with one `constexpr int64_t` replaced by each value given, alternated in one process,
median of 9 rounds. Usage: kernel_ab.py NAME v1 v2 ... (e.g. kMaxAmxRun 16 32 64); T, NB, REV env."""
import os, re, statistics, sys, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import jax, jax.numpy as jnp, numpy as np
from jaxinfer.kernels.cpu import attention as native_attention
import prefillruns_kernel_variant as kernel_variant  # noqa: E402  (benchmarks/probes)
assert native_attention.available()
name, values = sys.argv[1], sys.argv[2:]
REV = os.environ.get("REV", "6949f94")
src = native_attention.SOURCE.read_text()
pat = rf"constexpr int64_t {name} = \d+;"
assert re.search(pat, src)
targets = {}
old_target = kernel_variant.register_at(REV)
targets[REV] = old_target
for val in values:
    targets[val] = kernel_variant.register_source(re.sub(pat, f"constexpr int64_t {name} = {val};", src), f"{name}{val}")
T, K, G, H, L, NB = int(os.environ.get("T", 512)), 3, 3, 64, 30, int(os.environ.get("NB", 64))
rng = np.random.default_rng(0)
bits = lambda x: jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.bfloat16), jnp.uint16)
q = jnp.asarray(rng.standard_normal((T, K, G, H)) * 0.125, jnp.float32)
kc, vc = bits(rng.standard_normal((L, NB, 16, K, H))), bits(rng.standard_normal((L, NB, 16, K, H)))
tables = jnp.tile(jnp.asarray(rng.permutation(NB)[:(T + 15) // 16], jnp.int32), (T, 1))
pos = jnp.arange(T, dtype=jnp.int32)
runs = {}
for n, t in targets.items():
    native_attention.TARGET = t
    runs[n] = jax.jit(lambda q, kc, vc: [native_attention.paged_context(q, kc, vc, layer, tables, pos + 1, pos, None) for layer in range(L)])
    jax.block_until_ready(runs[n](q, kc, vc))
times = {n: [] for n in runs}
for _ in range(9):
    for n, f in runs.items():
        t0 = time.perf_counter(); jax.block_until_ready(f(q, kc, vc)); times[n].append((time.perf_counter() - t0) * 1e3)
print(f"{T}-token chunk, 30 layers, {name}: " + " | ".join(f"{n} {statistics.median(ts):.1f} ms" for n, ts in times.items()))
