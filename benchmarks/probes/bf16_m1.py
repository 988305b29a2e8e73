import jax, jax.numpy as jnp, numpy as np, time
L,D,F=30,576,1536
dt=jnp.bfloat16
rs=np.random.RandomState(0)
W1=[jnp.asarray(rs.standard_normal((D,F))*0.02,dt) for _ in range(L)]; W2=[jnp.asarray(rs.standard_normal((F,D))*0.02,dt) for _ in range(L)]
x=jnp.asarray(rs.standard_normal((1,D)),jnp.float32)
def d_plain(h,w): return jax.lax.dot_general(h.astype(dt),w,(((1,),(0,)),((),())),preferred_element_type=jnp.float32)
def d_pad2(h,w):
    h2=jnp.concatenate([h,h]).astype(dt)
    return jax.lax.dot_general(h2,w,(((1,),(0,)),((),())),preferred_element_type=jnp.float32)[:1]
def d_wlhs(h,w): return jax.lax.dot_general(w,h.astype(dt),(((0,),(1,)),((),())),preferred_element_type=jnp.float32).T
def d_f32acc(h,w): return jnp.sum(h.astype(dt).astype(jnp.float32).reshape(-1,1)*w.astype(jnp.float32),axis=0,keepdims=True)
def mk(d):
    def f(x,W1,W2):
        h=x
        for i in range(L): h=h+d(jax.nn.silu(d(h,W1[i])),W2[i])
        return h
    return jax.jit(f)
fs={n:mk(d) for n,d in (("plain",d_plain),("pad2",d_pad2),("wlhs",d_wlhs),("mulsum",d_f32acc))}
ref=fs["plain"](x,W1,W2)
for n,f in fs.items(): print(n, float(jnp.max(jnp.abs(f(x,W1,W2)-ref))))
for r in range(2):
  for n,f in fs.items():
    ts=[]
    for _ in range(10):
        t=time.perf_counter(); f(x,W1,W2).block_until_ready(); ts.append(time.perf_counter()-t)
    print(n, f"{np.median(ts)*1e3:.1f} ms")
