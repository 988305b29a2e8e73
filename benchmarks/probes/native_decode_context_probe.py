"""Scratch probe (2026-12-02): the decode rows' context part of attention alone, 30 layers in a
scanned step that writes each layer's K/V into a carried, donated cache (as the model does):
the jnp B1 loop (`attention._group_context`) against the C++ kernel
(`native_attention.decode_context`). R rows (env R, 32) of context CTX (env CTX, 640) on random
pages of a 1,600-block pool; SmolLM2's K=3, G=3, H=64. ZERO=1 gives every row 1 token (overhead).

    python decode_context_probe.py
"""
import os, sys, time, json
import numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))

L, NB, bs, K, G, H = 30, 1600, 16, 3, 3, 64
R = int(os.environ.get("R", 32)); CTX = int(os.environ.get("CTX", 640))
W = -(-CTX // bs) + 1
from jaxinfer.kernels.cpu import attention as native_attention
print("native:", native_attention.unavailable_reason())
def ffi_attn(x, kc, vc, layer, tables, ctx, qpos, window):
    return native_attention.decode_context(x, kc, vc, layer, tables, ctx, qpos, window)

def make_step(fn):
    def step(kc, vc, q, tables, ctx, slots):
        def body(carry, layer):
            kc, vc, x = carry
            kc = kc.at[layer, slots // bs, slots % bs].set(x[:, 0])
            vc = vc.at[layer, slots // bs, slots % bs].set(x[:, 0])
            m, l, a = fn(x, kc, vc, layer, tables, ctx, ctx, jnp.int32(0))
            x = x + (a / l[..., None])
            return (kc, vc, x), None
        (kc, vc, x), _ = jax.lax.scan(body, (kc, vc, q), jnp.arange(L, dtype=jnp.int32))
        return kc, vc, x
    return jax.jit(step, donate_argnums=(0, 1))

def xla_b1(x, kc, vc, layer, tables, ctx, qpos, window):
    from jaxinfer.layers.step_metadata import AttentionMetadata
    from jaxinfer import attention
    from jaxinfer.layers.attention import xla_work_plan
    T = x.shape[0]
    meta = AttentionMetadata(positions=ctx, slot_mapping=tables[:, W - 1] * bs, query_start_loc=jnp.arange(T + 1, dtype=jnp.int32),
                             kv_lens=ctx + 1, block_tables=tables, logits_indices=jnp.arange(T, dtype=jnp.int32), num_seqs=jnp.int32(T))
    plan = xla_work_plan.plan_xla_work(meta, bs)
    return attention._group_context(x, kc, vc, layer, meta, plan)

rng = np.random.default_rng(0)
kc = jnp.asarray(rng.standard_normal((L, NB, bs, K, H), np.float32))
vc = jnp.asarray(rng.standard_normal((L, NB, bs, K, H), np.float32))
q = jnp.asarray(rng.standard_normal((R, K, G, H), np.float32) * 0.1)
tables = jnp.asarray(rng.permutation(NB - 1)[: R * W].reshape(R, W) + 1, jnp.int32)
ctx = jnp.full((R,), CTX, jnp.int32) - jnp.arange(R, dtype=jnp.int32) * 3
if os.environ.get("ZERO"): ctx = ctx * 0 + 1
slots = tables[:, W - 1] * bs

m, l, a = jax.jit(ffi_attn)(q, kc, vc, jnp.int32(3), tables, ctx, ctx, jnp.int32(0))
kcn = np.asarray(kc)[3][np.asarray(tables)].reshape(R, W * bs, K, H)
vcn = np.asarray(vc)[3][np.asarray(tables)].reshape(R, W * bs, K, H)
s = np.einsum("rkgh,rskh->rkgs", np.asarray(q), kcn)
s = np.where((np.arange(W * bs)[None] < np.asarray(ctx)[:, None])[:, None, None], s, -np.inf)
p = np.exp(s - s.max(-1, keepdims=True)); ref = np.einsum("rkgs,rskh->rkgh", p / p.sum(-1, keepdims=True), vcn)
print("max err ffi", float(np.abs(np.asarray(a) / np.asarray(l)[..., None] - ref).max()), flush=True)
try:
    m2, l2, a2 = jax.jit(xla_b1)(q, kc, vc, jnp.int32(3), tables, ctx, ctx, jnp.int32(0))
    print("max err xla", float(np.abs(np.asarray(a2) / np.asarray(l2)[..., None] - ref).max()), flush=True)
    fns = (("xla_b1", xla_b1), ("ffi", ffi_attn))
except Exception as e:
    print("xla b1 failed", repr(e)[:300]); fns = (("ffi", ffi_attn),)
res = {}
for name, fn in fns:
    f = make_step(fn)
    out = f(kc, vc, q, tables, ctx, slots); jax.block_until_ready(out); kc, vc = out[0], out[1]
    ts = []
    for _ in range(7):
        t0 = time.perf_counter(); out = f(kc, vc, q, tables, ctx, slots); jax.block_until_ready(out); ts.append(time.perf_counter() - t0)
        kc, vc = out[0], out[1]
    res[name] = sorted(ts)[3] * 1e3
    print(name, "median step ms", round(res[name], 1), [round(t * 1e3, 1) for t in ts], flush=True)
print(json.dumps(dict(R=R, CTX=CTX, **res)))
