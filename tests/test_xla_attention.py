"""The XLA paged-attention path against a float64 numpy reference (full causal and sliding
windows), by its jnp parts and by the C++ kernel (`jaxinfer.kernels.cpu.attention`, every token
from the pages after the step's K/V are written), on ragged steps packed
by the real `batch` code: decodes of very different context lengths (block and group
edges included), a continuing prefill chunk and a fresh prefill in one step, its work
lists derived from the metadata as the model step derives them (`jaxinfer.layers.attention.xla_work_plan`)."""
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import register_source_variant
from jaxinfer.runner import batch as B
from jaxinfer.kernels.cpu import attention as native_attention
from jaxinfer.layers.attention.base import paged_attention
from jaxinfer.layers.attention.kv_storage import gather_pages, write_kv
from jaxinfer.layers.attention.registry import get_attention_backend
from jaxinfer.layers.attention.xla import xla_paged_attention
from jaxinfer.layers.step_metadata import AttentionMetadata
from jaxinfer.runner.buckets import Bucket, BucketLadders
from jaxinfer.platform.cpu_features import host_cpu_flags
from jaxinfer.layers.step_metadata import from_arrays
from jaxinfer.layers.attention.xla_work_plan import plan_xla_work

BS, K, G, H, L = 16, 2, 3, 8, 2
LAYOUT = B.BatchLayout(BucketLadders(64, 16, 64), BS, 100, 1024, 4)


