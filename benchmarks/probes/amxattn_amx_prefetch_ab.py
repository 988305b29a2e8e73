"""The AMX product kernel with its weight prefetch at several distances (kAhead = 0: off), alternated
in one process: each variant is this checkout's jaxinfer/kernels/cpu/csrc/amx_gemm.cc with kAhead replaced,
built and registered under its own FFI target. 30 scanned products M x K x N per weight stack,
8 stacks in rotation (413 MB for 576 x 1536: more than this CPU's L3, so weights come from DRAM,
as in the model's step). Median of 6 alternated rounds of 8 calls. Usage: amx_prefetch_ab.py [kAhead ...].
CONSTANT=kAheadA varies the activation-row prefetch instead (any `constexpr int64_t` of the file);
ROWS=1,3,128,512 replaces the row counts (default 8,32,512)."""
import logging
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from jaxinfer.kernels.cpu import amx as native_amx
from jaxinfer.kernels.cpu import build as native_build  # noqa: E402

assert native_amx.available(), "needs AMX"
L, NC = 30, 8
source = native_amx.SOURCE.read_text()
targets = {}
CONSTANT = os.environ.get("CONSTANT", "kAhead")
ROWS = [int(m) for m in os.environ.get("ROWS", "8,32,512").split(",")]
pattern = rf"constexpr int64_t {CONSTANT} = \d+;"
assert re.search(pattern, source), f"no {CONSTANT} in {native_amx.SOURCE}"
for ahead in [int(a) for a in sys.argv[1:]] or [0, 2, 4, 8]:
    name = f"probe_{CONSTANT}{ahead}"
    variant = native_amx.SOURCE.parent / f"_{name}.cc"
    variant.write_text(re.sub(pattern, f"constexpr int64_t {CONSTANT} = {ahead};", source))
    try:
        why = native_build.register(variant, f"probe {CONSTANT}={ahead}", "JAXINFER_NATIVE_AMX",
                                    {name: "JaxinferAmxGemm"}, logging.getLogger("probe"))
    finally:
        variant.unlink()
    assert why is None, why
    targets[f"ahead {ahead}"] = name


def scanned(target):
    def run(x, packed):
        n = native_amx.packed_shape_kn(packed)[1]
        call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32))

        def body(c, layer):
            return c + 1e-3 * call(c.astype(jnp.bfloat16), packed, layer).sum(1, keepdims=True), None
        return lax.scan(body, x, jnp.arange(L, dtype=jnp.int32))[0]
    return jax.jit(run)


runs = {name: scanned(t) for name, t in targets.items()}
rng = np.random.default_rng(0)
for K, N in [(576, 1536), (1536, 576)]:
    stacks = [jnp.asarray(native_amx.pack(jnp.asarray(rng.standard_normal((L, K, N)) * 0.02, jnp.bfloat16)))
              for _ in range(NC)]
    for M in ROWS:
        x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
        outs = {name: [np.asarray(f(x, s)) for s in stacks] for name, f in runs.items()}
        first = next(iter(outs.values()))
        assert all(np.array_equal(a, b) for o in outs.values() for a, b in zip(o, first)), "variants differ"
        times = {name: [] for name in runs}
        for _ in range(6):
            for name, f in runs.items():
                for s in stacks:
                    t0 = time.perf_counter()
                    f(x, s).block_until_ready()
                    times[name].append(time.perf_counter() - t0)
        print(f"{L} x ({M} x {K} x {N}): " + " | ".join(f"{n} {1e3 * np.median(t):.2f} ms" for n, t in times.items()),
              flush=True)
