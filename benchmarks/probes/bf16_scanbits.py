import jax, jax.numpy as jnp, numpy as np, re, sys, time
L,D,F=30,576,1536
dt=jnp.bfloat16
rs=np.random.RandomState(0)
w1=jnp.asarray(rs.standard_normal((L,D,F))*0.02,dt); w2=jnp.asarray(rs.standard_normal((L,F,D))*0.02,dt)
x=jnp.asarray(rs.standard_normal((32,D)),jnp.float32)
def mk(bits):
    def body(h, ws):
        a,b=ws
        if bits: a,b=jax.lax.bitcast_convert_type(a,dt),jax.lax.bitcast_convert_type(b,dt)
        y=jax.lax.dot_general(h.astype(dt),a,(((1,),(0,)),((),())),preferred_element_type=jnp.float32)
        return h+jax.lax.dot_general(jax.nn.silu(y).astype(dt),b,(((1,),(0,)),((),())),preferred_element_type=jnp.float32), None
    return jax.jit(lambda x,w1,w2: jax.lax.scan(body,x,(w1,w2))[0])
u1=jax.lax.bitcast_convert_type(w1,jnp.uint16); u2=jax.lax.bitcast_convert_type(w2,jnp.uint16)
fa=mk(False); fb=mk(True)
txt=fb.lower(x,u1,u2).compile().as_text()
print([l.strip()[:150] for l in txt.splitlines() if "f32[30" in l])
ra=fa(x,w1,w2); rb=fb(x,u1,u2); print("maxdiff", float(jnp.max(jnp.abs(ra-rb))))
for name,f,args in (("bf16",fa,(x,w1,w2)),("bits",fb,(x,u1,u2)))*2:
    ts=[]
    for _ in range(10):
        t=time.perf_counter(); f(*args).block_until_ready(); ts.append(time.perf_counter()-t)
    print(name, f"{np.median(ts)*1e3:.1f} ms")
