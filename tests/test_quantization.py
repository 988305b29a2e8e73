"""int8 weights and the 8-bit KV cache: bytes measured from live buffers, the KV block
gain, the Pallas kernel on 8-bit pages against a float64 oracle, the engine against float32,
no recompilation after warm-up, and TP 2 against TP 1 (8 fake CPU devices)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import resolved_plan, tiny_config, unpacked
from jaxinfer import LLM, SamplingParams
from jaxinfer.engine.builder import kv_bytes_per_block, plan_num_blocks, resolve_dtype
from jaxinfer.config import CacheConfig
from jaxinfer.layers.attention.kv_quant import dequantize, quantize, scale_values
from jaxinfer.runner.model_runner import CompileCounter
from jaxinfer.layers.quantization.int8 import (dequantize as dequantize_weight, qdot, quantize_array, quantize_params, scale_shape,
                                   tied_head_logits)
from jaxinfer.models.params import init_params
from jaxinfer.kernels.pallas import ragged_paged_attention
from test_pallas_kernels import make_batch, numpy_attention

CFG = tiny_config(vocab=256, hidden=64, layers=2, heads=4, kv_heads=2, inter=128)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _bytes(tree) -> int:
    return int(sum(x.nbytes for x in jax.tree.leaves(tree)))


def test_int8_weights_take_a_quarter_of_float32_bytes():
    """Live buffers (scales included) of a model whose channels are as wide as SmolLM2's."""
    cfg = tiny_config(vocab=4096, hidden=512, layers=2, heads=8, kv_heads=2, inter=1536, tied=True)
    f32 = jax.device_put(init_params(cfg, "float32"))
    q = quantize_params(f32)
    ratio = _bytes(f32) / _bytes(q)
    assert 4 / 1.05 <= ratio <= 4 * 1.05, ratio
    assert {x.dtype for x in jax.tree.leaves(q["layers"]["mlp"])} == {jnp.dtype(jnp.int8), jnp.dtype(jnp.bfloat16)}


def _numpy_group_reference(w: np.ndarray, axis: int, g: int):
    """float64 absmax scales per group of ``g`` along ``axis`` (``[..., n / g, ...]``) and
    each element's scale broadcast back to ``w``'s shape."""
    wg = np.moveaxis(w.astype(np.float64), axis, -1)
    s = np.abs(wg.reshape(wg.shape[:-1] + (-1, g))).max(-1) / 127
    return np.moveaxis(s, -1, axis), np.moveaxis(np.repeat(s, g, axis=-1), -1, axis)


@pytest.mark.parametrize("shape,axis,group,g", [((3, 40, 24), 1, 8, 8), ((3, 40, 24), 1, 16, 10),
                                                ((2, 4, 32, 24), 2, 16, 16), ((50, 64), 1, 64, 64)],
                         ids=["groups-of-8", "40-with-16-is-10", "o_proj-layout", "embedding-rows"])
def test_group_quantization_matches_float64_reference(shape, axis, group, g):
    """Scales: the float64 absmax / 127 of each group, rounded up to bfloat16 (so at most one
    bfloat16 step, a factor 1 + 2^-7, above it). Dequantized: within half the stored scale
    of the float64 weight, hence within (1 + 2^-7) / 2 of the reference scale."""
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * np.linspace(0.1, 3, shape[-1])
    q, s = quantize_array(jnp.asarray(w), axis, group=group)
    assert q.dtype == jnp.int8 and s.dtype == jnp.bfloat16 and s.shape == scale_shape(shape, axis, group)
    ref, ref_full = _numpy_group_reference(w, axis, g)
    stored = np.asarray(s, np.float64)
    assert (stored >= ref).all() and (stored <= ref * (1 + 2.0 ** -7)).all()
    err = np.abs(np.asarray(dequantize_weight(q, s, axis), np.float64) - w)
    assert (err <= ref_full * (1 + 2.0 ** -7) / 2 * (1 + 1e-6)).all()
    assert np.abs(np.asarray(q)).max() <= 127


