"""Mixture of experts (Mixtral; Qwen3-MoE where registered) against transformers on small random
checkpoints made here (tests/moe_helpers.py), converted by jaxinfer's own converter.

Greedy tokens equal transformers' up to the first near-tie and first-step logits within 1e-4,
on one device, at TP 2, EP 4 and EP 2 x TP 2 (8 host devices, tests/conftest.py; Qwen3-MoE and
the Qwen3-30B-A3B compile in the slow suite); the same
tokens batched, under preemption and with prefix caching; no compilation after warm-up under a
routing that sends every token to the same experts and then one that spreads them; malformed
checkpoints refused at conversion with one line; the routing and expert math against NumPy.
"""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from helpers import borrowed_runner
from jaxinfer import LLM, SamplingParams
from jaxinfer.config import ModelConfig
from jaxinfer.layers import moe
from jaxinfer.weights.convert import convert
from moe_helpers import MIXTRAL, PROMPTS, QWEN3_MOE, agree_until_near_tie, hf_greedy, make_hf_checkpoint

STEPS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
# Qwen3-MoE (q/k norms, a dense layer among sparse ones) runs in the slow suite (~35 s more)
FAMILIES = [pytest.param(MIXTRAL, id="MixtralForCausalLM"),
            pytest.param(QWEN3_MOE, id="Qwen3MoeForCausalLM", marks=pytest.mark.slow)]
LAYOUTS = {"1": {}, "tp2": {"tensor_parallel_size": 2},
           "ep4": {"tensor_parallel_size": 4, "enable_expert_parallel": True},
           "ep2xtp2": {"tensor_parallel_size": 4, "enable_expert_parallel": True, "expert_parallel_size": 2}}


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory):
    """(converted folder, transformers' greedy references per prompt)."""
    root = tmp_path_factory.mktemp(request.param["cls"])
    model = make_hf_checkpoint(request.param, root / "hf")
    refs = [hf_greedy(model, p, STEPS) for p in PROMPTS]
    return convert(root / "hf", root / "jax"), refs


def make_llm(folder, **kw):
    return LLM(str(folder), dtype="float32", max_model_len=64, max_num_seqs=8, max_num_batched_tokens=64,
               num_blocks=48, warmup=False, return_logits=True, use_tqdm=False, **kw)


def check_against_hf(llm, refs):
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    for prompt, out, (want, margins, first) in zip(PROMPTS, outs, refs):
        got = out.outputs[0].token_ids
        assert agree_until_near_tie(got, want, margins), (prompt, got, want, margins)
        np.testing.assert_allclose(out.outputs[0].logits[0], first, atol=1e-4, rtol=0)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_greedy_and_logits_equal_transformers(checkpoint, layout):
    folder, refs = checkpoint
    llm = make_llm(folder, **LAYOUTS[layout])
    check_against_hf(llm, refs)
    e = llm.engine if hasattr(llm.engine, "runner") else None
    if e is not None:
        assert e.num_free_blocks == e.num_total_blocks


