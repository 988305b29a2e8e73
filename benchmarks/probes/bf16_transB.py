import jax, jax.numpy as jnp, numpy as np, time
L,D,F=30,576,1536
dt=jnp.bfloat16
rs=np.random.RandomState(0)
W1=[jnp.asarray(rs.standard_normal((D,F))*0.02,dt) for _ in range(L)]; W2=[jnp.asarray(rs.standard_normal((F,D))*0.02,dt) for _ in range(L)]
T1=[w.T.copy() for w in W1]; T2=[w.T.copy() for w in W2]
def kn(h,w): return jax.lax.dot_general(h.astype(dt),w,(((1,),(0,)),((),())),preferred_element_type=jnp.float32)
def nk(h,w): return jax.lax.dot_general(h.astype(dt),w,(((1,),(1,)),((),())),preferred_element_type=jnp.float32)
def mk(d):
    def f(x,A,B):
        h=x
        for i in range(L): h=h+d(jax.nn.silu(d(h,A[i])),B[i])
        return h
    return jax.jit(f)
fk, fn = mk(kn), mk(nk)
for M in (32, 512):
    x=jnp.asarray(rs.standard_normal((M,D)),jnp.float32)
    print("maxdiff", float(jnp.max(jnp.abs(fk(x,W1,W2)-fn(x,T1,T2)))))
    for r in range(2):
        for name,f,a in (("[K,N]",fk,(x,W1,W2)),("[N,K]",fn,(x,T1,T2))):
            ts=[]
            for _ in range(10):
                t=time.perf_counter(); f(*a).block_until_ready(); ts.append(time.perf_counter()-t)
            print(M, name, f"{np.median(ts)*1e3:.1f} ms")
