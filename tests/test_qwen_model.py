"""Qwen2 and Qwen3 (dense) against transformers' own ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM``
on tiny random checkpoints that transformers writes here (`qwen_helpers`), converted by
`jaxinfer.weights.convert`: first-step logits within 1e-4 and greedy tokens equal up to the
first near-tie, alone, batched with other requests, under preemption and with prefix caching,
at 1 device and at TP 2 (8 fake CPU devices, tests/conftest.py), on the XLA and Pallas
(interpret) attention backends.

What each model exercises:
  qwen2: q/k/v biases (none on o_proj), tied embeddings, RoPE theta 1e6, GQA 2:1, and
    ``use_sliding_window`` with ``max_window_layers`` 1: layer 0 full, layer 1 a window of 8.
  qwen3: per-head q/k RMSNorm, head_dim 32 where hidden / heads is 16, untied LM head, yarn
    RoPE scaling (factor 4 over 64 positions) under transformers 5's ``rope_parameters``.

Compiles dominate the time: one engine per family (module scope), no warm-up, small limits.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import borrowed_runner, run_until_idle
from jaxinfer import LLM, SamplingParams
from jaxinfer.config import ModelConfig
from jaxinfer.weights.checkpoint import load_params
from jaxinfer.weights.convert import convert
from qwen_helpers import assert_greedy_matches, hf_greedy, hf_logits, hf_qwen, save_hf

FAMILIES = {
    "qwen2": dict(tie_word_embeddings=True, rope_theta=1e6, use_sliding_window=True, sliding_window=8,
                  max_window_layers=1),
    "qwen3": dict(head_dim=32, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                   "rope_theta": 1e6}),
}
N_NEW = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=N_NEW, ignore_eos=True)
ENGINE = dict(max_model_len=96, max_num_seqs=8, max_num_batched_tokens=32, num_blocks=48, tokenizer=None,
              warmup=False, return_logits=True, use_tqdm=False)


def prompts(lengths, seed=0):
    rs = np.random.RandomState(seed)
    return [rs.randint(3, 256, n).tolist() for n in lengths]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def qwen(request, tmp_path_factory):
    """(family, transformers model, converted ModelConfig, params, warm 1-device engine)."""
    family = request.param
    hf = hf_qwen(family, **FAMILIES[family])
    root = tmp_path_factory.mktemp(family)
    out = convert(save_hf(hf, root / "hf"), root / "converted")
    cfg, params = ModelConfig.from_dir(out), load_params(out)
    llm = LLM(f"tiny-{family}", model_config=cfg, params=params, **ENGINE)
    return family, hf, cfg, params, llm


def test_converted_config_has_the_family_switches(qwen):
    family, hf, cfg, params, _ = qwen
    assert cfg.model_type == family
    if family == "qwen2":
        assert cfg.qkv_bias and not cfg.o_proj_bias and not cfg.qk_norm and cfg.tie_word_embeddings
        assert cfg.layer_types == ("full_attention", "sliding_attention") and cfg.sliding_window == 8
        assert params["layers"]["attn"]["q_bias"].shape == (2, 4, 16) and "lm_head" not in params
    else:
        assert cfg.qk_norm and not cfg.qkv_bias and cfg.head_dim == 32 != cfg.hidden_size // cfg.num_attention_heads
        assert cfg.rope_scaling.rope_type == "yarn" and cfg.rope_scaling.original_max_position_embeddings == 64
        assert params["layers"]["attn"]["q_norm"]["scale"].shape == (2, 32) and "lm_head" in params


def test_config_round_trips_through_transformers(qwen):
    import transformers

    family, _, cfg, _, _ = qwen
    cls = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[family]
    hf_cfg = cls(**{k: v for k, v in cfg.to_hf_dict().items() if k != "architectures"})
    assert ModelConfig.from_dict(hf_cfg.to_dict()) == cfg


def test_first_logits_and_greedy_match_transformers(qwen):
    """One prompt at a time (prefill in 32-token chunks past the window and a block edge)."""
    _, hf, _, _, llm = qwen
    for p in prompts([5, 37], seed=1):
        out = llm.generate([p], GREEDY)[0].outputs[0]
        np.testing.assert_allclose(out.logits[0], hf_logits(hf, p)[-1], atol=1e-4, rtol=0)
        want, margins = hf_greedy(hf, p, N_NEW)
        assert_greedy_matches(out.token_ids, want, margins, f"prompt of {len(p)}")


def test_batched_with_other_requests_equals_transformers(qwen):
    _, hf, _, _, llm = qwen
    ps = prompts([1, 7, 8, 9, 16, 17, 30, 40], seed=2)
    mixed = [GREEDY if i % 2 == 0 else SamplingParams(temperature=0.9, top_k=7, seed=i, max_tokens=N_NEW)
             for i in range(len(ps))]
    outs = llm.generate(ps, mixed)
    for i in range(0, len(ps), 2):
        want, margins = hf_greedy(hf, ps[i], N_NEW)
        assert_greedy_matches(outs[i].outputs[0].token_ids, want, margins, f"prompt {i}")


def test_preemption_and_prefix_cache_keep_outputs(qwen):
    _, _, _, _, llm = qwen
    shared = prompts([24], seed=9)[0]  # 1.5 blocks, 3 windows
    ps = [shared + t for t in prompts([5, 12, 19, 3, 9, 15], seed=5)]
    ref = [o.outputs[0].token_ids for o in llm.generate(ps, GREEDY)]
    with borrowed_runner(llm.engine, 7) as e:  # 6 usable blocks for 6 requests that need ~20
        for i, p in enumerate(ps):
            e.add_request(str(i), p, GREEDY)
        done = run_until_idle(e)
        assert e.scheduler.num_preemptions > 0
        assert [done[str(i)].outputs[0].token_ids for i in range(len(ps))] == ref
    with borrowed_runner(llm.engine, enable_prefix_caching=True) as e:
        for i, p in enumerate(ps):  # one after the other: the later ones hit the cached prefix
            e.add_request(str(i), p, GREEDY)
            done = run_until_idle(e)[str(i)]
            assert done.outputs[0].token_ids == ref[i]
            assert (done.num_cached_tokens >= 16) == (i > 0)


def test_sliding_window_changes_the_output(qwen):
    """Qwen2's layer 1 really slides: transformers without the window gives other logits."""
    family, hf, _, _, llm = qwen
    if family != "qwen2":
        pytest.skip("only the qwen2 model has a sliding layer")
    full = hf_qwen("qwen2", **{**FAMILIES["qwen2"], "use_sliding_window": False})
    full.load_state_dict(hf.state_dict())
    p = prompts([30], seed=4)[0]
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    got = llm.generate([p], one)[0].outputs[0].logits[0]
    np.testing.assert_allclose(got, hf_logits(hf, p)[-1], atol=1e-4, rtol=0)
    assert np.abs(got - hf_logits(full, p)[-1]).max() > 1e-2


