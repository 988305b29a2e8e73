"""Tensor and data parallelism on 8 fake CPU devices (tests/conftest.py sets XLA_FLAGS).

References are independent of the code under test: the single-device engine (its
tokens and logits), the oracle's greedy tokens for the real model, and shard shapes
written out by hand from the Megatron rules.
"""
from __future__ import annotations

import json
import types

import jax
import numpy as np
import pytest
from helpers import tiny_config
from jax.sharding import PartitionSpec as P

from jaxinfer import LLM, SamplingParams
from jaxinfer.distributed import sharding
from jaxinfer.engine.dp_router import DataParallelRouter, least_loaded
from jaxinfer.runner.model_runner import CompileCounter
from jaxinfer.models.params import init_params

CFG = tiny_config(vocab=256, hidden=64, layers=2, heads=8, kv_heads=4, inter=128)  # D 64, H 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PROMPTS = [[5, 17, 99, 3, 250, 7], [42, 42, 8], [200, 1, 9, 9, 31, 64, 128, 77, 12, 3, 5]]


def tiny_llm(tp=1, dp=1, warmup=False, model="tiny", **kw):
    args = dict(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=32, num_blocks=24, warmup=warmup,
                return_logits=True, enable_prefix_caching=False, tensor_parallel_size=tp, data_parallel_size=dp)
    args.update(kw)
    if "load_format" not in kw and "model_config" not in kw:
        args.update(model_config=CFG, params=init_params(CFG, seed=0, scale=8.0), tokenizer=None)
    return LLM(model, **args)


def generate(llm, prompts=PROMPTS, sp=GREEDY):
    outs = llm.generate(prompts, sp, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], [np.array(o.outputs[0].logits) for o in outs]


@pytest.fixture(scope="module")
def single_device():
    return generate(tiny_llm())


def shard_shapes(x) -> set[tuple[int, ...]]:
    return {tuple(s.data.shape) for s in x.addressable_shards}


# ----- the rules (shapes only) ------------------------------------------------------------
def test_megatron_rules_when_everything_divides():
    specs = sharding.param_partition_specs(CFG, 4)
    attn, mlp = specs["layers"]["attn"], specs["layers"]["mlp"]
    assert attn["q_proj"]["kernel"] == P(None, None, "model")  # [L, D, N, H]: column-parallel by heads
    assert attn["k_proj"]["kernel"] == P(None, None, "model")
    assert attn["o_proj"]["kernel"] == P(None, "model")  # [L, N, H, D]: row-parallel
    assert mlp["gate_proj"]["kernel"] == mlp["up_proj"]["kernel"] == P(None, None, "model")
    assert mlp["down_proj"]["kernel"] == P(None, "model")
    assert specs["embed"]["embedding"] == P("model")  # [V, D]: vocab-parallel
    assert specs["lm_head"]["kernel"] == P(None, "model")  # [D, V]
    assert specs["final_norm"]["scale"] == specs["layers"]["input_norm"]["scale"] == P()
    assert sharding.kv_cache_spec(CFG, 4) == P(None, None, None, "model")
    assert sharding.replicated_axes(CFG, 4) == []


def test_axes_that_do_not_divide_are_replicated():
    smol = tiny_config(vocab=49152, hidden=576, layers=1, heads=9, kv_heads=3, inter=1536)  # SmolLM2's widths
    for tp in (2, 4):
        specs = sharding.param_partition_specs(smol, tp)
        assert specs["layers"]["attn"]["q_proj"]["kernel"] == P()
        assert specs["layers"]["attn"]["o_proj"]["kernel"] == P()
        assert specs["layers"]["mlp"]["gate_proj"]["kernel"] == P(None, None, "model")
        assert specs["embed"]["embedding"] == P("model")
        assert sharding.kv_cache_spec(smol, tp) == P()
        assert sharding.kv_heads_per_device(smol, tp) == 3
        assert sharding.replicated_axes(smol, tp) == ["heads", "kv_heads"]
    assert sharding.kv_cache_spec(smol, 3) == P(None, None, None, "model")  # 9 and 3 heads split at TP 3
    assert sharding.kv_heads_per_device(smol, 3) == 1


def test_make_mesh_is_auto_and_rejects_too_many_devices():
    mesh = sharding.make_mesh(4, 2)
    assert dict(mesh.shape) == {"data": 2, "model": 4}
    assert all(str(t).endswith("Auto") for t in mesh.axis_types)
    assert [m.devices.tolist() for m in sharding.replica_meshes(mesh)] == [
        [jax.devices()[:4]], [jax.devices()[4:8]]]
    with pytest.raises(ValueError, match="only 8"):
        sharding.make_mesh(8, 2)


