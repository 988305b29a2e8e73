"""Scratch probe (2026-12-02): A/B of two builds of jaxinfer/kernels/cpu/csrc/paged_decode.cc on the decode
rows' context attention (B1) alone: old = the file at git revision OLD (default 4eb8521, before
the vectorized exp / AVX-512 loops / prefetch), new = this checkout's. 30 layers in a scanned step
that writes each layer's K/V into a carried, donated cache (as
benchmarks/probes/native_decode_context_probe.py), random pages of a 1,600-block pool, SmolLM2's K=3, G=3; steps alternate
old/new, 8 each. Also the largest error of each against a float64 numpy reference.
Env: R rows (32), CTX context (640), DT cache dtype (f32 | bf16), H head dim (64).

    R=32 CTX=640 DT=f32 python kernel_ab.py
"""
import ctypes, json, os, subprocess, sys, tempfile, time
from pathlib import Path
import numpy as np, jax, jax.numpy as jnp
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from jaxinfer.kernels.cpu import attention as na
OLD = os.environ.get("OLD", "4eb8521")
tmp = Path(tempfile.mkdtemp())
(tmp / "old.cc").write_bytes(subprocess.run(["git", "-C", str(REPO), "show", f"{OLD}:jaxinfer/kernels/cpu/csrc/paged_decode.cc"],
                                            check=True, capture_output=True).stdout)

inc = jax.ffi.include_dir()
def build(src, out):
    subprocess.run(["g++", *na.FLAGS, f"-I{inc}", src, "-o", out], check=True)
    lib = ctypes.cdll.LoadLibrary(out)
    return lib
for tag, src in (("old", str(tmp / "old.cc")), ("new", str(na.SOURCE))):
    lib = build(src, str(tmp / f"pd_{tag}.so"))
    jax.ffi.register_ffi_target(f"{tag}_pd", jax.ffi.pycapsule(lib.JaxinferPagedDecode), platform="cpu")

L, NB, bs, K, G, H = 30, 1600, 16, 3, 3, int(os.environ.get("H", 64))
R = int(os.environ.get("R", 32)); CTX = int(os.environ.get("CTX", 640)); DT = os.environ.get("DT", "f32")
W = -(-CTX // bs) + 1
def call(tag):
    def f(q, kc, vc, layer, tables, ctx):
        out = (jax.ShapeDtypeStruct((R, K, G), jnp.float32),) * 2 + (jax.ShapeDtypeStruct((R, K, G, H), jnp.float32),)
        return jax.ffi.ffi_call(f"{tag}_pd", out)(q, kc, vc, jnp.asarray(layer, jnp.int32), tables, ctx, ctx, jnp.int32(0))
    return f
def make_step(fn):
    def step(kc, vc, q, tables, ctx, slots):
        def body(carry, layer):
            kc, vc, x = carry
            upd = x[:, 0] if DT == "f32" else jax.lax.bitcast_convert_type(x[:, 0].astype(jnp.bfloat16), jnp.uint16)
            kc = kc.at[layer, slots // bs, slots % bs].set(upd)
            vc = vc.at[layer, slots // bs, slots % bs].set(upd)
            m, l, a = fn(x, kc, vc, layer, tables, ctx)
            return (kc, vc, x + 1e-3 * (a / l[..., None])), None
        (kc, vc, x), _ = jax.lax.scan(body, (kc, vc, q), jnp.arange(L, dtype=jnp.int32))
        return kc, vc, x
    return jax.jit(step, donate_argnums=(0, 1))
rng = np.random.default_rng(0)
kf = rng.standard_normal((L, NB, bs, K, H), np.float32); vf = rng.standard_normal((L, NB, bs, K, H), np.float32)
if DT == "bf16":
    kc = jax.lax.bitcast_convert_type(jnp.asarray(kf, jnp.bfloat16), jnp.uint16)
    vc = jax.lax.bitcast_convert_type(jnp.asarray(vf, jnp.bfloat16), jnp.uint16)
    kf = np.asarray(jnp.asarray(kf, jnp.bfloat16).astype(jnp.float32)); vf = np.asarray(jnp.asarray(vf, jnp.bfloat16).astype(jnp.float32))
else:
    kc, vc = jnp.asarray(kf), jnp.asarray(vf)
q = jnp.asarray(rng.standard_normal((R, K, G, H), np.float32) * 0.3)
tables = jnp.asarray(rng.permutation(NB - 1)[: R * W].reshape(R, W) + 1, jnp.int32)
ctx = jnp.full((R,), CTX, jnp.int32) - jnp.arange(R, dtype=jnp.int32) * 3
slots = tables[:, W - 1] * bs
kcn = kf[3][np.asarray(tables)].reshape(R, W * bs, K, H).astype(np.float64)
vcn = vf[3][np.asarray(tables)].reshape(R, W * bs, K, H).astype(np.float64)
s = np.einsum("rkgh,rskh->rkgs", np.asarray(q, np.float64), kcn)
s = np.where((np.arange(W * bs)[None] < np.asarray(ctx)[:, None])[:, None, None], s, -np.inf)
p = np.exp(s - s.max(-1, keepdims=True)); ref = np.einsum("rkgs,rskh->rkgh", p / p.sum(-1, keepdims=True), vcn)
res = {}
for tag in ("old", "new"):
    m, l, a = jax.jit(call(tag))(q, kc, vc, 3, tables, ctx)
    res[f"err_{tag}"] = float(np.abs(np.asarray(a) / np.asarray(l)[..., None] - ref).max())
steps = {tag: make_step(call(tag)) for tag in ("old", "new")}
times = {"old": [], "new": []}
for tag in ("old", "new"):
    out = steps[tag](kc, vc, q, tables, ctx, slots); jax.block_until_ready(out); kc, vc = out[0], out[1]
for rep in range(8):
    for tag in (("old", "new") if rep % 2 == 0 else ("new", "old")):
        t0 = time.perf_counter(); out = steps[tag](kc, vc, q, tables, ctx, slots); jax.block_until_ready(out)
        times[tag].append((time.perf_counter() - t0) * 1e3); kc, vc = out[0], out[1]
for tag in times:
    res[f"{tag}_ms_median"] = float(np.median(times[tag])); res[f"{tag}_ms_min"] = float(np.min(times[tag]))
print(json.dumps(dict(R=R, CTX=CTX, DT=DT, H=H, **res)))
