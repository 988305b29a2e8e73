"""The Mosaic GPU attention backend (`jaxinfer.layers.attention.mosaic`), the execution plan's
choice of it, and the engine step lowered for CUDA with each GPU backend
(`jaxinfer.runner.cross_lower`).

The backend runs the kernel in Mosaic GPU's interpreter here: one ragged step (decodes, a
continuing chunk, a fresh prefill) through `paged_attention` equals the XLA backend's, with
NaN planted in V's slots past every context (the backend zeroes them before the WGMMA reads the
page); the same with int8 and fp8 caches of block size 64 (NaN bytes in fp8 V's tails). The
cross-lowering tests trace every warm-up bucket of an engine step for SmolLM2, Gemma 3
and the Llama-3-8B layout (abstract weights: nothing allocated) and lower it for CUDA: each
bucket's text holds the chosen kernel's custom call twice (the decode and the general path of
its ``lax.cond``) and not the other kernel's. ``make test`` lowers a two-bucket engine; the slow
set lowers the default engine's buckets.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_xla_attention import BS, G, K, L, _pack

from jaxinfer.config import ModelConfig
from jaxinfer.entrypoints.plan import load_config
from jaxinfer.layers.attention.base import paged_attention
from jaxinfer.layers.attention.kv_quant import QuantKV, quantize
from jaxinfer.layers.attention.mosaic import clear_value_tails, supports
from jaxinfer.layers.attention.registry import get_attention_backend
from jaxinfer.layers.step_metadata import AttentionMetadata, from_arrays
from jaxinfer.platform.execution_plan import default_attention_backend, resolve_plan

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
MODELS = ["smollm2-135m", "gemma3-270m", "llama-3-8b"]
HD = 64  # the kernel's smallest head dim (test_xla_attention's H = 8 is below it)


def _step(rows, width=8, seed=0, bs=BS):
    a, tables, used = _pack(rows, width)
    meta = from_arrays(AttentionMetadata, a)
    meta = jax.tree.map(jnp.asarray, meta)
    rng = np.random.default_rng(seed)
    T = a["token_ids"].shape[0]
    nb = used + 3
    normal = lambda *s: jnp.asarray(rng.standard_normal(s, np.float32), jnp.bfloat16)  # noqa: E731
    return meta, tables, normal(T, K * G, HD), normal(T, K, HD), normal(T, K, HD), normal(L, nb, bs, K, HD), \
        normal(L, nb, bs, K, HD)


def test_backend_step_equals_xla_with_nan_value_tails():
    rows = [(15, 1), (31, 1), (20, 5), (0, 3)]  # decodes to and past a block edge, a chunk, a prefill
    meta, tables, q, k_new, v_new, k_cache, v_cache = _step(rows, width=4)
    ends = [ctx + n for ctx, n in rows]
    poisoned = v_cache
    for blocks, end in zip(tables, ends):
        if end % BS:
            poisoned = poisoned.at[1, blocks[-1], end % BS:].set(jnp.nan)
    layer, scale = jnp.int32(1), HD ** -0.5
    xla = get_attention_backend("xla", interpret=True, native=False, mesh=None)
    mosaic = get_attention_backend("mosaic", interpret=True, native=False, mesh=None)
    want, _, _ = paged_attention(xla, q, k_new, v_new, k_cache, v_cache, layer, meta, scale,
                                 plan=xla.prepare(meta, BS))
    got, k_out, v_out = paged_attention(mosaic, q, k_new, v_new, k_cache, poisoned, layer, meta, scale)
    n = sum(n for _, n in rows)
    got, want = np.asarray(got, np.float32)[:n], np.asarray(want, np.float32)[:n]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=2e-2 * np.abs(want).max())
    assert not np.isnan(np.asarray(v_out[1], np.float32)).any(), "the tails were zeroed"


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_backend_step_equals_xla_on_eight_bit_caches(monkeypatch, kind):
    """int8 / fp8 caches of block size 64: one ragged step through the Mosaic backend (the kernel in
    its interpreter reading 8-bit pages and their scales) equals the XLA backend's on the same
    cache; for fp8, V's slots past each context hold NaN bytes (the backend zeroes values and
    scales there)."""
    import test_xla_attention as txa

    bs = 64
    monkeypatch.setattr(txa, "BS", bs)
    monkeypatch.setattr(txa, "LAYOUT", dataclasses.replace(txa.LAYOUT, block_size=bs))
    rows = [(63, 1), (130, 1), (40, 30), (0, 3)]  # decodes to and past a page edge, a chunk, a prefill
    meta, tables, q, k_new, v_new, k_bf, v_bf = _step(rows, width=4, bs=bs)
    k_cache, v_cache = (QuantKV(*quantize(c.astype(jnp.float32), kind)) for c in (k_bf, v_bf))
    poisoned = v_cache
    if kind == "fp8":
        for blocks, end in zip(tables, [ctx + n for ctx, n in rows]):
            if end % bs:
                nan = jnp.full(poisoned.values[1, blocks[-1], end % bs:].shape, jnp.nan, jnp.float8_e4m3fn)
                poisoned = QuantKV(poisoned.values.at[1, blocks[-1], end % bs:].set(nan), poisoned.scales)
    layer, scale = jnp.int32(1), HD ** -0.5
    xla = get_attention_backend("xla", interpret=True, native=False, mesh=None)
    mosaic = get_attention_backend("mosaic", interpret=True, native=False, mesh=None)
    want, _, _ = paged_attention(xla, q, k_new, v_new, k_cache, v_cache, layer, meta, scale,
                                 plan=xla.prepare(meta, bs))
    got, _, v_out = paged_attention(mosaic, q, k_new, v_new, k_cache, poisoned, layer, meta, scale)
    n = sum(n for _, n in rows)
    got, want = np.asarray(got, np.float32)[:n], np.asarray(want, np.float32)[:n]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=2e-2 * np.abs(want).max())
    assert not np.isnan(np.asarray(v_out.values[1], np.float32)).any(), "the tails were zeroed"


def test_clear_value_tails_touches_only_tails_of_real_rows():
    rows = [(3, 1), (31, 1), (10, 6)]
    meta, tables, *_, v_cache = _step(rows)
    out = np.asarray(clear_value_tails(v_cache, jnp.int32(0), meta), np.float32)
    ref = np.asarray(v_cache, np.float32)
    expect = ref.copy()
    for blocks, end in zip(tables, [4, 32, 16]):
        if end % BS:
            expect[0, blocks[-1], end % BS:] = 0
    np.testing.assert_array_equal(out, expect)  # layer 1, full pages and the null block untouched


def test_plan_picks_mosaic_on_hopper_where_it_serves():
    llama = load_config(str(CONFIGS / "llama-3-8b.json"))
    plan = lambda cfg=llama, dtype="bfloat16", **kw: resolve_plan(  # noqa: E731
        cfg, dtype, platform="gpu", environ={}, **kw)
    assert plan(compute_capability=(9, 0)).attention == "mosaic"
    assert plan(compute_capability=(10, 0)).attention == "mosaic"
    assert plan(compute_capability=(8, 9)).attention == "pallas"  # Ada: Triton
    assert plan(compute_capability=(9, 0), kv_cache_dtype="int8").attention == "pallas"  # block 16
    assert plan(compute_capability=(9, 0), kv_cache_dtype="int8", block_size=64).attention == "mosaic"
    assert plan(compute_capability=(9, 0), kv_cache_dtype="fp8", block_size=64).attention == "mosaic"
    assert plan(compute_capability=(9, 0), kv_cache_dtype="fp8", block_size=32).attention == "pallas"
    assert plan(dtype="float32", compute_capability=(9, 0)).attention == "pallas"
    assert plan(compute_capability=(9, 0), block_size=8).attention == "pallas"
    assert plan(attention="pallas", compute_capability=(9, 0)).attention == "pallas"  # forced
    with pytest.raises(ValueError, match="mosaic: .*int8 KV cache of block size 64 only"):
        plan(attention="mosaic", kv_cache_dtype="int8")
    cpu = resolve_plan(llama, "bfloat16", "mosaic", platform="cpu", environ={"JAXINFER_NATIVE_DECODE": "0"})
    assert (cpu.attention, cpu.pallas_interpret) == ("mosaic", True)
    assert default_attention_backend("cpu", (9, 0)) == "xla"
    assert default_attention_backend("gpu", None) == "pallas"  # ROCm / unknown: Triton
    assert supports(32, 8, 128, 16, jnp.bfloat16) is None
    assert "head dim" in supports(4, 1, 96, 16, jnp.bfloat16)


def _lower_all(model: str, backend: str, shapes, kv_cache_dtype: str = "auto"):
    from jaxinfer.runner.cross_lower import KERNEL_CALLS, lower_engine_steps

    cfg: ModelConfig = load_config(str(CONFIGS / f"{model}.json"))
    other = KERNEL_CALLS["pallas" if backend == "mosaic" else "mosaic"]
    count = 0
    for bucket, text in lower_engine_steps(cfg, "bfloat16", backend, shapes, kv_cache_dtype=kv_cache_dtype):
        assert text.count(KERNEL_CALLS[backend]) == 2, f"{bucket}: both paths of the kernel's cond"
        assert other not in text, bucket
        count += 1
    assert count == len(shapes.layout(cfg.vocab_size).ladders.all_buckets())


@pytest.mark.parametrize("backend", ["mosaic", "pallas"])
@pytest.mark.parametrize("model", MODELS)
def test_engine_step_lowers_for_cuda(model, backend):
    from jaxinfer.runner.cross_lower import StepShapes

    _lower_all(model, backend, StepShapes(max_num_batched_tokens=2, max_num_seqs=2, max_model_len=64,
                                          num_blocks=64))


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("model", ["smollm2-135m", "llama-3-8b"])
def test_engine_step_with_eight_bit_cache_lowers_for_cuda(model, kind):
    """An 8-bit cache of block size 64: the engine step (quantizing write, zeroed V tails, the kernel
    on values and scales) lowers for CUDA with the Mosaic custom call. Gemma 3's head dim 256 does
    not fit shared memory at block size 64 (`test_shared_memory_rule`)."""
    from jaxinfer.runner.cross_lower import StepShapes

    _lower_all(model, "mosaic", StepShapes(max_num_batched_tokens=2, max_num_seqs=2, max_model_len=128,
                                           block_size=64, num_blocks=16), kv_cache_dtype=kind)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["mosaic", "pallas"])
@pytest.mark.parametrize("model", MODELS)
def test_default_engine_buckets_lower_for_cuda(model, backend):
    """Every bucket of the default engine (512 tokens, 128 sequences, 4096-token context)."""
    from jaxinfer.runner.cross_lower import StepShapes

    _lower_all(model, backend, StepShapes())


def test_shared_memory_rule():
    from jaxinfer.kernels.pallas.mosaic_paged_attention import _stages_that_fit, fits_shared_memory

    assert fits_shared_memory(128, 64) and fits_shared_memory(256, 32)
    assert not fits_shared_memory(256, 64)
    assert "shared memory" in supports(4, 1, 256, 64, jnp.bfloat16)
    assert supports(32, 8, 128, 64, jnp.bfloat16, "int8") is None
    assert "shared memory" in supports(4, 1, 256, 64, jnp.bfloat16, "fp8")
    assert _stages_that_fit(3, 128, 64, 1, 2048) == 3  # 8-bit: pages + widened pages + scales
    assert _stages_that_fit(3, 128, 16, 2, 2048) == 3 and _stages_that_fit(8, 256, 32, 2, 2048) == 3


@pytest.mark.slow
def test_engine_with_mosaic_backend_matches_xla():
    """The whole engine on CPU with the Mosaic kernel interpreted (bfloat16, head dim 64, GQA 2):
    greedy tokens of prompts mixing a one-token prompt, prompts that end on and just past a block
    edge and a prompt prefilled in two chunks equal the XLA backend's (a split only at a near-tie)."""
    from helpers import tiny_config

    from jaxinfer import LLM, SamplingParams
    from jaxinfer.models.params import init_params

    cfg = tiny_config(hidden=256, heads=4, kv_heads=2, layers=2, inter=128)
    params = init_params(cfg, "bfloat16", seed=0, scale=4.0)
    common = dict(dtype="bfloat16", max_model_len=96, max_num_seqs=4, max_num_batched_tokens=32, num_blocks=40,
                  model_config=cfg, params=params, tokenizer=None, warmup=False, return_logits=True,
                  enable_prefix_caching=False)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 256, n).tolist() for n in (1, 16, 17, 40)]
    sp = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    want = LLM("tiny-xla", attention_backend="xla", **common).generate(prompts, sp, use_tqdm=False)
    got = LLM("tiny-mosaic", attention_backend="mosaic", **common).generate(prompts, sp, use_tqdm=False)
    for w, g in zip(want, got):
        wt, gt = w.outputs[0].token_ids, g.outputs[0].token_ids
        same = next((i for i, (a, b) in enumerate(zip(wt, gt)) if a != b), len(wt))
        if same < len(wt):
            top = np.sort(np.asarray(w.outputs[0].logits[same], np.float32))[::-1]
            assert top[0] - top[1] < 0.1, f"tokens part at {same} without a near-tie"