def _pack(rows, width):
    """rows: (ctx_len, new_tokens) per row -> packed arrays, block ids per row."""
    T = sum(n for _, n in rows)
    a = B._empty_arrays(Bucket(T, len(rows), width), LAYOUT, penalties=False, mask=False)
    next_block, tables, offset = 1, [], 0
    for i, (ctx, n) in enumerate(rows):
        nblocks = -(-(ctx + n) // BS)
        blocks = list(range(next_block, next_block + nblocks))
        next_block += nblocks
        tables.append(blocks)
        req = types.SimpleNamespace(num_computed_tokens=ctx, all_token_ids=[0] * (ctx + n), block_ids=blocks)
        B._fill_tokens(a, i, offset, B.Row(req, ctx, req.all_token_ids[ctx:ctx + n]), LAYOUT)
        offset += n
    a["num_seqs"][...] = len(rows)
    return a, tables, next_block


def _written(k_cache, v_cache, k_new, v_new, meta, layer=1):
    """The step's K/V written into the pages (as `paged_attention` does before attending: the
    native path reads them from there), and the values as stored, read back (float32), so the
    jnp path's fresh K/V equal what the kernel reads (bfloat16 bits, 8-bit with scales)."""
    k_cache, v_cache = (write_kv(c, jnp.int32(layer), meta.slot_mapping, x) for c, x in ((k_cache, k_new), (v_cache, v_new)))
    bs = BS
    back = lambda c: gather_pages(c, jnp.int32(layer), meta.slot_mapping // bs)[  # noqa: E731
        jnp.arange(meta.slot_mapping.shape[0]), meta.slot_mapping % bs].astype(jnp.float32)
    return k_cache, v_cache, back(k_cache), back(v_cache)


def _reference(q, k_new, v_new, k_cache, v_cache, rows, tables, layer, scale, window=None):
    out, offset, H = np.zeros_like(q), 0, q.shape[-1]
    for (ctx, n), blocks in zip(rows, tables):
        ck = np.concatenate([k_cache[layer, b] for b in blocks])[:ctx] if ctx else np.zeros((0, K, H))
        cv = np.concatenate([v_cache[layer, b] for b in blocks])[:ctx] if ctx else np.zeros((0, K, H))
        for t in range(n):
            keys = np.concatenate([ck, k_new[offset:offset + t + 1]])
            vals = np.concatenate([cv, v_new[offset:offset + t + 1]])
            if window is not None:  # keys at positions > ctx + t - window
                lo = max(0, ctx + t - window + 1)
                keys, vals = keys[lo:], vals[lo:]
            for h in range(K * G):
                s = keys[:, h // G] @ q[offset + t, h] * scale
                p = np.exp(s - s.max())
                out[offset + t, h] = p @ vals[:, h // G] / p.sum()
        offset += n
    return out


NATIVE = [False, pytest.param(True, marks=pytest.mark.skipif(not native_attention.available(),
                                                            reason=str(native_attention.unavailable_reason())))]


@pytest.mark.parametrize("rows", [
    [(1, 1), (15, 1), (16, 1), (17, 1), (63, 1), (64, 1), (65, 1), (300, 1)],
    [(200, 1), (0, 5), (40, 10), (2, 1), (0, 1)],
    [(700, 1), (300, 7), (33, 70), (0, 3)],
    [(300, 1)],  # a lone decode step: a one-token bucket, which has no B2 loop
])
@pytest.mark.parametrize("window", [None, 1, 17, 100])
@pytest.mark.parametrize("native", NATIVE, ids=["jnp", "native"])
@pytest.mark.parametrize("H", [H, 64])  # 64: the kernel's AVX-512 loops, and its tiled loops for a prefill chunk's runs
def test_ragged_step_matches_float64_reference(rows, window, native, H):
    width = max(-(-(ctx + n) // BS) for ctx, n in rows)  # the table covers the new tokens too
    width = 1 << (width - 1).bit_length()
    a, tables, nb = _pack(rows, width)
    rng = np.random.default_rng(len(rows))
    T = len(a["token_ids"])
    q = rng.standard_normal((T, K * G, H))
    k_new, v_new = rng.standard_normal((T, K, H)), rng.standard_normal((T, K, H))
    k_cache, v_cache = rng.standard_normal((L, nb, BS, K, H)), rng.standard_normal((L, nb, BS, K, H))
    meta = from_arrays(AttentionMetadata, {k: jnp.asarray(v) for k, v in a.items()})
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    kc, vc, kn, vn = _written(f32(k_cache), f32(v_cache), f32(k_new), f32(v_new), meta)
    got = xla_paged_attention(f32(q), kn, vn, kc, vc, jnp.int32(1), meta, plan_xla_work(meta, BS), H ** -0.5,
                              None if window is None else jnp.int32(window), native=native)
    want = _reference(q, k_new, v_new, k_cache, v_cache, rows, tables, 1, H ** -0.5, window)
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=1e-4)


@pytest.mark.skipif(not native_attention.available(), reason=str(native_attention.unavailable_reason()))
@pytest.mark.parametrize("window", [None, 40])
@pytest.mark.parametrize("H", [H, 64])  # 64: the kernel's AVX-512 loops, where the CPU has them
@pytest.mark.parametrize("bf16", [True, False], ids=["bf16-bits", "float32"])
def test_native_reads_bit_stored_bfloat16_pages_like_the_jnp_loop(window, H, bf16, monkeypatch):
    """A bfloat16 cache on CPU holds uint16 bits (`attention.kv_storage_dtype`): the kernel
    widens them as the jnp loop does, so both give the same attention (float32 pages too, so
    that both kinds of page go through the kernel's AVX-512 loops at H = 64). The AMX loop of
    prefill runs (bfloat16 operands) is off here: `test_amx_prefill_runs_match_the_jnp_loop`."""
    monkeypatch.setenv("JAXINFER_NATIVE_AMX", "0")  # read by the kernel per call
    rows = [(1, 1), (70, 1), (0, 1), (300, 1), (45, 6)]
    width = 32
    a, _, nb = _pack(rows, width)
    rng = np.random.default_rng(7)
    T = len(a["token_ids"])
    bits = ((lambda x: jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.bfloat16), jnp.uint16)) if bf16
            else (lambda x: jnp.asarray(x, jnp.float32)))
    k_cache, v_cache = bits(rng.standard_normal((L, nb, BS, K, H))), bits(rng.standard_normal((L, nb, BS, K, H)))
    q = jnp.asarray(rng.standard_normal((T, K * G, H)), jnp.float32)
    k_new, v_new = (jnp.asarray(rng.standard_normal((T, K, H)), jnp.float32) for _ in range(2))
    meta = from_arrays(AttentionMetadata, {k: jnp.asarray(v) for k, v in a.items()})
    win = None if window is None else jnp.int32(window)
    k_cache, v_cache, k_new, v_new = _written(k_cache, v_cache, k_new, v_new, meta)
    outs = [xla_paged_attention(q, k_new, v_new, k_cache, v_cache, jnp.int32(1), meta, plan_xla_work(meta, BS),
                                H ** -0.5, win, native=native) for native in (False, True)]
    np.testing.assert_allclose(np.asarray(outs[1]), np.asarray(outs[0]), atol=1e-5, rtol=1e-5)


AMX = pytest.mark.skipif(not (native_attention.available() and "avx512_bf16" in host_cpu_flags()),
                         reason="needs the native kernel on a CPU with AVX-512 BF16 (AMX or VDPBF16PS)")


@functools.cache
def _register_no_amx() -> str | None:
    """The kernel's VDPBF16PS loop for prefill runs (what CPUs with AVX-512 BF16 and no AMX run),
    built on an AMX CPU from a copy of the source with JAXINFER_NO_AMX defined and registered as
    a test target; None, or why not."""
    if not {"amx_tile", "amx_bf16"} <= host_cpu_flags():
        return "this CPU has no AMX: its default build is that loop"
    return register_source_variant(native_attention.SOURCE, "#define JAXINFER_NO_AMX 1\n", "no_amx",
                                   native_attention.ENV_SWITCH, {"jaxinfer_test_paged_no_amx": "JaxinferPagedDecode"})


@pytest.fixture(params=["default", "no_amx"])
def run_loop(request, monkeypatch):
    """The build whose prefill-run loop is tested: this CPU's (AMX tiles, or VDPBF16PS without
    AMX), and on an AMX CPU also the VDPBF16PS loop (`_register_no_amx`)."""
    if request.param == "no_amx":
        why = _register_no_amx()
        if why is not None:
            pytest.skip(why)
        monkeypatch.setattr(native_attention, "TARGET", "jaxinfer_test_paged_no_amx")
    return request.param


@AMX
@pytest.mark.parametrize("window", [None, 1, 17, 40])
@pytest.mark.parametrize("H", [64, 128, 256])
def test_amx_prefill_runs_match_the_float64_reference(window, H, monkeypatch, run_loop):
    """On bfloat16 pages the kernel's prefill runs (2+ consecutive queries of one sequence) go
    through its AMX loop (or its VDPBF16PS loop on a CPU without AMX: the same blocks, the
    products as VDPBF16PS loops): Q and the probabilities rounded to bfloat16, float32 sums. Against the
    float64 reference of the stored (bfloat16) keys and values, within bfloat16's rounding; a
    masked key, a wrong page or a stale value would be off by ~0.1 or more. Runs start and end
    inside pages and inside the loop's 32-key blocks and 16-query groups (70 queries: a run of 64
    and one of 6), beside decode rows (which stay on the AVX-512 loops); the loop is shown to run
    (AMX off gives other bits)."""
    rows = [(0, 40), (33, 17), (1, 1), (5, 2), (300, 1), (70, 5), (0, 1), (9, 70)]
    width = 32
    a, tables, nb = _pack(rows, width)
    rng = np.random.default_rng(H)
    T = len(a["token_ids"])
    bf16 = lambda x: jnp.asarray(x, jnp.bfloat16)  # noqa: E731
    bits = lambda x: jax.lax.bitcast_convert_type(bf16(x), jnp.uint16)  # noqa: E731
    as64 = lambda x: np.asarray(bf16(x), np.float64)  # noqa: E731
    q = rng.standard_normal((T, K * G, H))
    k_new, v_new = rng.standard_normal((T, K, H)), rng.standard_normal((T, K, H))
    k_cache, v_cache = rng.standard_normal((L, nb, BS, K, H)), rng.standard_normal((L, nb, BS, K, H))
    meta = from_arrays(AttentionMetadata, {k: jnp.asarray(v) for k, v in a.items()})
    win = None if window is None else jnp.int32(window)
    kc, vc, kn, vn = _written(bits(k_cache), bits(v_cache), jnp.asarray(k_new, jnp.float32),
                              jnp.asarray(v_new, jnp.float32), meta)
    outs = {}
    for amx in ("1", "0"):
        monkeypatch.setenv("JAXINFER_NATIVE_AMX", amx)  # read by the kernel per call
        outs[amx] = np.asarray(xla_paged_attention(jnp.asarray(q, jnp.float32), kn, vn, kc, vc, jnp.int32(1), meta,
                                                   plan_xla_work(meta, BS), H ** -0.5, win, native=True))
    want = _reference(q, np.asarray(kn, np.float64), np.asarray(vn, np.float64), as64(k_cache), as64(v_cache), rows,
                      tables, 1, H ** -0.5, window)  # the new K/V as written (rounded from float32)
    np.testing.assert_allclose(outs["1"], want, atol=1.5e-2, rtol=0)
    np.testing.assert_allclose(outs["0"], want, atol=2e-5, rtol=1e-4)
    if window != 1:  # a lone key: probability 1, exact in bfloat16 too
        assert not np.array_equal(outs["1"], outs["0"])


def test_xla_backend_refuses_a_step_without_its_work_plan():
    """The plan is the model step's to compute once; attention never derives it per layer."""
    a, _, nb = _pack([(20, 1)], 4)
    meta = from_arrays(AttentionMetadata, {k: jnp.asarray(v) for k, v in a.items()})
    q, kv = jnp.zeros((1, K * G, H)), jnp.zeros((1, K, H))
    cache = jnp.zeros((L, nb, BS, K, H))
    with pytest.raises(ValueError, match="XlaWorkPlan"):
        paged_attention(get_attention_backend("xla"), q, kv, kv, cache, cache, jnp.int32(0), meta, H ** -0.5)


@pytest.mark.skipif(not native_attention.available(), reason=str(native_attention.unavailable_reason()))
@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("H", [H, 64])
def test_native_reads_8bit_pages_like_the_jnp_loop(kind, H):
    """An 8-bit cache (`jaxinfer.layers.attention.kv_quant`): the kernel multiplies each token's scale into its
    score and probability; the jnp loop dequantizes the pages first. Same partial softmax."""
    from jaxinfer.layers.attention import kv_quant

    rows = [(1, 1), (70, 1), (0, 1), (300, 1), (45, 6)]
    a, _, nb = _pack(rows, 32)
    rng = np.random.default_rng(11)
    T = len(a["token_ids"])
    caches = [kv_quant.QuantKV(*kv_quant.quantize(jnp.asarray(rng.standard_normal((L, nb, BS, K, H)) * 3, jnp.float32),
                                                  kind)) for _ in range(2)]
    q = jnp.asarray(rng.standard_normal((T, K * G, H)), jnp.float32)
    k_new, v_new = (jnp.asarray(rng.standard_normal((T, K, H)), jnp.float32) for _ in range(2))
    meta = from_arrays(AttentionMetadata, {k: jnp.asarray(v) for k, v in a.items()})
    k_cache, v_cache, k_new, v_new = _written(*caches, k_new, v_new, meta)
    outs = [xla_paged_attention(q, k_new, v_new, k_cache, v_cache, jnp.int32(1), meta, plan_xla_work(meta, BS),
                                H ** -0.5, jnp.int32(100), native=native) for native in (False, True)]
    np.testing.assert_allclose(np.asarray(outs[1]), np.asarray(outs[0]), atol=1e-5, rtol=1e-5)
