"""The C++ one- and two-row bfloat16 products (`jaxinfer.kernels.cpu.gemv`): equal to
``lax.dot_general`` up to float32 summation order, through `cpu_bf16` in DenseGeneral's
layouts, and used by the compiled one-token step of a bfloat16 model on one CPU device
(with the same logits as XLA's product)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_bf16_llm, unpacked
from jaxinfer import SamplingParams
from jaxinfer.kernels.cpu import attention as native_attention
from jaxinfer.kernels.cpu import gemv as native_gemv
from jaxinfer.layers import cpu_bf16

pytestmark = pytest.mark.skipif(not native_gemv.available(), reason="no C++ compiler: the loops cannot be built")
RS = np.random.RandomState(0)


def bf16(*shape):
    return jnp.asarray(RS.standard_normal(shape), jnp.bfloat16)


def close(got, want, k):
    """Sums of k bfloat16 products in another order: float32 rounding, ~sqrt(k) ulps."""
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5 * np.sqrt(k) * 4)


# K not a multiple of 32 and N not of 128 exercise the scalar tails; 576 x 1536 is SmolLM2's MLP.
@pytest.mark.parametrize("rows,k,n", [(1, 576, 1536), (2, 576, 192), (1, 1536, 576), (1, 100, 77), (2, 33, 130),
                                      (1, 64, 300)])
def test_products_equal_dot_general(rows, k, n):
    x, w, wt = bf16(rows, k), bf16(k, n), bf16(n, k)
    want = jax.lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    for weights in (w, jax.lax.bitcast_convert_type(w, jnp.uint16)):  # bfloat16 or its bits
        got = jax.jit(native_gemv.matmul_kn)(x, weights)
        assert got.shape == (rows, n) and got.dtype == jnp.float32
        close(got, want, k)
    close(jax.jit(native_gemv.matmul_nk)(x, wt), jnp.einsum("mk,nk->mn", x, wt, preferred_element_type=jnp.float32), k)
    close(jax.jit(native_gemv.matmul_kn)(x.astype(jnp.float32), w), want, k)  # float32 rows are cast to bfloat16


@pytest.mark.parametrize("lhs_shape,rhs_shape,n_in", [
    ((1, 64), (64, 4, 16), 1),     # q_proj: [T, D] x [D, N, H]
    ((2, 4, 16), (4, 16, 64), 2),  # o_proj: [T, N, H] x [N, H, D]
    ((1, 64), (64, 96), 1),        # MLP
])
def test_dense_layouts_through_cpu_bf16(lhs_shape, rhs_shape, n_in):
    lhs, rhs = bf16(*lhs_shape), bf16(*rhs_shape)
    dims = ((tuple(range(len(lhs_shape) - n_in, len(lhs_shape))), tuple(range(n_in))), ((), ()))
    native = jax.jit(lambda a, b: cpu_bf16.dot_general(a, b, dims, native=True))
    assert "jaxinfer_bf16_gemv_kn" in native.lower(lhs, rhs).as_text()
    want = jax.lax.dot_general(lhs, rhs, dims, preferred_element_type=jnp.float32)
    got = native(lhs, rhs)
    assert got.shape == want.shape and got.dtype == jnp.float32
    close(got, want, int(np.prod(rhs_shape[:n_in])))


def test_three_rows_and_float32_weights_stay_with_xla():
    dims = (((1,), (0,)), ((), ()))
    three = jax.jit(lambda a, b: cpu_bf16.dot_general(a, b, dims, native=True)).lower(bf16(3, 64), bf16(64, 32))
    f32 = jax.jit(lambda a, b: cpu_bf16.dot_general(a, b, dims, native=True)).lower(
        jnp.ones((1, 64), jnp.float32), jnp.ones((64, 32), jnp.float32))
    assert "jaxinfer_bf16" not in three.as_text() and "jaxinfer_bf16" not in f32.as_text()


def _tiny_llm(native: bool, monkeypatch):
    """The tiny model without packed weights (as on a CPU without AMX or AVX-512 BF16), its
    few-row products in the loops (``native``) or XLA's two-row form."""
    return tiny_bf16_llm(plan=unpacked, **({} if native else {"linear": "dense_cpu", "native_gemv": False}))


def test_lone_stream_runs_the_loops_with_xla_logits(monkeypatch):
    """One prompt decodes in one-token steps with no AMX-packed weights (a CPU without AMX):
    they call the loops, and every step's logits match XLA's two-row product."""
    prompt, params = [[5, 6, 7, 8, 9]], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    runs = {}
    for native in (True, False):
        llm = _tiny_llm(native, monkeypatch)
        assert (llm.engine.runner.plan.linear == "bf16_gemv") is native
        out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
        runs[native] = (out.token_ids, np.array(out.logits))
        texts = [e.as_text() for b, e in llm.engine.runner._executables.items() if b.num_tokens == 1]
        assert texts and all(("jaxinfer_bf16_gemv" in t) is native for t in texts)
    assert runs[True][0] == runs[False][0]
    np.testing.assert_allclose(runs[True][1], runs[False][1], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("module", [native_gemv, native_attention], ids=["gemv", "attention"])
def test_native_code_says_why_it_is_off(monkeypatch, module):
    """With no compiler, or switched off, the reason is given (and XLA's own ops run)."""
    monkeypatch.setenv(module.ENV_SWITCH, "0")
    assert module._load.__wrapped__() == f"{module.ENV_SWITCH}=0"
    monkeypatch.delenv(module.ENV_SWITCH)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert "no C++ compiler" in module._load.__wrapped__()
