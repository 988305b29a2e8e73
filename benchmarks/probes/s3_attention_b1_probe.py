"""Scratch probe (2026-12-01, kept with its results): the XLA path's decode attention (B1) alone,
SmolLM2 shapes, 30 layers chained over one carried cache, in variants.

    python attention_b1_probe.py einsum+gather_only+compute_only+headmajor 32,64,640 8,64,640
    GB=8 GPI=8 python attention_b1_probe.py einsum 32,64,640     # GROUP_BLOCKS, GROUPS_PER_ITER

Arguments: variants joined by '+', then cases R,W,ctx (rows, table width in blocks, context).
maxdiff lines are not a correctness check (the outputs are scaled by 1e-3 into a residual).
"""
import sys, time
import numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from jaxinfer import attention as A
import os
import jaxinfer.runner.batch as B, jaxinfer.layers.attention.xla_work_plan as XW
GROUP_BLOCKS = int(os.environ.get("GB", "4")); B.GROUP_BLOCKS = XW.GROUP_BLOCKS = GROUP_BLOCKS
B.GROUPS_PER_ITER = int(os.environ.get("GPI", "32"))
from jaxinfer.runner.batch import groups_per_iter

L, K, G, H, bs = 30, 3, 3, 64, 16
from jaxinfer.layers.step_metadata import AttentionMetadata
from jaxinfer.layers.attention.xla_work_plan import plan_xla_work

