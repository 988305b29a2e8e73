"""The AMX product over pre-packed bfloat16 weights (`jaxinfer.kernels.cpu.amx`): the packed
layout everywhere, the products and the model's use of them where the CPU has AMX."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import register_source_variant, tiny_bf16_llm, tiny_config, unpacked
from jaxinfer import SamplingParams
from jaxinfer.kernels.cpu import amx as native_amx
from jaxinfer.platform.cpu_features import host_cpu_flags
from jaxinfer.layers.linear_methods.amx_packed import packed_variables
from jaxinfer.layers.linear_methods.packed import without_packed
from jaxinfer.models.params import init_params

needs_amx = pytest.mark.skipif(not native_amx.available(host_cpu_flags()),
                               reason=f"packed-product kernel off: {native_amx._load(host_cpu_flags())}")
_DPBF16 = {native_amx.TARGET: "jaxinfer_test_dpbf16_gemm", native_amx.GATED_TARGET: "jaxinfer_test_dpbf16_gated"}


def _register_variant(first_lines: str, name: str, targets: dict[str, str]) -> str | None:
    """The kernel's source with ``first_lines`` put before it, built and registered under
    ``targets`` (the kernel's target -> a test target); None, or why not."""
    symbols = {native_amx.TARGET: "JaxinferAmxGemm", native_amx.GATED_TARGET: "JaxinferAmxGated"}
    return register_source_variant(native_amx.SOURCE, first_lines, name, native_amx.ENV_SWITCH,
                                   {test: symbols[target] for target, test in targets.items()})


@functools.cache
def _register_dpbf16() -> str | None:
    """The kernel's AVX-512 BF16 path (what CPUs without AMX run), built on an AMX CPU from a
    copy of the source with JAXINFER_NO_AMX defined, under the `_DPBF16` targets; None, or why not."""
    if not {"amx_tile", "amx_bf16"} <= host_cpu_flags():
        return "this CPU has no AMX: its default build is that path"
    return _register_variant("#define JAXINFER_NO_AMX 1\n", "dpbf16", _DPBF16)


@pytest.fixture(params=["default", "no_amx"])
def build(request, monkeypatch):
    """Each build of the kernel this CPU can run: its default one (AMX tiles, or VDPBF16PS without
    AMX), and on an AMX CPU also the VDPBF16PS path (`_register_dpbf16`)."""
    if request.param == "no_amx":
        why = _register_dpbf16()
        if why is not None:
            pytest.skip(why)
        for name, target in _DPBF16.items():
            monkeypatch.setattr(native_amx, "TARGET" if name == native_amx.TARGET else "GATED_TARGET", target)
    return request.param


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
@pytest.mark.parametrize("rows", [1, 2, 3, 16, 17, 32, 33, 70])
@pytest.mark.parametrize("k,n", [(64, 32), (576, 192), (96, 640)])
def test_products_match_float64(build, rows, k, n):
    """Every row count (one and two rows, whole and partial 16- and 32-row panels)
    and each layer of a stack: bfloat16 operands, float32 sums, against float64 sums of the
    same bfloat16 values."""
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


def test_pack_gated_is_pack_of_the_interleaved_blocks():
    """`pack_gated` (wg, wu) = `pack` of the [K, 2F] matrix whose 16-column blocks alternate
    gate block q, up block q (F = 48: a multiple of 16, not of 32, is enough)."""
    rng = np.random.default_rng(7)
    for K, F in [(64, 48), (96, 32)]:
        wg, wu = (jnp.asarray(rng.standard_normal((3, K, F)), jnp.bfloat16) for _ in range(2))
        blocks = np.stack([np.asarray(w).reshape(3, K, F // 16, 16) for w in (wg, wu)], axis=3)  # [l, k, q, g|u, c]
        packed = native_amx.pack_gated(wg, wu)
        assert packed.dtype == np.uint16 and packed.shape == (3, 2 * F // 16, K // 32, 16, 16, 2)
        np.testing.assert_array_equal(packed, native_amx.pack(blocks.reshape(3, K, 2 * F)))
    for g, u in [((1, 48, 32), (1, 48, 32)), ((1, 32, 40), (1, 32, 40)), ((1, 32, 32), (1, 32, 64)), ((32, 32),) * 2]:
        with pytest.raises(ValueError):
            native_amx.pack_gated(np.zeros(g, np.uint16), np.zeros(u, np.uint16))
    assert native_amx.gated_packable(576, 1536) and native_amx.gated_packable(64, 48)
    assert not native_amx.gated_packable(576, 40) and not native_amx.gated_packable(48, 64)


_GATED_REF = {"silu": jax.nn.silu, "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True)}


@functools.cache
def _gated_weights(k: int, f: int):
    """Gate and up stacks [3, k, f] (bfloat16, std 0.05, every layer different) and their `pack_gated`."""
    rng = np.random.default_rng(k * 7 + f)
    wg, wu = (jnp.asarray(rng.standard_normal((3, k, f)) * 0.05, jnp.bfloat16) for _ in range(2))
    return wg, wu, jnp.asarray(native_amx.pack_gated(wg, wu))


def _bf16_ulp(v: np.ndarray) -> np.ndarray:
    """The spacing of bfloat16 at |v| (8 significant bits; 2^-133, the smallest step, at 0)."""
    _, e = np.frexp(np.abs(v))
    return np.maximum(np.ldexp(1.0, e - 8), 2.0 ** -133)


@needs_amx
@pytest.mark.parametrize("act", list(native_amx.GATED_ACTS))
@pytest.mark.parametrize("rows", [1, 2, 3, 16, 17, 32, 33, 100, 512])
@pytest.mark.parametrize("k,f", [(576, 1536), (640, 2048), (64, 48)], ids=["smollm2", "gemma3", "small"])
def test_gated_product_matches_xla(build, k, f, rows, act):
    """act(x wg) * (x wu) in one call against XLA's: the same bfloat16 operands, float32 dots,
    act and product in float32, rounded to bfloat16; layer 2 of a stack of 3; one and
    two rows, whole and partial 16- and 32-row panels; SwiGLU and GeGLU shapes of SmolLM2 and Gemma 3 and a small one
    (F a multiple of 16 only). Every third row of x (the last of 1 or 2) is 100x, so gate values reach far past
    +-30 and the kernel's exp clamps (SiLU beyond |g| ~ 88, GELU beyond |g| ~ 10): no NaN or
    inf. Tolerance, per element: one bfloat16 step (both results are rounded once) plus
    the float32 sums' order (1e-5 of |x| |w| as `test_products_match_float64`, through
    |act'| <= 1.2 and |act(g)|) plus 2^-22 |g u| for XLA's own act: its GELU, 0.5 g (1 + tanh),
    loses the digits of 1 + tanh for negative g (the kernel takes g sigmoid(2y) instead)."""
    wg, wu, packed = _gated_weights(k, f)
    rng = np.random.default_rng(rows * 10 + k + f)
    scale = np.where(np.arange(rows) % 3 == min(2, rows - 1), 100.0, 1.0)[:, None]  # with 1 or 2 rows: the last
    x = jnp.asarray(rng.standard_normal((rows, k)) * scale, jnp.bfloat16)
    got = np.asarray(jax.jit(native_amx.gated_matmul, static_argnums=3)(x, packed, 2, act))
    assert got.shape == (rows, f) and got.dtype == jnp.bfloat16
    g, u = (jnp.dot(x, w[2], preferred_element_type=jnp.float32) for w in (wg, wu))
    ref = np.asarray((_GATED_REF[act](g) * u).astype(jnp.bfloat16)).astype(np.float64)
    a = np.asarray(_GATED_REF[act](g), np.float64)
    got, g, u = got.astype(np.float64), np.asarray(g, np.float64), np.asarray(u, np.float64)
    bound_g, bound_u = (np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(w[2], np.float64)) for w in (wg, wu))
    tol = (_bf16_ulp(np.maximum(np.abs(got), np.abs(ref))) + 2.0 ** -22 * np.abs(g * u)
           + 1e-5 * (1.2 * bound_g * np.abs(u) + np.abs(a) * bound_u))
    assert np.all(np.isfinite(got)) and np.abs(g).max() > 30
    bad = np.abs(got - ref) > tol
    assert not bad.any(), f"{bad.sum()} of {bad.size}, first at {np.argwhere(bad)[0]}: {got[bad][:4]} vs {ref[bad][:4]}"


@needs_amx
@pytest.mark.parametrize("real", [0, 1, 9, 33, 40, 99])
def test_only_the_real_rows_are_multiplied(build, real):
    """``rows``: x's first ``rows`` rows (clamped to M = 40) are multiplied as without it, the
    output's later rows are zeros, and those rows of x are never read: they hold NaN here (a
    step's padding tokens). Plain and gated products, ``rows`` traced."""
    M, K, N = 40, 96, 64
    rng = np.random.default_rng(real)
    w = jnp.asarray(rng.standard_normal((2, K, N)) * 0.05, jnp.bfloat16)
    wg, wu, gated = _gated_weights(K, N)
    x = np.asarray(rng.standard_normal((M, K)), np.float32)
    n = min(real, M)
    full = jnp.asarray(x, jnp.bfloat16)
    x[n:] = np.nan
    x = jnp.asarray(x, jnp.bfloat16)
    packed = jnp.asarray(native_amx.pack(w))
    got = np.asarray(jax.jit(native_amx.matmul)(x, packed, 1, real))
    want = np.asarray(jax.jit(native_amx.matmul)(full, packed, 1))
    np.testing.assert_array_equal(got[:n], want[:n])
    assert np.all(got[n:] == 0)
    h = jax.jit(native_amx.gated_matmul, static_argnums=3)
    got, want = np.asarray(h(x, gated, 2, "silu", real)), np.asarray(h(full, gated, 2, "silu"))
    np.testing.assert_array_equal(got[:n].view(np.uint16), want[:n].view(np.uint16))
    assert np.all(got[n:].astype(np.float32) == 0)


@needs_amx
def test_kernel_errors_are_clean():
    packed = jnp.asarray(native_amx.pack(np.zeros((2, 64, 32), np.uint16)))
    with pytest.raises(ValueError):
        native_amx.matmul(jnp.zeros((4, 32), jnp.bfloat16), packed, 0)  # K differs
    with pytest.raises(Exception, match="out of range"):
        jax.block_until_ready(jax.jit(native_amx.matmul)(jnp.zeros((4, 64), jnp.bfloat16), packed, 5))
    with pytest.raises(ValueError):
        native_amx.gated_matmul(jnp.zeros((4, 64), jnp.bfloat16), packed, 0, "relu")  # no such act
    with pytest.raises(Exception, match="out of range"):
        gated = jax.jit(native_amx.gated_matmul, static_argnums=3)
        jax.block_until_ready(gated(jnp.zeros((4, 64), jnp.bfloat16), packed, 5, "silu"))


def _tiny_llm(native: bool, monkeypatch, hidden_act: str = "silu"):
    """The tiny model with the packed method the plan resolves here (``native``), or without it."""
    llm = tiny_bf16_llm(hidden_act, plan=None if native else unpacked)
    assert (llm.engine.runner.plan.linear == "amx_packed") is native
    return llm


@needs_amx
@pytest.mark.parametrize("hidden_act,gated", [("silu", True), ("gelu_pytorch_tanh", True), ("silu", False)],
                         ids=["swiglu", "geglu", "swiglu-unfused"])
def test_model_steps_run_the_kernel_with_xla_logits(monkeypatch, hidden_act, gated):
    """Four prompts decode together (4-row steps), then one alone (1-row steps; scanned layers
    both): every compiled step calls the kernel for every projection and the LM head, the
    MLP's gate and up as one gated call (SwiGLU and GeGLU; as two products where the gated
    kernel lacks the activation), and every step's logits match XLA's products."""
    if not gated:
        monkeypatch.setattr(native_amx, "GATED_ACTS", {})
    prompts = [[5, 6, 7, 8, 9], [11, 12], [3] * 20, [40, 41, 42]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    runs = {}
    for amx in (True, False):
        llm = _tiny_llm(amx, monkeypatch, hidden_act)
        assert (llm.engine.runner.amx is not None) is amx
        outs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        outs += [llm.generate([[7, 8, 9]], params, use_tqdm=False)[0].outputs[0]]
        runs[amx] = ([o.token_ids for o in outs], [np.array(o.logits) for o in outs])
        texts = {b.num_tokens: e.as_text() for b, e in llm.engine.runner._executables.items()}
        assert 1 in texts and 4 in texts
        assert all((t.count(native_amx.TARGET) >= 1) is amx for t in texts.values())
        assert all((native_amx.GATED_TARGET in t) is (amx and gated) for t in texts.values())
        held = [k for k, _ in jax.tree_util.tree_flatten_with_path(llm.engine.runner.params["layers"])[0]]
        assert any("kernel" in str(k) for k in held) is not amx  # each packed kernel held once, packed
    assert runs[True][0] == runs[False][0]
    for a, b in zip(runs[True][1], runs[False][1]):
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-2)


def test_packed_variables_cover_every_projection_and_the_head(monkeypatch):
    """Shapes of the packed tree of a tiny model (tied and untied heads): the MLP's gate and up
    packed together (`pack_gated`), not also one by one; a projection whose width is not a
    multiple of 32 is left to XLA (gate and up together need 16); an activation the gated
    kernel lacks keeps gate and up packed one by one. q, k and v are packed as one product,
    their kernels side by side; where their widths add up to no multiple of 32, each goes its
    own way."""
    for tied in (True, False):
        cfg = tiny_config(vocab=256, hidden=64, layers=2, inter=96, tied=tied)
        params = init_params(cfg, "bfloat16", seed=0)
        tree = packed_variables(params, cfg)
        assert set(tree["layers"]["attn"]) == {"qkv_packed", "o_proj_packed"}
        attn = params["layers"]["attn"]
        side_by_side = np.concatenate([np.asarray(attn[n]["kernel"]).reshape(2, 64, -1) for n in ("q_proj", "k_proj", "v_proj")], 2)
        np.testing.assert_array_equal(tree["layers"]["attn"]["qkv_packed"], native_amx.pack(side_by_side))
        assert set(tree["layers"]["mlp"]) == {"gate_up_packed", "down_proj_packed"}
        mlp = params["layers"]["mlp"]
        np.testing.assert_array_equal(tree["layers"]["mlp"]["gate_up_packed"],
                                      native_amx.pack_gated(mlp["gate_proj"]["kernel"], mlp["up_proj"]["kernel"]))
        assert tree["layers"]["mlp"]["down_proj_packed"].shape == (2, 64 // 16, 96 // 32, 16, 16, 2)
        assert tree["lm_head_packed"].shape == (1, 256 // 16, 64 // 32, 16, 16, 2)
    cfg = tiny_config(vocab=256, hidden=64, layers=2, inter=80, tied=True)
    tree = packed_variables(init_params(cfg, "bfloat16", seed=0), cfg)
    assert set(tree["layers"]["mlp"]) == {"gate_up_packed"}
    cfg = tiny_config(vocab=256, hidden=64, layers=2, inter=72, tied=True)
    assert "mlp" not in packed_variables(init_params(cfg, "bfloat16", seed=0), cfg)["layers"]
    cfg = tiny_config(vocab=256, hidden=64, layers=2, heads=8, kv_heads=1, inter=96)  # q 64 wide, k and v 8
    assert set(packed_variables(init_params(cfg, "bfloat16", seed=0), cfg)["layers"]["attn"]) == {
        "q_proj_packed", "o_proj_packed"}
    monkeypatch.setattr(native_amx, "GATED_ACTS", {"gelu_pytorch_tanh": 1})  # the tiny config's SiLU left out
    cfg = tiny_config(vocab=256, hidden=64, layers=2, inter=96, tied=True)
    tree = packed_variables(init_params(cfg, "bfloat16", seed=0), cfg)
    assert set(tree["layers"]["mlp"]) == {"gate_proj_packed", "up_proj_packed", "down_proj_packed"}


def test_without_packed_drops_only_what_has_a_packed_copy():
    """The runner keeps a layer kernel only where no packed copy exists: with gate and up packed
    together both go, and so do q, k and v packed as one; a down projection left to XLA (width
    80) stays, as do k and v where they are (width 8), the norms, the embedding and an untied
    head; the tree passed in is not changed."""
    cfg = tiny_config(vocab=256, hidden=64, layers=2, inter=80, tied=False)
    params = init_params(cfg, "bfloat16", seed=0)
    before = jax.tree.structure(params)
    kept = without_packed(params, packed_variables(params, cfg))
    assert jax.tree.structure(params) == before
    assert set(kept["layers"]["mlp"]) == {"down_proj"}
    assert not any(k.endswith("_proj") for k in kept["layers"]["attn"])
    assert kept["lm_head"] is params["lm_head"] and kept["embed"] is params["embed"]
    norms = {k for k in params["layers"] if k not in ("attn", "mlp")}
    assert norms and all(kept["layers"][k]["scale"] is params["layers"][k]["scale"] for k in norms)
    cfg = tiny_config(vocab=256, hidden=64, layers=2, inter=72, tied=True)  # no MLP weight packable
    params = init_params(cfg, "bfloat16", seed=0)
    kept = without_packed(params, packed_variables(params, cfg))
    assert set(kept["layers"]["mlp"]) == {"gate_proj", "up_proj", "down_proj"}
    cfg = tiny_config(vocab=256, hidden=64, layers=2, heads=8, kv_heads=1, inter=96)  # only q and o packable
    params = init_params(cfg, "bfloat16", seed=0)
    kept = without_packed(params, packed_variables(params, cfg))
    assert set(kept["layers"]["attn"]) == {"k_proj", "v_proj"}


@needs_amx
def test_a_build_without_the_intrinsics_is_refused_at_load(monkeypatch):
    """A compiler that lacks the CPU's AMX and AVX-512 BF16 intrinsics builds a library whose
    calls fail (here: the source with both feature macros undefined); `_smoke_test` turns that
    into a reason at load, so XLA's dot runs instead of a step failing. The real build passes it."""
    assert native_amx._smoke_test() is None
    target = "jaxinfer_test_featureless_gemm"
    why = _register_variant("#undef __AVX512BF16__\n#undef __AMX_TILE__\n", "featureless", {native_amx.TARGET: target})
    assert why is None, why
    monkeypatch.setattr(native_amx, "TARGET", target)
    assert native_amx._smoke_test().startswith("the packed bfloat16 product failed a first call: ")


def test_native_code_says_why_it_is_off(monkeypatch):
    """Without AMX or AVX-512 BF16 the CPU is named as the reason; with either, the switch turns
    the kernel off."""
    monkeypatch.setenv(native_amx.ENV_SWITCH, "0")
    flags = host_cpu_flags()
    why = native_amx._load.__wrapped__(flags)
    if {"amx_tile", "amx_bf16"} <= flags or "avx512_bf16" in flags:
        assert why == f"{native_amx.ENV_SWITCH}=0"
    else:
        assert why == "this CPU has neither AMX (amx_tile, amx_bf16) nor AVX-512 BF16 (avx512_bf16)"