@pytest.mark.parametrize("backend,tp", [("xla", 2), ("pallas", 1)])
def test_tp2_and_pallas_match_transformers(qwen, backend, tp):
    """TP 2 on the fake devices (q heads, KV heads and the biases split over ``model``), and the
    Pallas kernel in interpret mode: the same first logits and tokens as transformers."""
    _, hf, cfg, params, _ = qwen
    llm = LLM("tiny-qwen-other", model_config=cfg, params=params, tensor_parallel_size=tp, attention_backend=backend,
              enable_prefix_caching=False, **{**ENGINE, "max_num_seqs": 4})
    ps = prompts([6, 33], seed=3)
    outs = llm.generate(ps, GREEDY.replace(max_tokens=8))
    for p, o in zip(ps, outs):
        np.testing.assert_allclose(o.outputs[0].logits[0], hf_logits(hf, p)[-1], atol=1e-4, rtol=0)
        want, margins = hf_greedy(hf, p, 8)
        assert_greedy_matches(o.outputs[0].token_ids, want, margins, f"{backend} tp {tp}, prompt of {len(p)}")
    if tp > 1:
        bias = llm.engine.runner.params["layers"]["attn"]["k_bias" if cfg.qkv_bias else "k_norm"]
        bias = bias if cfg.qkv_bias else bias["scale"]
        assert len({s.device for s in bias.addressable_shards}) >= 2


@pytest.mark.parametrize("dtype,quantization", [("float32", "int8"), ("bfloat16", None)])
def test_packed_products_add_the_biases(qwen, dtype, quantization):
    """Qwen2's q/k/v biases with the products this CPU packs (int8 weights: ``int8_packed``,
    VNNI; bfloat16: ``amx_packed``, AMX or AVX-512 BF16; q/k/v as one fused product): the
    same tokens as XLA's products over the same weights, logits within their rounding. The
    biases stay float beside the packed (or int8) kernels."""
    import dataclasses

    import jax
    from helpers import resolved_plan, unpacked

    family, _, cfg, params, _ = qwen
    if family != "qwen2":
        pytest.skip("the biases are qwen2's")
    qcfg = dataclasses.replace(cfg, quantization=quantization)
    params = jax.tree.map(lambda x: np.asarray(x, jnp_dtype(dtype)), params)  # the engine takes them in its dtype
    runs = {}
    for packed in (True, False):
        plan = resolved_plan(qcfg, dtype, None if packed else unpacked)
        if packed and not plan.packed:
            pytest.skip(f"no packed products for {dtype}/{quantization} on this CPU")
        llm = LLM("tiny-qwen2-q", dtype=dtype, quantization=quantization, model_config=cfg, params=params, plan=plan,
                  enable_prefix_caching=False, **{**ENGINE, "max_num_seqs": 4})
        kept = llm.engine.runner.params["layers"]["attn"]
        # float (bfloat16 stacks are held as their uint16 bits on CPU: `cpu_bf16`), never int8
        assert {"q_bias", "k_bias", "v_bias"} <= set(kept) and kept["q_bias"].dtype.itemsize == jnp_dtype(dtype).itemsize
        if packed:
            assert "qkv_packed" in llm.engine.runner.amx["layers"]["attn"]
        outs = llm.generate(prompts([5, 33], seed=6), GREEDY.replace(max_tokens=6))
        runs[packed] = ([o.outputs[0].token_ids for o in outs], [np.stack(o.outputs[0].logits) for o in outs])
    assert runs[True][0] == runs[False][0]
    tol = 3e-3 if dtype == "float32" else 3e-2
    for a, b in zip(runs[True][1], runs[False][1]):
        assert np.abs(a - b).max() <= tol * np.abs(b).max()


def jnp_dtype(name: str):
    import jax.numpy as jnp

    return jnp.dtype(name)
