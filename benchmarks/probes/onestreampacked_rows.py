"""onestreampacked_ab2.py's products (q/k/v separate) at 1, 2, 3, 4, 8, 16 and 32 rows, rotated in one process."""
import time, statistics as st, jax, jax.numpy as jnp, numpy as np
exec(open(__file__.rsplit('/', 1)[0] + '/onestreampacked_ab2.py').read().split("sep = jax.jit")[0].replace("M = 1\n",""))
f = jax.jit(lambda x: body(x, False))
xs = {M: jnp.ones((M,576), jnp.float32)*0.1 for M in (1,2,3,4,8,16,32)}
res = {M: [] for M in xs}
for M in xs: f(xs[M]).block_until_ready()
for i in range(20):
    for M in xs:
        t=time.perf_counter(); f(xs[M]).block_until_ready(); res[M].append(time.perf_counter()-t)
for M,v in res.items(): print(M, round(st.median(v)*1e3,2),'ms')
