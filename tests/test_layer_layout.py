"""The unrolled layer layout: the one-time split of stacked layer weights, and the runner's
unrolled one-token step against the scanned one.

References: the stacked arrays themselves (each per-layer array is that layer's slice),
the Megatron shard shapes written out by hand, and the same engine with every bucket
scanned (``JAXINFER_UNROLL_MAX_TOKENS=0``). The variable's parsing and the CPU default are
checked too (the suite itself scans by default, tests/conftest.py).
"""
from __future__ import annotations

import jax
import numpy as np
import pytest
from helpers import tiny_config

from jaxinfer import LLM, SamplingParams
from jaxinfer.distributed import sharding
from jaxinfer.platform import execution_plan
from jaxinfer.models.layer_layout import unstack_layers
from jaxinfer.models.params import init_params

CFG = tiny_config(vocab=256, hidden=64, layers=3, heads=8, kv_heads=4, inter=128)  # H 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [[5, 17, 99, 3, 250, 7], [42, 42, 8], [200, 1, 9, 9, 31, 64, 128, 77, 12, 3, 5]]


def test_unstack_layers_gives_each_layer_its_own_slice():
    params = jax.device_put(init_params(CFG, seed=0))
    out = unstack_layers(params, CFG.num_hidden_layers)
    assert sorted(out) == sorted(["embed", "final_norm", "lm_head"] + [f"layers_{i}" for i in range(3)])
    assert out["embed"] is params["embed"] and out["lm_head"] is params["lm_head"]
    for i in range(3):
        got = jax.tree.map(np.asarray, out[f"layers_{i}"])
        want = jax.tree.map(lambda x: np.asarray(x)[i], params["layers"])
        assert jax.tree.structure(got) == jax.tree.structure(want)
        jax.tree.map(np.testing.assert_array_equal, got, want)
    with pytest.raises(ValueError, match="does not have 4 layers"):
        unstack_layers(params, 4)
    with pytest.raises(ValueError, match="no stacked"):
        unstack_layers({"embed": params["embed"]}, 3)


def test_unstacked_layers_keep_their_tensor_parallel_axes():
    mesh = sharding.make_mesh(tensor_parallel_size=2)
    params = sharding.place_params(init_params(CFG, seed=0), sharding.param_shardings(CFG, mesh))
    layer = unstack_layers(params, CFG.num_hidden_layers)["layers_1"]
    D, N, K, H, F = 64, 8, 4, 8, 128
    shapes = lambda x: {tuple(s.data.shape) for s in x.addressable_shards}  # noqa: E731
    assert shapes(layer["attn"]["q_proj"]["kernel"]) == {(D, N // 2, H)}
    assert shapes(layer["attn"]["k_proj"]["kernel"]) == {(D, K // 2, H)}
    assert shapes(layer["attn"]["o_proj"]["kernel"]) == {(N // 2, H, D)}
    assert shapes(layer["mlp"]["gate_proj"]["kernel"]) == {(D, F // 2)}
    assert shapes(layer["mlp"]["down_proj"]["kernel"]) == {(F // 2, D)}
    assert shapes(layer["input_norm"]["scale"]) == {(D,)}
    assert len(layer["mlp"]["up_proj"]["kernel"].addressable_shards) == 2


def _generate(unroll: int, monkeypatch):
    monkeypatch.setenv(execution_plan.UNROLL_ENV_VAR, str(unroll))
    llm = LLM("tiny", model_config=CFG, params=init_params(CFG, seed=0, scale=8.0), tokenizer=None,
              max_model_len=64, max_num_seqs=4, max_num_batched_tokens=32, num_blocks=24, warmup=False,
              return_logits=True, enable_prefix_caching=False)
    outs = [llm.generate([p], GREEDY, use_tqdm=False)[0] for p in PROMPTS]  # one at a time: T = 1 steps
    runner = llm.engine.runner
    unrolled = sorted(b.num_tokens for b in runner._executables if runner._unrolled(b))
    return [o.outputs[0].token_ids for o in outs], [np.array(o.outputs[0].logits) for o in outs], unrolled


def test_unrolled_decode_step_matches_the_scanned_one(monkeypatch):
    tokens, logits, unrolled = _generate(1, monkeypatch)
    ref_tokens, ref_logits, none = _generate(0, monkeypatch)
    assert unrolled and set(unrolled) == {1} and none == []  # the lone stream's decode steps ran unrolled
    assert tokens == ref_tokens
    for a, b in zip(logits, ref_logits):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_unroll_default_comes_from_the_environment():
    """`execution_plan.unroll_from_env` is a function of the environment it is given."""
    env, unroll = execution_plan.UNROLL_ENV_VAR, execution_plan.unroll_from_env
    assert unroll({}, "cpu", packed=False) == execution_plan.UNROLL_MAX_TOKENS == 1  # CPU default
    assert unroll({}, "cpu", packed=True) == 0  # packed weights serve one row scanned
    assert unroll({}, "gpu", packed=False) == 0
    assert unroll({env: "0"}, "cpu", packed=False) == 0
    assert unroll({env: "1"}, "cpu", packed=True) == 1  # the environment wins
    for bad in ("-1", "one", ""):
        with pytest.raises(ValueError, match="non-negative integer"):
            unroll({env: bad}, "cpu", packed=False)
