"""bfloat16 weights on XLA:CPU (`jaxinfer.layers.cpu_bf16`): the one-row products equal
``lax.dot_general``, bit storage round-trips, and the compiled steps of a bfloat16 model
convert no weight to float32. (The real model's bfloat16 output: tests/test_oracle.py.)"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tiny_config
from jaxinfer import LLM, SamplingParams
from jaxinfer.layers import cpu_bf16
from jaxinfer.models.params import init_params

RS = np.random.RandomState(0)


def bf16(*shape):
    return jnp.asarray(RS.standard_normal(shape), jnp.bfloat16)


def reference(lhs, rhs, dims):
    return jax.lax.dot_general(lhs, rhs, dims, preferred_element_type=jnp.float32)


@pytest.mark.parametrize("lhs_shape,rhs_shape,n_in", [
    ((1, 64), (64, 4, 16), 1),     # q_proj: [T, D] x [D, N, H]
    ((1, 4, 16), (4, 16, 64), 2),  # o_proj: [T, N, H] x [N, H, D]
    ((1, 64), (64, 96), 1),        # MLP
])
def test_one_row_product_equals_dot_general(lhs_shape, rhs_shape, n_in):
    lhs, rhs = bf16(*lhs_shape), bf16(*rhs_shape)
    dims = ((tuple(range(len(lhs_shape) - n_in, len(lhs_shape))), tuple(range(n_in))), ((), ()))
    got = jax.jit(cpu_bf16.dot_general, static_argnums=2)(lhs, rhs, dims)
    want = reference(lhs, rhs, dims)
    assert got.shape == want.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_several_rows_and_float32_pass_through():
    dims = (((1,), (0,)), ((), ()))
    lhs, rhs = bf16(3, 64), bf16(64, 32)
    np.testing.assert_array_equal(np.asarray(cpu_bf16.dot_general(lhs, rhs, dims)), np.asarray(reference(lhs, rhs, dims)))
    lhs32, rhs32 = lhs[:1].astype(jnp.float32), rhs.astype(jnp.float32)
    np.testing.assert_array_equal(np.asarray(cpu_bf16.dot_general(lhs32, rhs32, dims)),
                                  np.asarray(reference(lhs32, rhs32, dims)))


@pytest.mark.parametrize("rows", [1, 3])
def test_tied_logits_equal_einsum(rows):
    x, table = bf16(rows, 64), bf16(256, 64)
    got = jax.jit(cpu_bf16.tied_logits)(x, table)
    want = jnp.einsum("rd,vd->rv", x, table, preferred_element_type=jnp.float32)
    assert got.shape == (rows, 256)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_bits_round_trip_and_take_rows():
    tree = {"w": bf16(2, 8, 4), "scale": jnp.ones((3,), jnp.float32)}
    bits = cpu_bf16.weights_as_bits(tree)
    assert bits["w"].dtype == cpu_bf16.BITS and bits["scale"].dtype == jnp.float32
    back = cpu_bf16.bits_as_bfloat16(bits)
    np.testing.assert_array_equal(np.asarray(back["w"]), np.asarray(tree["w"]))
    table, ids = bf16(50, 8), jnp.asarray([3, 0, 49, 3], jnp.int32)
    np.testing.assert_array_equal(np.asarray(jax.jit(cpu_bf16.take_rows)(table, ids)), np.asarray(table[ids]))


def test_compiled_bfloat16_steps_convert_no_weight_to_float32():
    """Before `cpu_bf16`, XLA:CPU converted the whole bfloat16 layer stack (the scan's
    dynamic-slice) and the whole embedding table (the lookup's gather) to float32 on every
    step, and a one-row product went a path that was 6x slower than float32. The compiled
    scanned (several tokens) and unrolled (one token) steps must hold no float32 array of a
    weight's shape, stacked or per layer."""
    cfg = tiny_config(vocab=256, hidden=64, layers=2, inter=96, tied=True)
    llm = LLM("tiny", dtype="bfloat16", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32, num_blocks=64,
              model_config=cfg, params=init_params(cfg, "bfloat16", seed=1), tokenizer=None, warmup=False,
              enable_prefix_caching=False)
    runner = llm.engine.runner
    # the suite runs on CPU; on an AMX CPU the kernels with a packed copy are not held at all
    layers = jax.tree.leaves(runner.params["layers"])
    assert layers and all(x.dtype == cpu_bf16.BITS for x in layers)
    outs = llm.generate([[5, 6, 7, 8, 9]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True),
                        use_tqdm=False)
    assert len(outs[0].outputs[0].token_ids) == 4
    D, F, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    weights = [f"{L},{D},{F}", f"{L},{F},{D}", f"{D},{F}", f"{F},{D}", f"{V},{D}"]
    pattern = re.compile(r"f32\[(" + "|".join(weights) + r")\]")
    tokens = set()
    for bucket, executable in runner._executables.items():
        tokens.add(bucket.num_tokens)
        assert not pattern.search(executable.as_text()), bucket
    assert 1 in tokens and max(tokens) > 1  # both layouts were compiled and checked