@pytest.mark.parametrize("rows", [1, 16])  # both paths: weight-only and W8A8 (from 16 rows here)
def test_qdot_close_to_float_matmul(rows):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((rows, 96)).astype(np.float32)
    w = rng.standard_normal((96, 48)).astype(np.float32)
    q, s = quantize_array(jnp.asarray(w), 0, group=32)
    got = np.asarray(qdot(jnp.asarray(x), q, s, (0,), jnp.float32, w8a8_min_rows=16))
    want = x.astype(np.float64) @ w
    se = np.repeat(np.asarray(s, np.float64), 32, axis=0)  # each weight element's scale [96, 48]
    # weight error <= s/2 per element; W8A8 adds the activations' a/2 per element
    bound = np.abs(x) @ se / 2
    if rows >= 16:
        a = np.abs(x).max(1, keepdims=True) / 127
        bound = bound + a / 2 * np.abs(w).sum(0, keepdims=True) + a / 2 * se.sum(0, keepdims=True) / 2
    assert (np.abs(got - want) <= bound * 1.01 + 1e-5).all()


@pytest.mark.parametrize("rows", [1, 5])
def test_vocab_chunked_tied_head_equals_the_whole_table(rows):
    """The tied int8 head computed a chunk of (strided) vocabulary rows per loop iteration
    puts every logit in its column: equal to the whole-table `qdot`. A vocabulary with no
    divisor near the chunk (389 is prime) takes the whole table."""
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((rows, 64)).astype(np.float32))
    for vocab, chunks in ((384, (64, 100, 0)), (389, (64,))):  # 384: 6 iterations of 64, 4 of 96, whole
        q, s = quantize_array(jnp.asarray(rng.standard_normal((vocab, 64)).astype(np.float32)), 1, group=32)
        whole = np.asarray(qdot(x, q, s, (1,), jnp.float32))
        for chunk in chunks:
            got = np.asarray(tied_head_logits(x, q, s, jnp.float32, chunk=chunk))
            np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-5, err_msg=f"V={vocab} chunk={chunk}")


def test_vocab_chunked_tied_head_with_the_vocabulary_split_over_devices():
    """Tensor parallelism splits the table's vocabulary axis: the chunked head (each
    iteration's rows split with it) gives the single-device logits."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    assert len(jax.devices()) >= 2
    rng = np.random.default_rng(5)
    q, s = quantize_array(jnp.asarray(rng.standard_normal((512, 64)).astype(np.float32)), 1, group=32)
    x = jnp.asarray(rng.standard_normal((3, 64)).astype(np.float32))
    mesh = Mesh(np.array(jax.devices()[:2]), ("model",))
    split = NamedSharding(mesh, P("model", None))
    f = jax.jit(lambda x, q, s: tied_head_logits(x, q, s, jnp.float32, chunk=64))
    got = f(jax.device_put(x, NamedSharding(mesh, P())), jax.device_put(q, split), jax.device_put(s, split))
    np.testing.assert_allclose(np.asarray(got), np.asarray(f(x, q, s)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_kv_quantization_error_bound(kind):
    """The module's stated bounds, for the stored (bfloat16) scale."""
    x = jnp.asarray(np.random.default_rng(2).standard_normal((50, 3, 64)).astype(np.float32) * 3)
    v, s = quantize(x, kind)
    deq, sc = np.asarray(dequantize(v, s), np.float64), np.asarray(scale_values(s), np.float64)[..., None]
    err = np.abs(np.asarray(x, np.float64) - deq)
    bound = sc / 2 if kind == "int8" else np.maximum(2.0 ** -4 * np.abs(np.asarray(x)), 2.0 ** -10 * sc)
    assert (err <= bound * (1 + 1e-6)).all()


