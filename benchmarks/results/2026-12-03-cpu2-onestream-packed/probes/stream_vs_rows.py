"""At bf8836d: one- and two-row products of 30 layers and the head, `native_gemv`'s row-major loops
(`old`) against the AMX kernel's stream over the packed weights (`new`), alternated in one
process. Usage: python stream_vs_rows.py M"""
import time, statistics as st, jax, jax.numpy as jnp, numpy as np, sys
from jaxinfer import native_gemv as g, native_amx as a
assert g.available() and a.available()
D, F, KV, V, L = 576, 1536, 192, 49152, 30
M = int(sys.argv[1]) if len(sys.argv)>1 else 1
rng = np.random.default_rng(0)
def w(*s): return jnp.asarray((rng.standard_normal(s)*0.02).astype(np.float32)).astype(jnp.bfloat16)
W = dict(q=w(L,D,D),k=w(L,D,KV),v=w(L,D,KV),o=w(L,D,D),gate=w(L,D,F),up=w(L,D,F),down=w(L,F,D))
P = {n: jnp.asarray(a.pack(W[n])) for n in W if n not in ('gate','up')}
P['gu'] = jnp.asarray(a.pack_gated(W['gate'], W['up']))
emb = w(V, D); embP = jnp.asarray(a.pack(emb.T[None]))
@jax.jit
def old(x):
    for l in range(L):
        q=g.matmul_kn(x,W['q'][l]); k=g.matmul_kn(x,W['k'][l]); v=g.matmul_kn(x,W['v'][l])
        x = x + g.matmul_kn(q,W['o'][l]) + k[:, :1]+v[:, :1]
        gg=g.matmul_kn(x,W['gate'][l]); h = jax.nn.silu(gg) * g.matmul_kn(x,W['up'][l])
        x = x + g.matmul_kn(h,W['down'][l])
    return g.matmul_nk(x, emb)
@jax.jit
def new(x):
    for l in range(L):
        q=a.matmul(x,P['q'],l); k=a.matmul(x,P['k'],l); v=a.matmul(x,P['v'],l)
        x = x + a.matmul(q,P['o'],l) + k[:, :1]+v[:, :1]
        h = a.gated_matmul(x,P['gu'],l,"silu")
        x = x + a.matmul(h,P['down'],l)
    return a.matmul(x, embP, 0)
x = jnp.ones((M,D), jnp.float32)*0.1
print('maxdiff', float(jnp.abs(old(x)-new(x)).max()), float(jnp.abs(old(x)).max()))
res={'old':[], 'new':[]}
for i in range(40):
    for name,f in (('old',old),('new',new)) if i%2 else (('new',new),('old',old)):
        t=time.perf_counter(); f(x).block_until_ready(); res[name].append(time.perf_counter()-t)
for n,v in res.items(): print(M, n, round(st.median(v)*1e3,2),'ms')