def test_split_replicas_reuses_the_device_buffers():
    mesh = sharding.make_mesh(2, 2)
    shardings = sharding.param_shardings(CFG, mesh)
    placed = sharding.place_params(init_params(CFG), shardings)
    reps = sharding.split_replicas(placed, mesh)
    glob = {s.device: s.data.unsafe_buffer_pointer() for s in placed["embed"]["embedding"].addressable_shards}
    for rep, sub in zip(reps, sharding.replica_meshes(mesh)):
        x = rep["embed"]["embedding"]
        assert x.sharding.mesh.devices.tolist() == sub.devices.tolist() and shard_shapes(x) == {(128, 64)}
        assert all(s.data.unsafe_buffer_pointer() == glob[s.device] for s in x.addressable_shards)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(placed["embed"]["embedding"]))


def test_least_loaded_prefers_fewest_requests_then_most_free_blocks():
    E = lambda r, w, f: types.SimpleNamespace(num_running=r, num_waiting=w, num_free_blocks=f)  # noqa: E731
    assert least_loaded([E(2, 0, 50), E(1, 0, 10), E(0, 2, 90)]) == 1
    assert least_loaded([E(1, 1, 10), E(0, 2, 30), E(2, 0, 20)]) == 1
    assert least_loaded([E(0, 0, 5), E(0, 0, 5)]) == 0