def test_int8_kv_holds_1_9x_the_blocks_of_bfloat16():
    cfg = tiny_config(hidden=576, heads=9, kv_heads=3)  # SmolLM2's head_dim 64 and 3 KV heads
    cache = lambda d: CacheConfig(kv_cache_memory=64 << 20, kv_cache_dtype=d)  # noqa: E731
    bf16 = plan_num_blocks(cfg, cache("auto"), "bfloat16")[0]
    int8 = plan_num_blocks(cfg, cache("int8"), "bfloat16")[0]
    assert int8 >= 1.9 * bf16
    assert plan_num_blocks(cfg, cache("auto"), "float32")[0] * 3.8 <= int8


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_live_kv_bytes_match_the_plan(kind):
    llm = LLM("tiny", max_model_len=64, max_num_seqs=2, max_num_batched_tokens=16, num_blocks=7,
              model_config=CFG, params=init_params(CFG), tokenizer=None, kv_cache_dtype=kind, warmup=False,
              use_tqdm=False)
    assert llm.engine.runner.kv_cache_bytes == 7 * kv_bytes_per_block(CFG, 16, "float32", 1, kind)


def _quantized_pages(batch, kind):
    kv = {}
    for name in ("k_pages", "v_pages"):
        v, s = quantize(jnp.asarray(batch[name]), kind)
        kv[name], kv[name[0] + "_scales"] = v, jax.lax.bitcast_convert_type(s, jnp.bfloat16)
    return kv


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("q_lens,kv_lens", [([1, 1, 1], [5, 33, 64]), ([1, 12, 3], [16, 30, 3])],
                         ids=["decode", "mixed"])
def test_kernel_on_8bit_pages_matches_float64(kind, q_lens, kv_lens):
    """Kernel (interpret mode) vs the float64 oracle on the *dequantized* cache: float32
    rounding only (1e-5 of the output's scale). Against the original float cache, the
    error is bounded from the scales: with ``d = sm_scale * max_j sum_h |q_h| e_kj``
    (``e`` the per-element bound of `test_kv_quantization_error_bound`), scores move by
    at most d, so softmax weights by at most a factor exp(2 d) and the output by at
    most ``(exp(2 d) - 1) max |v| + max e_v``."""
    batch = make_batch(np.random.default_rng(3), q_lens, kv_lens, heads=(4, 2), head_dim=64, block_size=16)
    kv = _quantized_pages(batch, kind)
    args = {k: v for k, v in batch.items() if k not in ("num_real_rows", "k_pages", "v_pages")}
    got = np.asarray(ragged_paged_attention(**args, **kv, interpret=True), np.float64)[:batch["num_real_rows"]]
    deq = {n: np.asarray(kv[n].astype(jnp.float32) * kv[n[0] + "_scales"].astype(jnp.float32)[..., None])
           for n in ("k_pages", "v_pages")}
    common = (batch["kv_lens"], batch["block_tables"], batch["query_start_loc"], int(batch["num_seqs"]), 64 ** -0.5)
    want = numpy_attention(batch["q"], deq["k_pages"], deq["v_pages"], *common)[:batch["num_real_rows"]]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    exact = numpy_attention(batch["q"], batch["k_pages"], batch["v_pages"], *common)[:batch["num_real_rows"]]
    e = {n: np.abs(batch[n] - deq[n]).max() for n in ("k_pages", "v_pages")}  # within the stated bound (test above)
    d = 64 ** -0.5 * np.abs(batch["q"]).sum(-1).max() * e["k_pages"]
    assert np.abs(got - exact).max() <= (np.exp(2 * d) - 1) * np.abs(batch["v_pages"]).max() + e["v_pages"]


def _llm(params, cfg=CFG, **kw):
    return LLM("tiny", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32, num_blocks=40,
               model_config=cfg, params=params, tokenizer=None, return_logits=True, use_tqdm=False, **kw)


def _prompts(lengths, seed=0):
    rs = np.random.RandomState(seed)
    return [rs.randint(3, CFG.vocab_size, n).tolist() for n in lengths]


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, seed=1)