def case(R, W, ctx, NB=2600):
    rng = np.random.default_rng(0)
    kc = jnp.asarray(rng.standard_normal((L, NB, bs, K, H), dtype=np.float32))
    vc = jnp.asarray(rng.standard_normal((L, NB, bs, K, H), dtype=np.float32))
    tables = np.zeros((R, W), np.int32)
    perm = rng.permutation(np.arange(1, NB))
    nb = -(-(ctx + 1) // bs)
    for r in range(R):
        tables[r, :nb] = perm[r * nb: (r + 1) * nb]
    meta = AttentionMetadata(positions=jnp.asarray(np.full(R, ctx, np.int32)),
        slot_mapping=jnp.asarray(np.zeros(R, np.int32)), block_tables=jnp.asarray(tables),
        query_start_loc=jnp.asarray(np.arange(R + 1, dtype=np.int32)), kv_lens=jnp.asarray(np.full(R, ctx + 1, np.int32)),
        num_seqs=jnp.asarray(np.int32(R)), logits_indices=jnp.asarray(np.arange(R, dtype=np.int32)))
    q = jnp.asarray(rng.standard_normal((R, K * G, H), dtype=np.float32))
    kn = jnp.asarray(rng.standard_normal((R, K, H), dtype=np.float32))
    return kc, vc, meta, q, kn

def ein_qk(q, k): return jnp.einsum("pkgh,pskh->pkgs", q, k)
def ein_pv(p, v): return jnp.einsum("pkgs,pskh->pkgh", p, v)
def red_qk(q, k): return (q[:, None, :, :, :] * k[:, :, :, None, :]).sum(-1).transpose(0, 2, 3, 1)  # [p,s,k,g] -> pkgs
def red_pv(p, v): return (p.transpose(0, 3, 1, 2)[..., None] * v[:, :, :, None, :]).sum(1)  # [p,s,k,g,h] sum s
def red_qk2(q, k): return (q[:, None, :, :, :] * k[:, :, :, None, :]).sum(-1)  # [p,s,k,g]
def tr_qk(q, k): return jnp.einsum("pkgh,pkhs->pkgs", q, k.transpose(0, 2, 3, 1))
def tr_pv(p, v): return jnp.einsum("pkgs,pksh->pkgh", p, v.transpose(0, 2, 1, 3))

def group_context(qk, pv):
    def f(qg, k_cache, v_cache, layer, meta, plan):
        T, K_, G_, H_ = qg.shape
        R, W = meta.block_tables.shape
        c, P = GROUP_BLOCKS, groups_per_iter(R)
        span = c * bs
        tables = jnp.pad(meta.block_tables, ((0, 1), (0, -W % c)))
        last = jnp.minimum(plan.row_last, T - 1)
        q = jnp.concatenate([qg[last], jnp.zeros((1, K_, G_, H_), qg.dtype)])
        ctx_len = jnp.concatenate([plan.row_ctx_len, jnp.zeros((1,), jnp.int32)])
        segs = dict(num_segments=R + 1, indices_are_sorted=True)
        def body(j, carry):
            m, l, acc = carry
            rows = jax.lax.dynamic_slice_in_dim(plan.group_row, j * P, P)
            grp = jax.lax.dynamic_slice_in_dim(plan.group_index, j * P, P)
            blocks = tables[rows[:, None], grp[:, None] * c + jnp.arange(c)]
            k = A.gather_pages(k_cache, layer, blocks).reshape(P, span, K_, H_)
            v = A.gather_pages(v_cache, layer, blocks).reshape(P, span, K_, H_)
            s = qk(q[rows], k)
            pos = grp[:, None] * span + jnp.arange(span)
            valid = pos < ctx_len[rows][:, None]
            s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
            m_new = jnp.maximum(m, jax.ops.segment_max(s.max(-1), rows, **segs))
            safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
            p = jnp.exp(s - safe[rows][..., None])
            scale = jnp.where(jnp.isfinite(m), jnp.exp(m - safe), 0.0)
            o = pv(p, v)
            return (m_new, l * scale + jax.ops.segment_sum(p.sum(-1), rows, **segs),
                    acc * scale[..., None] + jax.ops.segment_sum(o, rows, **segs))
        init = (jnp.full((R + 1, K_, G_), -jnp.inf), jnp.zeros((R + 1, K_, G_)), jnp.zeros((R + 1, K_, G_, H_)))
        m, l, a = jax.lax.fori_loop(0, (plan.num_groups + P - 1) // P, body, init)
        return a[:R] / l[:R][..., None]
    return f

def chain(gc):
    def run(q, kn, kc, vc, meta):
        plan = plan_xla_work(meta, bs)
        out = q
        for l in range(L):
            qg = out.reshape(-1, K, G, H) * 0.125
            out = out + gc(qg, kc, vc, jnp.int32(l), meta, plan).reshape(out.shape) * 1e-3
        return out
    return jax.jit(run)

fns = {"einsum": chain(group_context(ein_qk, ein_pv)), "reduce": chain(group_context(red_qk, red_pv)),
       "transposed": chain(group_context(tr_qk, tr_pv)), "red_qk_ein_pv": chain(group_context(red_qk, ein_pv)),
       "ein_qk_red_pv": chain(group_context(ein_qk, red_pv))}

def gather_only():
    def f(qg, k_cache, v_cache, layer, meta, plan):
        T, K_, G_, H_ = qg.shape
        R, W = meta.block_tables.shape
        c, P = GROUP_BLOCKS, groups_per_iter(R)
        span = c * bs
        tables = jnp.pad(meta.block_tables, ((0, 1), (0, -W % c)))
        def body(j, acc):
            rows = jax.lax.dynamic_slice_in_dim(plan.group_row, j * P, P)
            grp = jax.lax.dynamic_slice_in_dim(plan.group_index, j * P, P)
            blocks = tables[rows[:, None], grp[:, None] * c + jnp.arange(c)]
            k = A.gather_pages(k_cache, layer, blocks).reshape(P, span, K_, H_)
            v = A.gather_pages(v_cache, layer, blocks).reshape(P, span, K_, H_)
            return acc + k.sum(1)[:, :, None, :].sum(0) + v.sum(1)[:, :, None, :].sum(0)
        a = jax.lax.fori_loop(0, (plan.num_groups + P - 1) // P, body, jnp.zeros((K_, 1, H_)))
        return jnp.broadcast_to(a[None], (R, K_, G_, H_))
    return f

def compute_only(qk, pv):
    def f(qg, k_cache, v_cache, layer, meta, plan):
        T, K_, G_, H_ = qg.shape
        R, W = meta.block_tables.shape
        c, P = GROUP_BLOCKS, groups_per_iter(R)
        span = c * bs
        kk = k_cache[layer, 1:P * c + 1].reshape(P, span, K_, H_)
        vv = v_cache[layer, 1:P * c + 1].reshape(P, span, K_, H_)
        last = jnp.minimum(plan.row_last, T - 1)
        q = jnp.concatenate([qg[last], jnp.zeros((1, K_, G_, H_), qg.dtype)])
        ctx_len = jnp.concatenate([plan.row_ctx_len, jnp.zeros((1,), jnp.int32)])
        segs = dict(num_segments=R + 1, indices_are_sorted=True)
        def body(j, carry):
            m, l, acc = carry
            rows = jax.lax.dynamic_slice_in_dim(plan.group_row, j * P, P)
            grp = jax.lax.dynamic_slice_in_dim(plan.group_index, j * P, P)
            k = kk * (j + 1).astype(jnp.float32); v = vv
            s = qk(q[rows], k)
            pos = grp[:, None] * span + jnp.arange(span)
            valid = pos < ctx_len[rows][:, None]
            s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
            m_new = jnp.maximum(m, jax.ops.segment_max(s.max(-1), rows, **segs))
            safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
            p = jnp.exp(s - safe[rows][..., None])
            scale = jnp.where(jnp.isfinite(m), jnp.exp(m - safe), 0.0)
            o = pv(p, v)
            return (m_new, l * scale + jax.ops.segment_sum(p.sum(-1), rows, **segs),
                    acc * scale[..., None] + jax.ops.segment_sum(o, rows, **segs))
        init = (jnp.full((R + 1, K_, G_), -jnp.inf), jnp.zeros((R + 1, K_, G_)), jnp.zeros((R + 1, K_, G_, H_)))
        m, l, a = jax.lax.fori_loop(0, (plan.num_groups + P - 1) // P, body, init)
        return a[:R] / l[:R][..., None]
    return f

def rounds(qk, pv):
    """iteration j reads group j of every row (no segment ops); trip count = max groups."""
    def f(qg, k_cache, v_cache, layer, meta, plan):
        T, K_, G_, H_ = qg.shape
        R, W = meta.block_tables.shape
        c = GROUP_BLOCKS
        span = c * bs
        tables = jnp.pad(meta.block_tables, ((0, 0), (0, -W % c)))
        last = jnp.minimum(plan.row_last, T - 1)
        q = qg[last]
        ctx_len = jnp.where(plan.row_last < T, plan.row_ctx_len, 0)
        n_iter = (ctx_len.max() + span - 1) // span
        def body(j, carry):
            m, l, acc = carry
            blocks = jax.lax.dynamic_slice_in_dim(tables, j * c, c, axis=1)
            k = A.gather_pages(k_cache, layer, blocks).reshape(R, span, K_, H_)
            v = A.gather_pages(v_cache, layer, blocks).reshape(R, span, K_, H_)
            s = qk(q, k)
            pos = j * span + jnp.arange(span)
            s = jnp.where((pos[None, :] < ctx_len[:, None])[:, None, None, :], s, -jnp.inf)
            m_new = jnp.maximum(m, s.max(-1))
            safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
            p = jnp.exp(s - safe[..., None])
            scale = jnp.where(jnp.isfinite(m), jnp.exp(m - safe), 0.0)
            return (m_new, l * scale + p.sum(-1), acc * scale[..., None] + pv(p, v))
        init = (jnp.full((R, K_, G_), -jnp.inf), jnp.zeros((R, K_, G_)), jnp.zeros((R, K_, G_, H_)))
        m, l, a = jax.lax.fori_loop(0, n_iter, body, init)
        return a / l[..., None]
    return f

fns.update({"gather_only": chain(gather_only()), "compute_only": chain(compute_only(ein_qk, ein_pv)),
            "rounds": chain(rounds(ein_qk, ein_pv))})

def allheads_group_context():
    def f(qg, k_cache, v_cache, layer, meta, plan):
        T, K_, G_, H_ = qg.shape
        N = K_ * G_
        R, W = meta.block_tables.shape
        c, P = GROUP_BLOCKS, groups_per_iter(R)
        span = c * bs
        onehot = (jnp.arange(N)[:, None] // G_ == jnp.arange(K_)[None, :]).astype(jnp.float32)  # [N, K]
        tables = jnp.pad(meta.block_tables, ((0, 1), (0, -W % c)))
        last = jnp.minimum(plan.row_last, T - 1)
        q = jnp.concatenate([qg[last], jnp.zeros((1, K_, G_, H_), qg.dtype)]).reshape(R + 1, N, H_)
        ctx_len = jnp.concatenate([plan.row_ctx_len, jnp.zeros((1,), jnp.int32)])
        segs = dict(num_segments=R + 1, indices_are_sorted=True)
        def body(j, carry):
            m, l, acc = carry
            rows = jax.lax.dynamic_slice_in_dim(plan.group_row, j * P, P)
            grp = jax.lax.dynamic_slice_in_dim(plan.group_index, j * P, P)
            blocks = tables[rows[:, None], grp[:, None] * c + jnp.arange(c)]
            k = A.gather_pages(k_cache, layer, blocks).reshape(P, span * K_, H_)
            v = A.gather_pages(v_cache, layer, blocks).reshape(P, span * K_, H_)
            sf = jnp.einsum("pnh,pth->pnt", q[rows], k).reshape(P, N, span, K_)
            s = (sf * onehot[None, :, None, :]).sum(-1)  # [P, N, span]
            pos = grp[:, None] * span + jnp.arange(span)
            valid = pos < ctx_len[rows][:, None]
            s = jnp.where(valid[:, None, :], s, -jnp.inf)
            m_new = jnp.maximum(m, jax.ops.segment_max(s.max(-1), rows, **segs))
            safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
            p = jnp.exp(s - safe[rows][..., None])
            scale = jnp.where(jnp.isfinite(m), jnp.exp(m - safe), 0.0)
            pf = (p[..., None] * onehot[None, :, None, :]).reshape(P, N, span * K_)
            o = jnp.einsum("pnt,pth->pnh", pf, v)
            return (m_new, l * scale + jax.ops.segment_sum(p.sum(-1), rows, **segs),
                    acc * scale[..., None] + jax.ops.segment_sum(o, rows, **segs))
        init = (jnp.full((R + 1, N), -jnp.inf), jnp.zeros((R + 1, N)), jnp.zeros((R + 1, N, H_)))
        m, l, a = jax.lax.fori_loop(0, (plan.num_groups + P - 1) // P, body, init)
        return (a[:R] / l[:R][..., None]).reshape(R, K_, G_, H_)
    return f
fns["allheads"] = chain(allheads_group_context())

def headmajor_group_context():
    """cache [L, NB, K, bs, H]: batch dots over (p, c, k) with no transpose of the pages."""
    def f(qg, k_cache, v_cache, layer, meta, plan):
        T, K_, G_, H_ = qg.shape
        R, W = meta.block_tables.shape
        c, P = GROUP_BLOCKS, groups_per_iter(R)
        span = c * bs
        tables = jnp.pad(meta.block_tables, ((0, 1), (0, -W % c)))
        last = jnp.minimum(plan.row_last, T - 1)
        q = jnp.concatenate([qg[last], jnp.zeros((1, K_, G_, H_), qg.dtype)])
        ctx_len = jnp.concatenate([plan.row_ctx_len, jnp.zeros((1,), jnp.int32)])
        segs = dict(num_segments=R + 1, indices_are_sorted=True)
        def body(j, carry):
            m, l, acc = carry
            rows = jax.lax.dynamic_slice_in_dim(plan.group_row, j * P, P)
            grp = jax.lax.dynamic_slice_in_dim(plan.group_index, j * P, P)
            blocks = tables[rows[:, None], grp[:, None] * c + jnp.arange(c)]
            k = k_cache.at[layer, blocks].get(mode="promise_in_bounds")  # [P, c, K, bs, H]
            v = v_cache.at[layer, blocks].get(mode="promise_in_bounds")
            qb = jnp.broadcast_to(q[rows][:, None], (P, c, K_, G_, H_))
            s = jax.lax.dot_general(qb, k, (((4,), (4,)), ((0, 1, 2), (0, 1, 2))))  # [P, c, K, G, bs]
            pos = (grp[:, None] * c + jnp.arange(c))[:, :, None] * bs + jnp.arange(bs)  # [P, c, bs]
            valid = pos < ctx_len[rows][:, None, None]
            s = jnp.where(valid[:, :, None, None, :], s, -jnp.inf)
            smax = s.max((1, 4))  # [P, K, G]
            m_new = jnp.maximum(m, jax.ops.segment_max(smax, rows, **segs))
            safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
            p = jnp.exp(s - safe[rows][:, None, :, :, None])
            scale = jnp.where(jnp.isfinite(m), jnp.exp(m - safe), 0.0)
            o = jax.lax.dot_general(p, v, (((4,), (3,)), ((0, 1, 2), (0, 1, 2)))).sum(1)  # [P, K, G, H]
            return (m_new, l * scale + jax.ops.segment_sum(p.sum((1, 4)), rows, **segs),
                    acc * scale[..., None] + jax.ops.segment_sum(o, rows, **segs))
        init = (jnp.full((R + 1, K_, G_), -jnp.inf), jnp.zeros((R + 1, K_, G_)), jnp.zeros((R + 1, K_, G_, H_)))
        m, l, a = jax.lax.fori_loop(0, (plan.num_groups + P - 1) // P, body, init)
        return a[:R] / l[:R][..., None]
    return f
fns["headmajor"] = chain(headmajor_group_context())

which = sys.argv[1].split("+")
for cs in sys.argv[2:]:
    R, W, ctx = map(int, cs.split(","))
    kc, vc, meta, q, kn = case(R, W, ctx)
    kcT, vcT = kc.transpose(0, 1, 3, 2, 4), vc.transpose(0, 1, 3, 2, 4)
    cache = lambda n: (kcT, vcT) if n == 'headmajor' else (kc, vc)
    ref = None
    for n in which:
        t = time.perf_counter(); o = fns[n](q, kn, *cache(n), meta).block_until_ready()
        print(f"R={R} ctx={ctx} {n} compile {time.perf_counter()-t:.1f}s", flush=True)
        if ref is None: ref = o
        else: print("   maxdiff", float(jnp.abs(o - ref).max()), flush=True)
    times = {n: [] for n in which}
    for _ in range(7):
        for n in which:
            t = time.perf_counter(); fns[n](q, kn, *cache(n), meta).block_until_ready(); times[n].append((time.perf_counter() - t) * 1e3)
    import resource
    for n in which:
        r0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter()
        for _ in range(3): fns[n](q, kn, *cache(n), meta).block_until_ready()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        print(f'{n} cpu/wall {((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)) / (time.perf_counter() - t):.2f}')
    for n, v in times.items():
        print(f"R={R} ctx={ctx} {n:16s} median {np.median(v):8.2f} ms min {np.min(v):8.2f} (real KV {R*ctx*K*H*8*L/1e6:.0f} MB)", flush=True)