# ----- tiny random model: sharded == single device ----------------------------------------
@pytest.mark.parametrize("tp,dp", [(2, 1), (4, 1), (2, 2)])
def test_tiny_sharded_matches_single_device(single_device, tp, dp):
    llm = tiny_llm(tp, dp)
    tokens, logits = generate(llm)
    ref_tokens, ref_logits = single_device
    assert tokens == ref_tokens
    for a, b in zip(logits, ref_logits):
        assert np.abs(a - b).max() <= 1e-4
    engines = llm.engine.engines if dp > 1 else [llm.engine]
    assert isinstance(llm.engine, DataParallelRouter) == (dp > 1)
    used = set()
    for e in engines:
        r = e.runner
        L, D, N, K, H, F, V = 2, 64, 8, 4, 8, 128, 256
        p = r.params
        assert shard_shapes(p["layers"]["attn"]["q_proj"]["kernel"]) == {(L, D, N // tp, H)}
        assert shard_shapes(p["layers"]["attn"]["k_proj"]["kernel"]) == {(L, D, K // tp, H)}
        assert shard_shapes(p["layers"]["attn"]["o_proj"]["kernel"]) == {(L, N // tp, H, D)}
        assert shard_shapes(p["layers"]["mlp"]["gate_proj"]["kernel"]) == {(L, D, F // tp)}
        assert shard_shapes(p["layers"]["mlp"]["down_proj"]["kernel"]) == {(L, F // tp, D)}
        assert shard_shapes(p["embed"]["embedding"]) == {(V // tp, D)}
        assert shard_shapes(p["lm_head"]["kernel"]) == {(D, V // tp)}
        assert shard_shapes(p["final_norm"]["scale"]) == {(D,)}
        for cache in (r.k_cache, r.v_cache):
            assert cache.sharding.spec == P(None, None, None, "model")
            assert shard_shapes(cache) == {(L, 24, 16, K // tp, H)} and len(cache.addressable_shards) == tp
        devs = {d.id for d in r.k_cache.sharding.device_set}
        assert not devs & used  # each replica on its own devices
        used |= devs
    if dp > 1:
        assert all(e.stats.num_steps > 0 for e in engines)  # the router used every replica
        assert not llm.engine.requests and llm.engine.num_free_blocks == llm.engine.num_total_blocks


def test_dummy_weights_init_sharded_and_no_recompilation_after_warmup(tmp_path):
    """--load-format dummy with TP: weights created in their shards (same values as the
    unsharded init); after warm-up, serving compiles nothing (DP 2 x TP 2)."""
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(CFG.to_hf_dict()))
    ref = generate(tiny_llm(load_format="dummy", model=str(path)), PROMPTS[:2])[0]
    llm = LLM(str(path), load_format="dummy", tensor_parallel_size=2, data_parallel_size=2, max_model_len=64,
              max_num_seqs=4, max_num_batched_tokens=16, num_blocks=24, warmup=True, enable_prefix_caching=False)
    emb = llm.engine.engines[0].runner.params["embed"]["embedding"]
    assert shard_shapes(emb) == {(128, 64)}
    CompileCounter.install()
    before, runner_before = CompileCounter.count, llm.engine.snapshot().compilations
    tokens = generate(llm, PROMPTS[:2] * 3)[0]
    assert tokens == ref * 3
    assert CompileCounter.count == before and llm.engine.snapshot().compilations == runner_before


# ----- the real model against the oracle ----------------------------------------------------
@pytest.mark.real_model
def test_checkpoint_restored_straight_into_shards(smollm2_dir):
    """load_model with TP asks orbax for sharded arrays (device shards, not host numpy)."""
    from jaxinfer.engine.builder import load_model
    from jaxinfer.config import EngineConfig, ParallelConfig

    config = EngineConfig(model_path=str(smollm2_dir), parallel=ParallelConfig(tensor_parallel_size=4))
    _, params, _, _ = load_model(config)
    emb, up = params["embed"]["embedding"], params["layers"]["mlp"]["up_proj"]["kernel"]
    assert isinstance(emb, jax.Array) and emb.sharding.spec == P("model")
    assert shard_shapes(emb) == {(49152 // 4, 576)} and len(emb.addressable_shards) == 4
    assert shard_shapes(up) == {(30, 576, 1536 // 4)}



@pytest.fixture(scope="module")
def oracle_run(smollm2_dir, oracle):
    recs = oracle["results"][:3]
    sp = SamplingParams(temperature=0.0, max_tokens=16)

    runs = {}

    def run(tp, dp):
        if (tp, dp) in runs:
            return runs[tp, dp]
        llm = LLM(str(smollm2_dir), max_model_len=64, max_num_seqs=4, max_num_batched_tokens=64, num_blocks=32,
                  warmup=False, return_logits=True, enable_prefix_caching=False, tensor_parallel_size=tp,
                  data_parallel_size=dp)
        runs[tp, dp] = llm, generate(llm, [r["prompt_ids"] for r in recs], sp)
        return runs[tp, dp]

    return recs, run, run(1, 1)[1]


@pytest.mark.real_model
@pytest.mark.parametrize("tp,dp", [(1, 1), (2, 1), (4, 1), (4, 2)])
def test_smollm2_sharded_matches_oracle_and_single_device(oracle_run, tp, dp):
    recs, run, (ref_tokens, ref_logits) = oracle_run
    llm, (tokens, logits) = run(tp, dp)
    for rec, t in zip(recs, tokens):
        assert t == rec["generated_ids"][:16], rec["index"]
    assert tokens == ref_tokens
    for a, b in zip(logits, ref_logits):
        # float32 over 30 layers with a different reduction order: |diff| <= 1e-4 + 1e-5 |logit|
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
    if tp > 1:  # restored from orbax straight into shards: vocab and MLP split, attention replicated
        e = llm.engine.engines[0] if dp > 1 else llm.engine
        p = e.runner.params
        assert shard_shapes(p["embed"]["embedding"]) == {(49152 // tp, 576)}
        assert shard_shapes(p["layers"]["mlp"]["up_proj"]["kernel"]) == {(30, 576, 1536 // tp)}
        assert shard_shapes(p["layers"]["attn"]["q_proj"]["kernel"]) == {(30, 576, 9, 64)}
        assert shard_shapes(e.runner.k_cache) == {(30, 32, 16, 3, 64)}


# ----- the Pallas backend under tensor parallelism ---------------------------------------------
CFG_KV3 = tiny_config(vocab=256, hidden=48, layers=2, heads=6, kv_heads=3, inter=128)  # K = 3: replicated at TP 2


@pytest.mark.parametrize("cfg,tp", [(CFG, 2), (CFG, 4), (CFG_KV3, 2)], ids=["K4-tp2", "K4-tp4", "K3-tp2-replicated"])
def test_pallas_backend_sharded_matches_single_device_xla(cfg, tp):
    """``--attention-backend pallas`` with TP runs the kernel per shard (shard_map over the
    heads): same tokens and logits as one device on the XLA path, and the compiled step never
    materialises the whole KV cache on a device when the cache is split over K."""
    def llm(**kw):
        return tiny_llm(model_config=cfg, params=init_params(cfg, seed=0, scale=8.0), tokenizer=None, **kw)

    ref_tokens, ref_logits = generate(llm(attention_backend="xla"))
    sharded = llm(tensor_parallel_size=tp, attention_backend="pallas")
    tokens, logits = generate(sharded)
    assert tokens == ref_tokens
    for a, b in zip(logits, ref_logits):
        assert np.abs(a - b).max() <= 1e-4
    runner = sharded.engine.runner
    K, H = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    whole_cache = f"f32[{cfg.num_hidden_layers},24,16,{K},{H}]"
    split = K % tp == 0
    assert shard_shapes(runner.k_cache) == {(cfg.num_hidden_layers, 24, 16, K // tp if split else K, H)}
    if split:
        for executable in runner._executables.values():
            assert whole_cache not in executable.as_text()
    assert not sharded.engine.requests and sharded.engine.num_free_blocks == sharded.engine.num_total_blocks
