"""The int8 product kernel (jaxinfer/kernels/cpu/csrc/int8_gemm.cc, `jaxinfer.kernels.cpu.int8`): packing, products
against a float64 reference of the same arithmetic and against XLA's dequantize-then-dot, errors,
and an int8 model's steps through it."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import resolved_plan, tiny_config, unpacked
from jaxinfer import LLM, SamplingParams
from jaxinfer.kernels.cpu import int8 as native_int8
from jaxinfer.platform.cpu_features import host_cpu_flags
from jaxinfer.layers.quantization import int8 as quant
from jaxinfer.layers.linear_methods.int8_packed import packed_variables
from jaxinfer.layers.linear_methods.packed import without_packed
from jaxinfer.models.params import init_params

needs_vnni = pytest.mark.skipif(not native_int8.available(host_cpu_flags()),
                                reason=f"int8 kernel off: {native_int8._load(host_cpu_flags())}")


def _weights(layers: int, k: int, n: int, seed: int = 0):
    w = np.random.default_rng(seed).standard_normal((layers, k, n)).astype(np.float32) * 0.05
    q, s = quant.quantize_array(jnp.asarray(w), 1)
    return np.asarray(q), np.asarray(s, np.float32)


def test_pack_puts_each_weight_where_the_kernel_reads_it():
    q, s = _weights(2, 128, 64)
    packed = native_int8.pack(q, s)
    w = np.asarray(packed["w"])
    assert w.shape == (2, 4, 4, 16, 16, 2) and w.dtype == np.int8 and packed["s"].dtype == jnp.float32
    for l, j, b, p, c, e in [(0, 0, 0, 0, 0, 0), (1, 3, 2, 7, 5, 1), (0, 2, 3, 15, 15, 0)]:
        assert w[l, j, b, p, c, e] == q[l, 32 * b + 2 * p + e, 16 * j + c]
    assert native_int8.packed_shape_kn(packed) == (128, 64)


def test_pack_rejects_what_the_kernel_cannot_read():
    q, s = _weights(1, 128, 64)
    for bad_q, bad_s in [(q[:, :96], s[:, :1]),  # K not a multiple of 64 (with matching scales)
                         (q[:, :, :48], s[:, :, :48]),  # N not a multiple of 32
                         (q.astype(np.int16), s),  # not int8
                         (q, s[:, :1])]:  # scales of another shape
        with pytest.raises(ValueError):
            native_int8.pack(bad_q, bad_s)


def _reference(x: np.ndarray, q: np.ndarray, s: np.ndarray, int16: bool = True) -> np.ndarray:
    """The kernel's arithmetic in float64: x rounded to int16 per row (``int16``; else x as
    given, the bfloat16 path), group sums scaled."""
    x = x.astype(np.float64)
    a = np.abs(x).max(axis=1, keepdims=True) / 32767.0 if int16 else np.ones((len(x), 1))
    a[a == 0] = 1.0
    xq = np.clip(np.rint(x / a), -32767, 32767) if int16 else x
    w = q.astype(np.float64) * np.repeat(s.astype(np.float64), native_int8.GROUP, axis=0)
    return (xq @ w) * a


def _bf16_path(rows: int, dtype: str) -> bool:
    """Whether the kernel multiplies x as given (bfloat16 x past 4 rows, on a CPU with AVX-512 BF16)."""
    return dtype == "bfloat16" and rows > 4 and "avx512_bf16" in host_cpu_flags()


@needs_vnni
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 13, 32, 33])
@pytest.mark.parametrize("k,n", [(64, 32), (576, 960), (1536, 576)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_products_match_float64(rows, k, n, dtype):
    """Every row-count path (1-4 rows in registers, more through the widened weights: int16, or
    bfloat16 for bfloat16 x where the CPU has AVX-512 BF16) and both input dtypes, on the last
    layer of a stack: the float64 reference of the same arithmetic within float32 rounding, and
    XLA's x (q s) within the int16 rounding of x."""
    q, s = _weights(3, k, n, seed=rows)
    x = jnp.asarray(np.random.default_rng(k + rows).standard_normal((rows, k)), dtype)
    y = np.asarray(jax.jit(native_int8.matmul)(x, native_int8.pack(q, s), 2))
    x64 = np.asarray(x, np.float64)
    ref = _reference(x64, q[2], s[2], int16=not _bf16_path(rows, dtype))
    scale = np.abs(ref).max()
    assert np.abs(y - ref).max() <= 1e-5 * scale
    xla = np.asarray(quant.qdot(jnp.asarray(x64, jnp.float32), jnp.asarray(q[2]), jnp.asarray(s[2]), (0,), jnp.float32))
    assert np.abs(y - xla).max() <= 2e-4 * scale


