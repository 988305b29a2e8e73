"""Tests of jaxinfer.kernels.pallas: kernel and jnp reference against a float64 NumPy oracle.

By default the Pallas kernel runs in interpret mode (CPU). With
``JAXINFER_PALLAS_COMPILED=1`` the same tests run it compiled (interpret=False), for
a GPU machine. Interpret mode fills kernel outputs with NaN before the kernel runs,
so an unwritten row shows up as NaN here; every real row is compared.

Inputs are fresh random normals (never zeros), block tables are shuffled, and
padding is filled with garbage (NaN in the padding test).
"""

from __future__ import annotations

import os
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.kernels.pallas import ragged_paged_attention, ragged_paged_attention_reference
from jaxinfer.kernels.pallas.reference import num_work_items, plan_query_blocks

COMPILED = os.environ.get("JAXINFER_PALLAS_COMPILED") == "1"
INTERPRET = not COMPILED
TOL = {"float32": 1e-5, "bfloat16": 2e-2}


def numpy_attention(q, k_pages, v_pages, kv_lens, block_tables, qsl, num_seqs, scale, window=None):
    """Float64 oracle: loops over sequences and rows, dense softmax per row (over the last
    ``window`` keys up to the row's position when a sliding window is given)."""
    q, k_pages, v_pages = (np.asarray(x, np.float64) for x in (q, k_pages, v_pages))
    _, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_pages.shape
    group = num_q_heads // num_kv_heads
    out = np.full(q.shape, np.nan)
    for i in range(num_seqs):
        start, end, ctx = int(qsl[i]), int(qsl[i + 1]), int(kv_lens[i])
        pages = block_tables[i, : -(-ctx // block_size)]
        k = np.repeat(k_pages[pages].reshape(-1, num_kv_heads, head_dim)[:ctx], group, 1)
        v = np.repeat(v_pages[pages].reshape(-1, num_kv_heads, head_dim)[:ctx], group, 1)
        for r in range(start, end):
            pos = ctx - (end - start) + (r - start)
            lo = 0 if window is None else max(0, pos - window + 1)
            s = np.einsum("nh,cnh->nc", q[r], k[lo: pos + 1]) * scale
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[r] = np.einsum("nc,cnh->nh", p / p.sum(axis=1, keepdims=True), v[lo: pos + 1])
    return out


def make_batch(rng, q_lens, kv_lens, *, heads=(2, 2), head_dim=64, block_size=16,
               dtype="float32", pad_tokens=3, pad_seqs=1, extra_blocks=3):
    """Random ragged batch; pages of all sequences drawn from a shuffled pool.

    Returns a dict of kernel arguments (NumPy) plus ``num_real_rows``.
    """
    num_q_heads, num_kv_heads = heads
    pages_per_seq = [-(-c // block_size) for c in kv_lens]
    max_blocks = max(pages_per_seq) + 1
    num_blocks = 1 + sum(pages_per_seq) + extra_blocks
    pool = iter(rng.permutation(np.arange(1, num_blocks)))
    num_seqs = len(q_lens)
    seqs = num_seqs + pad_seqs
    tables = np.zeros((seqs, max_blocks), np.int32)  # padding entries: null block
    for i, n in enumerate(pages_per_seq):
        tables[i, :n] = [next(pool) for _ in range(n)]
    qsl = np.zeros(seqs + 1, np.int32)
    qsl[1:num_seqs + 1] = np.cumsum(q_lens)
    qsl[num_seqs + 1:] = qsl[num_seqs]
    num_tokens = int(qsl[num_seqs]) + pad_tokens
    lens = np.zeros(seqs, np.int32)
    lens[:num_seqs] = kv_lens

    def normal(*shape):
        return np.asarray(jnp.asarray(rng.standard_normal(shape, np.float32), dtype))

    return dict(
        q=normal(num_tokens, num_q_heads, head_dim),
        k_pages=normal(num_blocks, block_size, num_kv_heads, head_dim),
        v_pages=normal(num_blocks, block_size, num_kv_heads, head_dim),
        kv_lens=lens, block_tables=tables, query_start_loc=qsl,
        num_seqs=np.int32(num_seqs), num_real_rows=int(qsl[num_seqs]))


def run_kernel(batch, **kw):
    args = {k: v for k, v in batch.items() if k != "num_real_rows"}
    return np.asarray(ragged_paged_attention(**args, interpret=INTERPRET, **kw))


def run_reference(batch, **kw):
    args = {k: v for k, v in batch.items() if k != "num_real_rows"}
    return np.asarray(ragged_paged_attention_reference(**args, **kw))


def oracle(batch, window=None):
    return numpy_attention(
        batch["q"], batch["k_pages"], batch["v_pages"], batch["kv_lens"],
        batch["block_tables"], batch["query_start_loc"], int(batch["num_seqs"]),
        batch["q"].shape[-1] ** -0.5, window)


def assert_close(out, expected, batch):
    n = batch["num_real_rows"]
    got = np.asarray(out, np.float64)[:n]
    want = expected[:n]
    assert np.isfinite(got).all(), "unwritten or NaN real rows"
    scale = np.abs(want).max()
    err = np.abs(got - want).max() / scale
    assert err <= TOL[str(batch["q"].dtype)], f"max abs err {err:.3g} x scale {scale:.3g}"
    assert np.isfinite(np.asarray(out, np.float64)).all(), "padding rows must stay finite"


# (name, q_lens, kv_lens, heads (N, K), head_dim, block_size, dtype, kernel kwargs)
CASES = [
    ("mixed_g1_h64_bs16_f32", [1, 15, 1, 16, 4, 17], [1, 15, 16, 16, 33, 17],
     (2, 2), 64, 16, "float32", dict(q_block_rows=16, pages_per_step=1)),
    ("mixed_g3_h128_bs32_f32", [1, 9, 1, 20], [15, 40, 32, 20],
     (6, 2), 128, 32, "float32", {}),
    ("prefill_g8_h64_bs32_f32", [17, 32, 5], [17, 64, 37],
     (8, 1), 64, 32, "float32", dict(q_block_rows=16)),
    ("decode_g8_h128_bs16_f32", [1, 1, 1, 1, 1], [1, 15, 16, 17, 48],
     (16, 2), 128, 16, "float32", {}),
    ("mixed_g3_h64_bs16_bf16", [1, 12, 1, 3], [16, 30, 47, 3],
     (3, 1), 64, 16, "bfloat16", dict(pages_per_step=3)),
    ("decode_g1_h128_bs32_bf16", [1, 1, 1], [32, 31, 65],
     (2, 2), 128, 32, "bfloat16", {}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kernel_and_reference_match_numpy(case):
    name, q_lens, kv_lens, heads, head_dim, block_size, dtype, kw = case
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    batch = make_batch(rng, q_lens, kv_lens, heads=heads, head_dim=head_dim,
                       block_size=block_size, dtype=dtype)
    expected = oracle(batch)
    assert_close(run_kernel(batch, **kw), expected, batch)
    assert_close(run_reference(batch), expected, batch)


def test_long_context_mixed():
    """Contexts >= 2048 with a decode row and a prefill chunk at the end."""
    rng = np.random.default_rng(7)
    batch = make_batch(rng, [1, 24, 1], [2048, 2100, 5], heads=(6, 2), head_dim=64,
                       block_size=32)
    expected = oracle(batch)
    assert_close(run_kernel(batch), expected, batch)
    assert_close(run_reference(batch), expected, batch)


# Split-K decode (flash-decoding): more splits than pages, contexts at block edges, >= 2048.
SPLIT_CASES = [
    ("split4_g8_h128_bs16_f32", [1] * 5, [1, 15, 16, 17, 300], (16, 2), 128, 16, "float32", 4),
    ("split3_g3_h64_bs16_bf16", [1] * 4, [2048, 33, 100, 700], (3, 1), 64, 16, "bfloat16", 3),
    ("split16_more_than_pages_f32", [1, 1], [5, 40], (2, 2), 64, 16, "float32", 16),
    ("split2_g1_h64_bs32_f32", [1, 1, 1], [64, 65, 2100], (2, 2), 64, 32, "float32", 2),
]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_decode_split_over_keys_matches_numpy(case):
    name, q_lens, kv_lens, heads, head_dim, block_size, dtype, splits = case
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    batch = make_batch(rng, q_lens, kv_lens, heads=heads, head_dim=head_dim,
                       block_size=block_size, dtype=dtype, pad_tokens=2, pad_seqs=1)
    expected = oracle(batch)
    split = run_kernel(batch, decode_splits=splits)
    assert_close(split, expected, batch)
    poisoned = _poison_padding(batch, rng)
    n = batch["num_real_rows"]
    np.testing.assert_array_equal(run_kernel(poisoned, decode_splits=splits)[:n], split[:n])


# Sliding windows (Gemma 3's local layers): windows of 1 (a row sees only itself), one
# block (16), one block + 1 (17: the window starts one key inside the previous block) and
# 512 (Gemma 3's), with contexts and prefill chunks that cross block edges and windows.
WINDOW_CASES = [
    ("mixed", [1, 15, 1, 16, 4, 17, 1], [1, 15, 16, 40, 33, 530, 600], dict(q_block_rows=16, pages_per_step=1)),
    ("decode", [1] * 6, [1, 16, 17, 33, 513, 700], {}),
    ("decode_split", [1] * 3, [17, 529, 1100], dict(decode_splits=4)),
    ("prefill", [40, 24], [40, 560], dict(pages_per_step=3)),
]


@pytest.mark.parametrize("window", [1, 16, 17, 512])
@pytest.mark.parametrize("case", WINDOW_CASES, ids=[c[0] for c in WINDOW_CASES])
def test_sliding_window_matches_numpy(case, window):
    name, q_lens, kv_lens, kw = case
    rng = np.random.default_rng(zlib.crc32(f"{name}{window}".encode()))
    batch = make_batch(rng, q_lens, kv_lens, heads=(4, 1), head_dim=64, block_size=16)
    expected = oracle(batch, window)
    assert_close(run_kernel(batch, sliding_window=jnp.int32(window), **kw), expected, batch)
    assert_close(run_reference(batch, sliding_window=window), expected, batch)


def test_auto_decode_splits():
    from jaxinfer.kernels.pallas.ragged_paged_attention import auto_decode_splits

    assert auto_decode_splits(64 * 8, 512, 16) == 1  # batch 64 x 8 KV heads fills the GPU
    assert auto_decode_splits(4 * 8, 512, 16) == 8  # 32 programs: 8x to reach 256
    assert auto_decode_splits(1, 8192 // 16, 16) == 16  # capped at MAX_SPLITS
    assert auto_decode_splits(2, 4, 16) == 1  # 64 keys of capacity: never split below 512
    assert auto_decode_splits(2 * 1, 4096 // 16, 16) == 8  # 4096 keys / 512 per split
    rng = np.random.default_rng(17)  # the auto choice (8 splits here) is what runs by default
    batch = make_batch(rng, [1, 1], [4096, 3000], heads=(2, 1), head_dim=64, block_size=16)
    assert_close(run_kernel(batch), oracle(batch), batch)


def _poison_padding(batch, rng):
    """Copy of ``batch`` with every padding input replaced by garbage or NaN."""
    b = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in batch.items()}
    n, num_seqs = b["num_real_rows"], int(b["num_seqs"])
    b["q"][n:] = np.nan
    b["k_pages"][0] = np.nan  # null block
    b["v_pages"][0] = np.nan
    block_size = b["k_pages"].shape[1]
    for i in range(num_seqs):  # slots past each context in its last page
        ctx = int(b["kv_lens"][i])
        last = b["block_tables"][i, (ctx - 1) // block_size]
        b["k_pages"][last, (ctx - 1) % block_size + 1:] = np.nan
        b["v_pages"][last, (ctx - 1) % block_size + 1:] = np.nan
    b["kv_lens"][num_seqs:] = 10_000
    b["block_tables"][num_seqs:] = rng.integers(0, 1 << 30, b["block_tables"][num_seqs:].shape)
    b["query_start_loc"][num_seqs + 1:] = b["q"].shape[0]
    return b


def test_padding_never_touches_real_rows():
    rng = np.random.default_rng(11)
    batch = make_batch(rng, [3, 1, 18], [3, 17, 40], heads=(4, 2), head_dim=64,
                       block_size=16, pad_tokens=5, pad_seqs=2)
    poisoned = _poison_padding(batch, rng)
    n = batch["num_real_rows"]
    for run in (run_kernel, run_reference):
        clean, dirty = run(batch), run(poisoned)
        assert np.isfinite(dirty[:n]).all()
        np.testing.assert_array_equal(clean[:n], dirty[:n])
    assert_close(run_kernel(poisoned), oracle(batch), batch)


def test_stacked_layer_equals_unstacked():
    rng = np.random.default_rng(5)
    batch = make_batch(rng, [1, 6, 1], [20, 6, 33], heads=(6, 2), head_dim=64,
                       block_size=16)
    layers = [make_batch(np.random.default_rng(i), [1, 6, 1], [20, 6, 33], heads=(6, 2),
                         head_dim=64, block_size=16) for i in range(3)]
    stacked = dict(batch,
                   k_pages=np.stack([b["k_pages"] for b in layers]),
                   v_pages=np.stack([b["v_pages"] for b in layers]))
    for layer in (2, 0):
        single = dict(batch, k_pages=layers[layer]["k_pages"],
                      v_pages=layers[layer]["v_pages"])
        layer_arg = jnp.asarray(layer, jnp.int32)
        np.testing.assert_array_equal(run_kernel(stacked, layer=layer_arg),
                                      run_kernel(single))
        np.testing.assert_array_equal(run_reference(stacked, layer=layer_arg),
                                      run_reference(single))


def test_under_outer_jit_with_traced_metadata():
    rng = np.random.default_rng(3)
    batch = make_batch(rng, [2, 1], [9, 30], heads=(2, 1), head_dim=64, block_size=16)
    args = {k: v for k, v in batch.items() if k != "num_real_rows"}

    @jax.jit
    def step(a):
        return ragged_paged_attention(**a, interpret=INTERPRET)

    assert_close(np.asarray(step(args)), oracle(batch), batch)


@pytest.mark.parametrize("q_block", [1, 4, 16])
def test_plan_bounds_and_covers_every_row(q_block):
    """Every real row lands in exactly one work item, within the static bound W."""
    seqs, tokens = 5, 160
    work = num_work_items(tokens, seqs, q_block)
    plan_fn = jax.jit(lambda kv, qsl, n: plan_query_blocks(
        kv, qsl, n, num_tokens=tokens, q_block=q_block, num_work=work))
    rng = np.random.default_rng(q_block)
    for _ in range(20):
        q_lens = rng.integers(0, 32, seqs)
        num_seqs = int(rng.integers(0, seqs + 1))
        qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        kv = (q_lens + rng.integers(0, 50, seqs)).astype(np.int32)
        need = sum(-(-int(n) // q_block) for n in q_lens[:num_seqs])
        assert need <= work
        plan = jax.tree.map(np.asarray, plan_fn(kv, qsl, np.int32(num_seqs)))
        rows = [r for w in range(work)
                for r in range(plan.q_start[w], plan.q_start[w] + plan.num_rows[w])]
        assert rows == list(range(qsl[num_seqs]))
        slots = plan.row_slot[: qsl[num_seqs]]
        assert len(set(slots.tolist())) == len(slots)
        starts = plan.q_start[plan.row_slot // q_block] + plan.row_slot % q_block
        np.testing.assert_array_equal(starts[: qsl[num_seqs]], np.arange(qsl[num_seqs]))


@pytest.mark.parametrize("dtype, layout", [
    ("bfloat16", (32, 8, 128)),  # Llama-3-8B, 32 stacked layers: a cache over 4 GiB
    ("float32", (9, 3, 64)),  # SmolLM2
])
def test_lowers_to_triton_for_cuda(dtype, layout):
    """Cross-lowering for CUDA (no GPU needed): Pallas -> Triton IR succeeds for both
    the decode and the general kernel, and picks Triton, not Mosaic GPU."""
    num_q_heads, num_kv_heads, head_dim = layout
    spec = jax.ShapeDtypeStruct
    i32 = jnp.int32
    args = (spec((256, num_q_heads, head_dim), dtype),
            spec((32, 8192, 16, num_kv_heads, head_dim), dtype),
            spec((32, 8192, 16, num_kv_heads, head_dim), dtype),
            spec((64,), i32), spec((64, 512), i32), spec((65,), i32), spec((), i32))
    fn = jax.jit(lambda q, k, v, lens, bt, qsl, n: ragged_paged_attention(
        q, k, v, lens, bt, qsl, n, layer=jnp.int32(3)))
    text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("xla.gpu.triton") == 2
    split = jax.jit(lambda q, k, v, lens, bt, qsl, n: ragged_paged_attention(
        q, k, v, lens, bt, qsl, n, layer=jnp.int32(3), decode_splits=4))
    assert split.trace(*args).lower(lowering_platforms=("cuda",)).as_text().count("xla.gpu.triton") == 2


@pytest.mark.parametrize("bad, error", [
    (dict(q=np.ones((4, 3, 64), np.float32)), ValueError),  # 3 q heads over 2 KV heads
    (dict(kv_lens=np.ones((3, 1), np.int32)), ValueError),
    (dict(block_tables=np.ones((1, 2), np.float32)), TypeError),
    (dict(q=np.ones((4, 2, 64), np.float16)), TypeError),
])
def test_wrapper_rejects_bad_inputs(bad, error):
    batch = make_batch(np.random.default_rng(0), [1], [5], pad_seqs=0)
    with pytest.raises(error):
        run_kernel(dict(batch, **bad))


def test_only_the_triton_deprecation_warning_is_filtered():
    """The Triton kernel stays for sm80-sm89: JAX 0.11's deprecation warning of its backend is
    silenced by its whole exact text, and nothing else is (a longer or shorter text, another
    category, another deprecation)."""
    import warnings

    from jaxinfer.kernels.pallas.ragged_paged_attention import TRITON_DEPRECATION, ignore_triton_deprecation

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ignore_triton_deprecation()
        warnings.warn(TRITON_DEPRECATION, DeprecationWarning)
        warnings.warn(TRITON_DEPRECATION + " More.", DeprecationWarning)
        warnings.warn(TRITON_DEPRECATION, FutureWarning)
        warnings.warn("The Pallas Triton backend is deprecated", DeprecationWarning)
        warnings.warn("jax.foo is deprecated", DeprecationWarning)
    assert [(str(w.message), w.category) for w in seen] == [
        (TRITON_DEPRECATION + " More.", DeprecationWarning), (TRITON_DEPRECATION, FutureWarning),
        ("The Pallas Triton backend is deprecated", DeprecationWarning), ("jax.foo is deprecated", DeprecationWarning)]


def test_jax_is_pinned_to_the_version_under_test():
    """pyproject pins jax, jaxlib and the cuda12 extra to one version: the one running here."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    pins = dict(re.findall(r'"(jax|jaxlib|jax\[cuda12\])==([0-9.]+)"', text))
    assert set(pins) == {"jax", "jaxlib", "jax[cuda12]"}, pins
    assert set(pins.values()) == {jax.__version__}, (pins, jax.__version__)
    assert not re.search(r'"jax(lib)?>=', text), "an open lower bound installs an untested JAX"
