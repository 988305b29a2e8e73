"""SmolLM2-135M's 30 layers of products plus the tied LM head at M rows through the AMX kernel, q/k/v
as three products (`sep`) or one fused [576, 960] product (`fused`), alternated; `body` is reused
by onestreampacked_rows.py and onestreampacked_variants.py."""
import time, statistics as st, jax, jax.numpy as jnp, numpy as np, sys
from jaxinfer.kernels.cpu import amx as a
assert a.available()
D, F, KV, V, L = 576, 1536, 192, 49152, 30
M = 1
rng = np.random.default_rng(0)
def w(*s): return jnp.asarray((rng.standard_normal(s)*0.02).astype(np.float32)).astype(jnp.bfloat16)
W = dict(q=w(L,D,D),k=w(L,D,KV),v=w(L,D,KV),o=w(L,D,D),gate=w(L,D,F),up=w(L,D,F),down=w(L,F,D))
P = {n: jnp.asarray(a.pack(W[n])) for n in W if n not in ('gate','up')}
P['qkv'] = jnp.asarray(a.pack(jnp.concatenate([W['q'],W['k'],W['v']],axis=2)))
P['gu'] = jnp.asarray(a.pack_gated(W['gate'], W['up']))
emb = w(V, D); embP = jnp.asarray(a.pack(emb.T[None]))
def body(x, fused):
    for l in range(L):
        if fused:
            qkv=a.matmul(x,P['qkv'],l); q,k,v=qkv[:, :D], qkv[:, D:D+KV], qkv[:, D+KV:]
        else:
            q=a.matmul(x,P['q'],l); k=a.matmul(x,P['k'],l); v=a.matmul(x,P['v'],l)
        x = x + a.matmul(q,P['o'],l) + k[:, :1]+v[:, :1]
        h = a.gated_matmul(x,P['gu'],l,"silu")
        x = x + a.matmul(h,P['down'],l)
    return a.matmul(x, embP, 0)
sep = jax.jit(lambda x: body(x, False)); fus = jax.jit(lambda x: body(x, True))
x = jnp.ones((M,D), jnp.float32)*0.1
print('maxdiff', float(jnp.abs(sep(x)-fus(x)).max()))
res={'sep':[], 'fused':[]}
for i in range(60):
    for name,f in (('sep',sep),('fused',fus)) if i%2 else (('fused',fus),('sep',sep)):
        t=time.perf_counter(); f(x).block_until_ready(); res[name].append(time.perf_counter()-t)
for n,v in res.items(): print(M, n, round(st.median(v)*1e3,2),'ms')