@needs_vnni
def test_zero_rows_and_large_values_stay_finite():
    """A row of zeros gives zeros (no 0/0 scale); a row of large values saturates nothing."""
    q, s = _weights(1, 64, 32)
    x = np.zeros((3, 64), np.float32)
    x[1] = 3e4
    x[2, ::2] = -1e30
    y = np.asarray(native_int8.matmul(jnp.asarray(x), native_int8.pack(q, s), 0))
    assert np.all(y[0] == 0) and np.all(np.isfinite(y))
    np.testing.assert_allclose(y, _reference(x, q[0], s[0]), rtol=1e-5, atol=1e-5 * np.abs(y).max())


@needs_vnni
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_nan_or_inf_row_stays_non_finite(dtype):
    """A NaN or an infinity in a row of x makes that row's outputs non-finite, as XLA's product
    would (the int16 path's absmax alone would drop a NaN lane and hide it), and leaves the other
    rows alone; 6 rows, so that bfloat16 x takes the VDPBF16PS path where the CPU has it."""
    q, s = _weights(1, 128, 64)
    x = np.random.default_rng(3).standard_normal((6, 128)).astype(np.float32)
    x[1, 5], x[3, 70] = np.nan, np.inf
    y = np.asarray(native_int8.matmul(jnp.asarray(x, dtype), native_int8.pack(q, s), 0))
    assert not np.isfinite(y[1]).any() and not np.isfinite(y[3]).all()
    good = [0, 2, 4, 5]
    ref = _reference(np.asarray(jnp.asarray(x, dtype), np.float64)[good], q[0], s[0], int16=not _bf16_path(6, dtype))
    np.testing.assert_allclose(y[good], ref, atol=1e-5 * np.abs(ref).max(), rtol=0)


@needs_vnni
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("real", [0, 3, 9, 33, 40, 99])
def test_only_the_real_rows_are_multiplied(dtype, real):
    """``rows``: x's first ``rows`` rows (clamped to M = 40) come out as without it, the later
    rows are zeros, and those rows of x (NaN here, a step's padding) are never read."""
    q, s = _weights(2, 128, 64, seed=real)
    packed = native_int8.pack(q, s)
    M, n = 40, min(real, 40)
    x = np.random.default_rng(real).standard_normal((M, 128)).astype(np.float32)
    full = jnp.asarray(x, dtype)
    x[n:] = np.nan
    got = np.asarray(jax.jit(native_int8.matmul)(jnp.asarray(x, dtype), packed, 1, real))
    # the real rows alone: the same row count picks the same path (int16 up to 4 rows)
    want = np.asarray(jax.jit(native_int8.matmul)(full[:max(n, 1)], packed, 1))
    np.testing.assert_array_equal(got[:n], want[:n])
    assert np.all(got[n:] == 0)


@needs_vnni
def test_kernel_errors_are_clean():
    packed = native_int8.pack(*_weights(2, 64, 32))
    with pytest.raises(ValueError):
        native_int8.matmul(jnp.zeros((4, 32), jnp.float32), packed, 0)  # K differs
    with pytest.raises(Exception, match="out of range"):
        jax.block_until_ready(jax.jit(native_int8.matmul)(jnp.zeros((4, 64), jnp.float32), packed, 5))


# head_dim 64: o's groups (along head_dim) are the kernel's 64 inputs; q, k, v side by side 256 wide
CFG = dataclasses.replace(tiny_config(vocab=256, hidden=128, layers=2, heads=2, kv_heads=1, inter=128, tied=True))