def test_expert_parallel_splits_the_experts(checkpoint):
    folder, _ = checkpoint
    cfg = ModelConfig.from_dir(folder)
    for layout, (experts, width) in {"ep4": (cfg.num_experts // 4, cfg.moe_intermediate_size),
                                     "ep2xtp2": (cfg.num_experts // 2, cfg.moe_intermediate_size // 2),
                                     "tp2": (cfg.num_experts, cfg.moe_intermediate_size // 2)}.items():
        from jaxinfer.distributed import sharding

        kw = LAYOUTS[layout]
        mesh = sharding.make_mesh(kw["tensor_parallel_size"],
                                  expert_parallel_size=kw.get("expert_parallel_size", kw["tensor_parallel_size"])
                                  if kw.get("enable_expert_parallel") else 1)
        specs = sharding.param_shardings(cfg, mesh)["layers"]["moe"]
        shape = (cfg.num_hidden_layers, cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        assert specs["gate_proj"].shard_shape(shape) == (cfg.num_hidden_layers, experts, cfg.hidden_size, width), layout


def test_batched_preempted_and_prefix_cached_give_the_same_tokens(checkpoint):
    folder, refs = checkpoint
    llm = make_llm(folder, enable_prefix_caching=True)
    alone = [llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS]
    batched = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert batched == alone
    shared = [PROMPTS[4] + [9, 9], PROMPTS[4] + [10]]  # a 34-token prefix: two cached blocks
    first = [o.outputs[0].token_ids for o in llm.generate(shared, GREEDY, use_tqdm=False)]
    again = [o.outputs[0].token_ids for o in llm.generate(shared, GREEDY, use_tqdm=False)]
    assert again == first
    longer = GREEDY.replace(max_tokens=24)
    alone24 = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, longer, use_tqdm=False)]
    with borrowed_runner(llm.engine, num_blocks=6) as small:  # 5 blocks of 16 for 14 blocks of work: preemption
        for i, p in enumerate(PROMPTS):
            small.add_request(str(i), p, longer)
        outs: dict[str, list[int]] = {}
        while small.has_unfinished_requests():
            for out in small.step():
                if out.finished:
                    outs[out.request_id] = out.outputs[0].token_ids
        assert small.scheduler.num_preemptions > 0
    assert [outs[str(i)] for i in range(len(PROMPTS))] == alone24
    for (want, margins, _), got in zip(refs, alone):
        assert agree_until_near_tie(got, want, margins)


def _skewing_params(cfg: ModelConfig, seed: int = 0):
    """Random params where tokens 3..99 send every token to experts 0 and 1 in every layer
    (their embeddings point along one axis and the routers read only that axis for 0 and 1),
    while tokens 100.. spread."""
    from jaxinfer.models.params import init_params

    params = init_params(cfg, seed=seed, scale=10.0)
    rs = np.random.RandomState(seed)
    emb = params["embed"]["embedding"]
    emb[3:100] = 0.05 * rs.standard_normal(emb[3:100].shape)
    emb[3:100, 0] = 3.0
    router = params["layers"]["moe"]["router"]
    router[:, 0, :2] = 0.0
    router[:, 0, 0], router[:, 0, 1] = 40.0, 30.0
    return params


def test_no_compilation_after_warmup_whatever_the_routing():
    from jaxinfer.runner.model_runner import CompileCounter

    cfg = ModelConfig.from_dict(dict(MIXTRAL["config"], model_type="mixtral", num_local_experts=8))
    params = _skewing_params(cfg)
    llm = LLM("tiny-moe", max_model_len=48, max_num_seqs=2, max_num_batched_tokens=16, num_blocks=16,
              model_config=cfg, params=params, tokenizer=None, warmup=True, use_tqdm=False)
    runner = llm.engine.runner
    before = (CompileCounter.count, runner.num_compilations)
    rs = np.random.RandomState(1)
    skewed = [rs.randint(3, 100, n).tolist() for n in (5, 17)]
    spread = [rs.randint(100, cfg.vocab_size, n).tolist() for n in (5, 17)]
    for batch in (skewed, spread, skewed + spread):
        llm.generate(batch, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert (CompileCounter.count, runner.num_compilations) == before
    # the loads did route as intended (first layer: the normed embedding times the router)
    emb, router = params["embed"]["embedding"], params["layers"]["moe"]["router"][0]
    def top(ids):
        h = emb[ids] / np.linalg.norm(emb[ids], axis=-1, keepdims=True)
        return np.argsort(-h @ router)[:, :2]

    assert {tuple(sorted(r)) for r in top(sum(skewed, []))} == {(0, 1)}
    assert len(set(top(sum(spread, [])).ravel())) >= 6


# ---------------------------------------------------------------- malformed checkpoints

@pytest.fixture(scope="module")
def mixtral_hf(tmp_path_factory):
    root = tmp_path_factory.mktemp("malformed")
    make_hf_checkpoint(MIXTRAL, root / "hf")
    return root / "hf"


def _broken_copy(src, dst, edit_tensors=None, edit_config=None):
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            tensors = load_file(str(f))
            save_file(edit_tensors(tensors) if edit_tensors else tensors, str(dst / f.name))
        elif f.name == "config.json" and edit_config:
            (dst / f.name).write_text(json.dumps(edit_config(json.loads(f.read_text()))))
        else:
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _one_line_error(src, out, match):
    with pytest.raises(ValueError, match=match) as ei:
        convert(src, out)
    assert "\n" not in str(ei.value)


def test_missing_expert_tensor_fails_at_conversion(mixtral_hf, tmp_path):
    name = "model.layers.1.block_sparse_moe.experts.2.w3.weight"
    src = _broken_copy(mixtral_hf, tmp_path / "src", edit_tensors=lambda t: {k: v for k, v in t.items() if k != name})
    _one_line_error(src, tmp_path / "out", f"missing expert tensor {name}")


def test_expert_count_mismatch_fails_at_conversion(mixtral_hf, tmp_path):
    fewer = _broken_copy(mixtral_hf, tmp_path / "fewer", edit_config=lambda c: dict(c, num_local_experts=3))
    _one_line_error(fewer, tmp_path / "out1", "expert count mismatch: .* is expert 3, but config.json says 3 experts")
    more = _broken_copy(mixtral_hf, tmp_path / "more", edit_config=lambda c: dict(c, num_local_experts=6))
    _one_line_error(more, tmp_path / "out2", "missing expert tensor .*experts.4.* 4 of the 6 experts")


def test_unknown_architecture_fails_at_conversion(mixtral_hf, tmp_path):
    src = _broken_copy(mixtral_hf, tmp_path / "src", edit_config=lambda c: dict(c, model_type="grok1"))
    _one_line_error(src, tmp_path / "out", "model_type 'grok1' is not supported")


# ---------------------------------------------------------------- the math against NumPy

def _numpy_moe(x, logits, k, renorm, wg, wu, wd):
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        top = np.argsort(-probs[t], kind="stable")[:k]
        w = probs[t, top] / (probs[t, top].sum() if renorm else 1.0)
        for e, we in zip(top, w):
            g, u = x[t] @ wg[e], x[t] @ wu[e]
            out[t] += we * ((g / (1 + np.exp(-g)) * u) @ wd[e])
    return out


@pytest.mark.parametrize("renorm", [True, False])
@pytest.mark.parametrize("impl", list(moe.EXPERT_IMPLS))
def test_experts_equal_numpy_and_split_experts_add_up(impl, renorm):
    rs = np.random.RandomState(3)
    t, d, f, e, k = 9, 16, 12, 6, 2
    x, logits = rs.standard_normal((t, d)), 2 * rs.standard_normal((t, e))
    logits[:4, 5] = 50.0  # skewed rows: all on expert 5
    wg, wu, wd = (0.3 * rs.standard_normal(s) for s in ((e, d, f), (e, d, f), (e, f, d)))
    want = _numpy_moe(x, logits, k, renorm, wg, wu, wd)
    f32 = lambda a: jax.numpy.asarray(a, jax.numpy.float32)  # noqa: E731
    w, ids = moe.route(f32(logits), k, renorm)
    run = moe.EXPERT_IMPLS[impl]
    got = run(f32(x), w, ids, f32(wg), f32(wu), f32(wd))
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)
    parts = sum(np.asarray(run(f32(x), w, ids, f32(wg[i:i + 2]), f32(wu[i:i + 2]), f32(wd[i:i + 2]), expert_offset=i))
                for i in (0, 2, 4))  # expert parallelism's local steps add up to the whole
    np.testing.assert_allclose(parts, want, atol=1e-4, rtol=1e-4)


def test_sparse_layer_pattern_follows_transformers():
    base = dict(MIXTRAL["config"], model_type="mixtral")
    cfg = ModelConfig.from_dict(base)
    assert cfg.sparse_layers == (True, True) and not cfg.has_dense_mlp
    import dataclasses

    mixed = dataclasses.replace(cfg, num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=(3,))
    assert mixed.sparse_layers == (False, True, False, False, False, True)
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        dataclasses.replace(cfg, num_experts_per_tok=9)


# ---------------------------------------------------------------- GGUF (llama.cpp's layout)

@pytest.mark.parametrize("spec", [MIXTRAL, QWEN3_MOE], ids=["mixtral-as-llama", "qwen3moe"])
def test_gguf_converts_to_the_safetensors_conversion(spec, tmp_path):
    from moe_helpers import write_moe_gguf
    from test_convert import flat, make_tiny_tokenizer

    from jaxinfer.weights.checkpoint import load_params

    src = tmp_path / "hf"
    make_hf_checkpoint(spec, src, vocab_size=290)  # make_tiny_tokenizer's vocabulary
    make_tiny_tokenizer(src)
    gguf_path = write_moe_gguf(src, src, tmp_path / "tiny.gguf")
    from_hf, from_gguf = convert(src, tmp_path / "from_hf"), convert(gguf_path, tmp_path / "from_gguf")
    cfg = ModelConfig.from_dir(from_gguf)
    assert cfg == ModelConfig.from_dir(from_hf) and cfg.is_moe
    a, b = flat(load_params(from_hf)), flat(load_params(from_gguf))
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# ---------------------------------------------------------------- Qwen3-30B-A3B at EP 8, abstract weights

@pytest.mark.slow
def test_qwen3_30b_a3b_compiles_at_ep8_with_the_planned_weight_bytes():
    """The real layer and expert counts (48 layers, 128 experts, top 8), weights and KV as
    ShapeDtypeStructs in their shardings (nothing allocated), the engine's decode step lowered
    and compiled on the 8 host devices at EP 8: XLA's per-device argument bytes minus the KV
    pool's are the planner's weight bytes within 10% (benchmarks/results/2026-12-06-moe-ep8-compile/)."""
    from pathlib import Path

    from jaxinfer.config import CacheConfig, EngineConfig, ParallelConfig, SchedulerConfig
    from jaxinfer.engine import step_check
    from jaxinfer.entrypoints.plan import load_config

    path = Path(__file__).resolve().parents[1] / "configs" / "qwen3-30b-a3b.json"
    cfg = load_config(str(path))
    assert (cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_tok) == (48, 128, 8)
    config = EngineConfig(model_path=str(path), dtype="bfloat16", warmup=False,
                          parallel=ParallelConfig(8, 1, enable_expert_parallel=True),
                          scheduler=SchedulerConfig(max_model_len=4096), cache=CacheConfig(num_blocks=512))
    r = step_check.check_step(cfg, config, 80 * 2**30, buckets=("decode",), cuda=False, sampler=False)
    b = r.buckets[0]
    xla_weights = b.memory["argument"] - r.planner_kv_bytes
    assert abs(xla_weights - r.planner_weight_bytes) <= 0.10 * r.planner_weight_bytes
    assert r.planner_weight_bytes < 8 * 2**30  # 1/8 of the experts each: 7.3 GiB of the 57 GiB
    assert not any(c.kind == "all-to-all" for c in b.collectives)


def test_expert_parallel_flags_are_checked():
    from jaxinfer.config import ParallelConfig
    import argparse

    from jaxinfer.config.args import add_engine_args, parallel_config

    assert ParallelConfig(4, enable_expert_parallel=True).expert_parallel_degree == 4
    assert ParallelConfig(4, enable_expert_parallel=True, expert_parallel_size=2).expert_parallel_degree == 2
    assert ParallelConfig(4).expert_parallel_degree == 1
    with pytest.raises(ValueError, match="needs enable_expert_parallel"):
        ParallelConfig(4, expert_parallel_size=2)
    with pytest.raises(ValueError, match="divide tensor_parallel_size"):
        ParallelConfig(4, enable_expert_parallel=True, expert_parallel_size=3)
    parser = argparse.ArgumentParser()
    add_engine_args(parser, ("parallel",))
    args = parser.parse_args(["--tensor-parallel-size", "4", "--enable-expert-parallel", "--expert-parallel-size", "2"])
    assert parallel_config(args).expert_parallel_degree == 2
