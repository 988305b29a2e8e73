"""The AMX product over pre-packed bfloat16 weights (`jaxinfer.native_amx`): the packed
layout everywhere, the products and the model's use of them where the CPU has AMX."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_bf16_llm, tiny_config
from jaxinfer import SamplingParams, model_runner, native_amx
from jaxinfer.cpu_features import host_cpu_flags
from jaxinfer.params import init_params

needs_amx = pytest.mark.skipif(not native_amx.available(), reason=f"AMX kernel off: {native_amx._load()}")


def test_pack_puts_each_weight_where_the_kernel_reads_it():
    """Element [l, j, b, p, c, e] of the packed array is w[l, 32b + 2p + e, 16j + c] (the
    kernel's header), checked for every element of a small stack."""
    L, K, N = 2, 64, 96
    w = np.arange(L * K * N, dtype=np.uint32).astype(np.uint16).reshape(L, K, N)
    packed = native_amx.pack(w)
    assert packed.shape == (L, N // 16, K // 32, 16, 16, 2) and packed.dtype == np.uint16
    l, j, b, p, c, e = np.indices(packed.shape)
    np.testing.assert_array_equal(packed, w[l, 32 * b + 2 * p + e, 16 * j + c])


def test_pack_takes_bfloat16_and_rejects_shapes_it_cannot_tile():
    w = jnp.asarray(np.random.default_rng(0).standard_normal((1, 32, 32)), jnp.bfloat16)
    np.testing.assert_array_equal(native_amx.pack(w)[0, 0, 0, 0, 0], np.asarray(w).view(np.uint16)[0, 0:2, 0])
    for shape in [(1, 48, 32), (1, 32, 40), (32, 32)]:
        with pytest.raises(ValueError):
            native_amx.pack(np.zeros(shape, np.uint16))
    assert native_amx.packable(576, 1536) and not native_amx.packable(576, 1000)


@needs_amx
@pytest.mark.parametrize("rows", [3, 16, 17, 32, 33, 70])
@pytest.mark.parametrize("k,n", [(64, 32), (576, 192), (96, 640)])
def test_products_match_float64(rows, k, n):
    """Every row count (whole and partial 16- and 32-row panels) and each layer of a stack:
    bfloat16 operands, float32 sums, against float64 sums of the same bfloat16 values."""
    rng = np.random.default_rng(rows * 1000 + k + n)
    w = jnp.asarray(rng.standard_normal((3, k, n)) * 0.05, jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((rows, k)), jnp.bfloat16)
    packed = jnp.asarray(native_amx.pack(w))
    f = jax.jit(native_amx.matmul)
    for layer in range(3):
        ref = np.asarray(x, np.float64) @ np.asarray(w[layer], np.float64)
        bound = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(w[layer], np.float64))
        got = np.asarray(f(x, packed, layer))
        assert got.shape == (rows, n) and got.dtype == np.float32
        assert np.all(np.abs(got - ref) <= 1e-5 * bound + 1e-6)


@needs_amx
def test_kernel_errors_are_clean():
    packed = jnp.asarray(native_amx.pack(np.zeros((2, 64, 32), np.uint16)))
    with pytest.raises(ValueError):
        native_amx.matmul(jnp.zeros((4, 32), jnp.bfloat16), packed, 0)  # K differs
    with pytest.raises(Exception, match="out of range"):
        jax.block_until_ready(jax.jit(native_amx.matmul)(jnp.zeros((4, 64), jnp.bfloat16), packed, 5))


def _tiny_llm(native: bool, monkeypatch):
    monkeypatch.setattr(model_runner, "use_native_amx", lambda *a: native)
    return tiny_bf16_llm()


@needs_amx
def test_model_steps_run_the_kernel_with_xla_logits(monkeypatch):
    """Four prompts decode together (4-row steps, scanned layers): those steps call the kernel
    for every projection and the LM head, and every step's logits match XLA's products."""
    prompts = [[5, 6, 7, 8, 9], [11, 12], [3] * 20, [40, 41, 42]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    runs = {}
    for amx in (True, False):
        llm = _tiny_llm(amx, monkeypatch)
        assert (llm.engine.runner.amx is not None) is amx
        outs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        runs[amx] = ([o.token_ids for o in outs], [np.array(o.logits) for o in outs])
        texts = [e.as_text() for b, e in llm.engine.runner._executables.items() if b.num_tokens > 2]
        assert texts and all((t.count(native_amx.TARGET) >= 1) is amx for t in texts)
    assert runs[True][0] == runs[False][0]
    for a, b in zip(runs[True][1], runs[False][1]):
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-2)


def test_packed_variables_cover_every_projection_and_the_head():
    """Shapes of the packed tree of a tiny model (tied and untied heads); a projection whose
    width is not a multiple of 32 is left to XLA."""
    for tied in (True, False):
        cfg = tiny_config(vocab=256, hidden=64, layers=2, inter=96, tied=tied)
        tree = native_amx.packed_variables(init_params(cfg, "bfloat16", seed=0), cfg)
        assert set(tree["layers"]["attn"]) == {"q_proj_packed", "k_proj_packed", "v_proj_packed", "o_proj_packed"}
        assert set(tree["layers"]["mlp"]) == {"gate_proj_packed", "up_proj_packed", "down_proj_packed"}
        assert tree["layers"]["mlp"]["down_proj_packed"].shape == (2, 64 // 16, 96 // 32, 16, 16, 2)
        assert tree["lm_head_packed"].shape == (1, 256 // 16, 64 // 32, 16, 16, 2)
    cfg = tiny_config(vocab=256, hidden=64, layers=2, inter=80, tied=True)
    assert "mlp" not in native_amx.packed_variables(init_params(cfg, "bfloat16", seed=0), cfg)["layers"]


def test_native_code_says_why_it_is_off(monkeypatch):
    """Without AMX the CPU is named as the reason; with it, the switch turns the kernel off."""
    monkeypatch.setenv(native_amx.ENV_SWITCH, "0")
    why = native_amx._load.__wrapped__()
    if {"amx_tile", "amx_bf16"} <= host_cpu_flags():
        assert why == f"{native_amx.ENV_SWITCH}=0"
    else:
        assert why == "this CPU has no AMX (amx_tile, amx_bf16)"