def _int8_llm(native: bool, monkeypatch, cfg=CFG, dtype="float32"):
    """The tiny int8 model with the packed method the plan resolves here (``native``), or without it."""
    plan = resolved_plan(dataclasses.replace(cfg, quantization="int8"), dtype, None if native else unpacked)
    assert (plan.linear == "int8_packed") is native
    return LLM("tiny", dtype=dtype, quantization="int8", max_model_len=128, max_num_seqs=4,
               max_num_batched_tokens=32, num_blocks=64, model_config=cfg, params=init_params(cfg, dtype, seed=1),
               tokenizer=None, warmup=False, enable_prefix_caching=False, return_logits=True, plan=plan)


@needs_vnni
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tied", [True, False])
def test_int8_model_steps_run_the_kernel_with_xla_logits(monkeypatch, dtype, tied):
    """Four prompts decode together (4-row steps, and 32-token prefill chunks), then one alone:
    every compiled step calls the kernel (q/k/v as one product, o, gate, up, down, the LM head),
    the stacked int8 kernels and their scales are held only packed, and the logits match XLA's
    dequantize-then-dot within the int16 rounding of the activations."""
    cfg = dataclasses.replace(CFG, tie_word_embeddings=tied)
    prompts = [[5, 6, 7, 8, 9], [11, 12], [3] * 40, [40, 41, 42]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    runs = {}
    for native in (True, False):
        llm = _int8_llm(native, monkeypatch, cfg, dtype)
        runner = llm.engine.runner
        assert (runner.amx is not None) is native
        outs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        outs += [llm.generate([[7, 8, 9]], params, use_tqdm=False)[0].outputs[0]]
        runs[native] = ([o.token_ids for o in outs], [np.array(o.logits) for o in outs])
        texts = [e.as_text() for e in runner._executables.values()]
        assert texts and all((t.count(native_int8.TARGET) >= 6) is native for t in texts)
        if native:
            assert set(runner.amx["layers"]["attn"]) == {"qkv_packed", "o_proj_packed"}
            assert set(runner.amx["layers"]["mlp"]) == {"gate_proj_packed", "up_proj_packed", "down_proj_packed"}
            assert "lm_head_packed" in runner.amx
            assert runner.params["layers"]["attn"] == {} and runner.params["layers"]["mlp"] == {}
    assert runs[True][0] == runs[False][0]
    tol = 2e-3 if dtype == "float32" else 3e-2  # bfloat16: XLA also rounds q s and x to bfloat16
    for a, b in zip(runs[True][1], runs[False][1]):
        assert np.abs(a - b).max() <= tol * np.abs(b).max()


def test_projections_whose_groups_do_not_fit_stay_with_xla():
    """head_dim 32 (o's groups 32 inputs) and an MLP width that is no multiple of 64 as down's K:
    those products are not packed (XLA's `qdot` runs them); the rest are."""
    cfg = tiny_config(vocab=256, hidden=128, layers=2, heads=4, kv_heads=2, inter=96, tied=True)
    params = quant.quantize_params(init_params(cfg, "float32", seed=0))
    tree = packed_variables(params, cfg)
    assert set(tree["layers"]["attn"]) == {"qkv_packed"}
    assert set(tree["layers"]["mlp"]) == {"gate_proj_packed", "up_proj_packed"}
    kept = without_packed(params, tree)["layers"]
    assert set(kept["attn"]) == {"o_proj"} and set(kept["mlp"]) == {"down_proj"}
    assert set(kept["mlp"]["down_proj"]) == {"kernel", "scale"}


def test_int8_kernel_says_why_it_is_off(monkeypatch):
    monkeypatch.setenv(native_int8.ENV_SWITCH, "0")
    native_int8._load.cache_clear()
    try:
        flags = host_cpu_flags()
        assert not native_int8.available(flags) and "JAXINFER_NATIVE_INT8=0" in native_int8._load(flags)
    finally:
        monkeypatch.delenv(native_int8.ENV_SWITCH)
        native_int8._load.cache_clear()