@pytest.mark.parametrize("backend", ["xla", "pallas"])
def test_8bit_kv_logits_close_to_float(params, backend):
    """Engine logits with int8 / fp8 KV stay within a few percent of the float cache's
    (std-0.02 random weights: logits of order 0.1). The Pallas path reads even the prompt's
    own K/V back from the 8-bit cache."""
    ps = _prompts([9, 21])
    ref = _llm(params, warmup=False).generate(ps, GREEDY, use_tqdm=False)
    for kind, tol in (("int8", 0.02), ("fp8", 0.08)):
        out = _llm(params, warmup=False, kv_cache_dtype=kind, attention_backend=backend).generate(
            ps, GREEDY, use_tqdm=False)
        for a, b in zip(out, ref):  # the first position only: near-ties may pick other tokens later
            la, lb = np.asarray(a.outputs[0].logits[0]), np.asarray(b.outputs[0].logits[0])
            assert np.abs(la - lb).max() <= tol * np.abs(lb).max(), (kind, np.abs(la - lb).max())


def test_no_recompilation_after_warmup_quantized(params):
    llm = _llm(params, quantization="int8", kv_cache_dtype="int8")
    before = CompileCounter.count, llm.engine.runner.num_compilations
    llm.generate(_prompts([1, 7, 16, 17, 40, 90], seed=4),
                 [GREEDY, SamplingParams(temperature=0.8, top_k=5, seed=3, max_tokens=9)] * 3, use_tqdm=False)
    assert (CompileCounter.count, llm.engine.runner.num_compilations) == before


def test_tp2_quantized_equals_tp1(params, monkeypatch):
    """int8 weights and int8 KV under TP 2 (MLP and vocab split; the scales with them). Both
    run XLA's product (`qdot`): one device would otherwise run the int8 kernel, whose int16
    rounding of the activations is another product (tests/test_native_int8.py)."""
    assert len(jax.devices()) >= 2
    ps = _prompts([6, 19, 33], seed=5)
    kw = dict(quantization="int8", kv_cache_dtype="int8", warmup=False)
    plan = resolved_plan(dataclasses.replace(CFG, quantization="int8"), resolve_dtype("auto"), unpacked)
    one = _llm(params, plan=plan, **kw).generate(ps, GREEDY, use_tqdm=False)
    llm2 = _llm(params, tensor_parallel_size=2, **kw)
    two = llm2.generate(ps, GREEDY, use_tqdm=False)
    runner = getattr(llm2.engine, "engines", [llm2.engine])[0].runner
    gate = runner.params["layers"]["mlp"]["gate_proj"]
    assert gate["kernel"].dtype == jnp.int8 and gate["scale"].sharding.spec == gate["kernel"].sharding.spec
    down = runner.params["layers"]["mlp"]["down_proj"]  # split along its grouped input axis
    assert down["scale"].sharding.spec == down["kernel"].sharding.spec and "model" in str(down["scale"].sharding.spec)
    for a, b in zip(one, two):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        np.testing.assert_allclose(np.asarray(a.outputs[0].logits), np.asarray(b.outputs[0].logits), atol=2e-4)


def test_bad_quantization_settings_refused():
    with pytest.raises(ValueError, match="quantization"):
        dataclasses.replace(CFG, quantization="int4")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        CacheConfig(kv_cache_dtype="int4")


def test_gemma_family_quantized_close_to_float():
    """Gemma 3's layout (q/k norms, sandwich norms, sliding layers, scaled tied embeddings)
    with int8 weights and int8 KV: first-position logits near float32's."""
    from gemma_helpers import tiny_gemma_config, tiny_gemma_params

    cfg = tiny_gemma_config()
    params = tiny_gemma_params(cfg)
    ps = _prompts([11, 25], seed=6)
    ref = _llm(params, cfg, warmup=False).generate(ps, GREEDY, use_tqdm=False)
    out = _llm(params, cfg, warmup=False, quantization="int8", kv_cache_dtype="int8").generate(
        ps, GREEDY, use_tqdm=False)
    for a, b in zip(out, ref):
        la, lb = np.asarray(a.outputs[0].logits[0]), np.asarray(b.outputs[0].logits[0])
        assert np.abs(la - lb).max() <= 0.05 * np.abs(lb).max(), np.abs(la - lb).max()
