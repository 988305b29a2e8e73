import time, sys, jax, jax.numpy as jnp, numpy as np
L=30; D=576; F=1536
def make(dt):
    rs=np.random.RandomState(0)
    return [jnp.asarray(rs.standard_normal((D,F)).astype(np.float32)*0.02, dt) for _ in range(L)] + \
           [jnp.asarray(rs.standard_normal((F,D)).astype(np.float32)*0.02, dt) for _ in range(L)]
def f(x, ws, xdt):
    h=x
    for i in range(L):
        a=jax.lax.dot_general(h.astype(xdt), ws[i], (((1,),(0,)),((),())), preferred_element_type=jnp.float32)
        h=h+jax.lax.dot_general(jax.nn.silu(a).astype(xdt), ws[L+i], (((1,),(0,)),((),())), preferred_element_type=jnp.float32)
    return h
res={}
for M in tuple(int(a) for a in sys.argv[1:]):
  for name,wdt,xdt in (("f32",jnp.float32,jnp.float32),("bf16xbf16",jnp.bfloat16,jnp.bfloat16),):
    ws=make(wdt); x=jnp.ones((M,D),jnp.float32)
    g=jax.jit(lambda x,ws: f(x,ws,xdt))
    try:
        g(x,ws).block_until_ready()
    except Exception as e:
        print(name, "fail", e); continue
    ts=[]
    for _ in range(15):
        t=time.perf_counter(); g(x,ws).block_until_ready(); ts.append(time.perf_counter()-t)
    bytes_=sum(w.nbytes for w in ws)
    print(f"M={M} {name}: median {np.median(ts)*1e3:.1f} ms min {min(ts)*1e3:.1f} ms  weights {bytes_/1e6:.0f} MB  GFLOP/s {2*M*D*F*2*L/np.median(ts)/1e9:.0f}", flush=True)
