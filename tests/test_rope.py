"""RoPE scaling (llama3, linear, dynamic, yarn) against transformers on tiny random Llamas.

References are transformers' own: ``ROPE_INIT_FUNCTIONS`` for the frequencies and the
attention factor, and a float32 ``LlamaForCausalLM`` built from the raw Hugging Face RoPE
dict (not from our parse of it), holding our weights, for the logits (within 1e-4). The
tiny models have a 32-token pre-training context and run to 40-56 positions, so the
scaling acts; each logits test also checks that plain RoPE would have given other logits.
"""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from helpers import hf_logits, tiny_config, to_hf_state_dict
from jaxinfer import LLM, SamplingParams
from jaxinfer.config import ModelConfig
from jaxinfer.layers import rope
from jaxinfer.models.params import init_params

ORIG = 32  # pre-training context of the tiny models
LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": ORIG}
CASES = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "linear-legacy-type-key": {"type": "linear", "factor": 3.0},
    "llama3": LLAMA3,
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG},
    "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIG, "mscale": 1.0,
                    "mscale_all_dim": 0.5, "beta_fast": 8, "beta_slow": 2, "truncate": False},
    "yarn-attention-factor-no-original": {"rope_type": "yarn", "factor": 2.0, "attention_factor": 1.3},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
}
# Published Llama 3.1 8B and Llama 3.2 1B shapes and RoPE settings (their config.json).
REAL_LLAMA3 = {
    "llama-3.1-8b": dict(hidden_size=4096, num_attention_heads=32, head_dim=128, max_position_embeddings=131072,
                         rope_theta=500000.0, rope_scaling={**LLAMA3, "factor": 8.0,
                                                            "original_max_position_embeddings": 8192}),
    "llama-3.2-1b": dict(hidden_size=2048, num_attention_heads=32, head_dim=64, max_position_embeddings=131072,
                         rope_theta=500000.0, rope_scaling={**LLAMA3, "factor": 32.0,
                                                            "original_max_position_embeddings": 8192}),
}
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def hf_dict(rope_scaling: dict | None, max_pos: int = 128) -> dict:
    """A tiny HF ``config.json`` dict (transformers 4 shape: top-level ``rope_theta``)."""
    d = {k: v for k, v in tiny_config(max_pos=max_pos).to_hf_dict().items() if k != "architectures"}
    return {**d, "rope_scaling": copy.deepcopy(rope_scaling)}


def hf_config(d: dict):
    import transformers

    return transformers.LlamaConfig(**copy.deepcopy(d))


def hf_model(d: dict, cfg: ModelConfig, params):
    """A float32 transformers LlamaForCausalLM configured by the HF dict ``d``, holding ``params``."""
    import torch
    import transformers

    model = transformers.LlamaForCausalLM(hf_config(d)).eval().to(torch.float32)
    sd = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in to_hf_state_dict(cfg, params).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return model


def transformers_rope(hf_cfg) -> tuple[np.ndarray, float]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv, factor = ROPE_INIT_FUNCTIONS[hf_cfg.rope_parameters["rope_type"]](hf_cfg)
    return inv.numpy(), factor


def tiny_llm(cfg: ModelConfig, params, max_model_len: int = 96) -> LLM:
    return LLM("tiny-rope", max_model_len=max_model_len, max_num_seqs=2, max_num_batched_tokens=64, num_blocks=16,
               model_config=cfg, params=params, tokenizer=None, warmup=False, return_logits=True)


def prompt(n: int, seed: int = 0) -> list[int]:
    return np.random.RandomState(seed).randint(3, 256, n).tolist()


def assert_generated_logits_match(llm, model, plain, p):
    """Our logits for each generated token equal the HF model's over prompt + output; plain
    RoPE (``plain``) would differ."""
    out = llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0]
    full = p + out.token_ids
    ref = hf_logits(model, full)[len(p) - 1:-1]
    np.testing.assert_allclose(np.stack(out.logits), ref, atol=1e-4)
    assert np.abs(hf_logits(plain, full)[len(p) - 1:-1] - ref).max() > 1e-2  # the scaling acted


# ---------------------------------------------------------------- config and frequencies

@pytest.mark.parametrize("name", CASES)
def test_frequencies_match_transformers(name):
    raw = hf_dict(CASES[name])
    ours = ModelConfig.from_dict(raw)
    assert ours.rope_scaling.rope_type == name.split("-")[0]
    assert ModelConfig.from_dict(ours.to_hf_dict()) == ours
    if name == "dynamic":  # the unscaled vector below the original context: see the dynamic tests
        return
    # the raw dict, and what convert writes for it, mean the same to transformers
    written = {k: v for k, v in ours.to_hf_dict().items() if k != "architectures"}
    for d in (raw, written):
        inv, factor = transformers_rope(hf_config(d))
        np.testing.assert_allclose(rope.inv_freq(ours), inv, rtol=1e-6)
        assert rope.attention_factor(ours) == pytest.approx(factor, rel=1e-12)
    assert not np.allclose(rope.inv_freq(ours), rope.default_inv_freq(ours.head_dim, ours.rope_theta))


@pytest.mark.parametrize("name", REAL_LLAMA3)
def test_llama3_published_configs_match_transformers(name):
    d = {**hf_dict(None), **copy.deepcopy(REAL_LLAMA3[name])}
    ours = ModelConfig.from_dict(d)
    inv, _ = transformers_rope(hf_config(d))
    np.testing.assert_allclose(rope.inv_freq(ours), inv, rtol=1e-6)
    assert ours.max_context_len == 131072


def test_transformers5_rope_parameters_shape():
    """transformers 5 writes ``rope_parameters`` (theta inside, no top-level rope_theta);
    transformers 4 ``rope_scaling`` (legacy key ``type``) with a top-level theta: same config."""
    import tempfile
    from pathlib import Path

    raw = {**hf_dict(LLAMA3), "rope_theta": 50000.0}
    with tempfile.TemporaryDirectory() as tmp:
        hf_config(raw).save_pretrained(tmp)
        saved = json.loads((Path(tmp) / "config.json").read_text())
    assert "rope_parameters" in saved and "rope_theta" not in saved and "rope_scaling" not in saved
    legacy = {**raw, "rope_scaling": {**{k: v for k, v in LLAMA3.items() if k != "rope_type"}, "type": "llama3"}}
    assert ModelConfig.from_dict(saved) == ModelConfig.from_dict(raw) == ModelConfig.from_dict(legacy)
    assert ModelConfig.from_dict(saved).rope_theta == 50000.0


@pytest.mark.parametrize("rs,named", [
    ({"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
      "original_max_position_embeddings": ORIG}, "'longrope'"),
    ({"type": "su", "factor": 2.0}, "'su'"),
    ({"rope_type": "made-up", "factor": 2.0}, "'made-up'"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}, "high_freq_factor"),
    ({"rope_type": "linear"}, "factor"),
    ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"rope_type": "llama3", **{k: v for k, v in LLAMA3.items() if k != "rope_type"}, "high_freq_factor": 1.0},
     "high_freq_factor > low_freq_factor"),
])
def test_unsupported_rope_scaling_is_refused_by_name(rs, named, tmp_path):
    from jaxinfer.weights.sources import hf_config as convert_hf_config

    with pytest.raises(ValueError, match=named):
        ModelConfig.from_dict(hf_dict(rs))
    (tmp_path / "config.json").write_text(json.dumps({**hf_dict(rs), "model_type": "llama"}))
    with pytest.raises(ValueError, match=named):  # the checkpoint converter names it too
        convert_hf_config(tmp_path)


def test_max_context_len_follows_the_scaling():
    """vLLM's rule: linear and dynamic extend max_position_embeddings by factor, yarn extends
    original_max_position_embeddings, llama3 configs already hold the extended length."""
    ctx = {name: ModelConfig.from_dict(hf_dict(CASES[name], max_pos=100)).max_context_len for name in CASES}
    assert ctx == {"linear": 200, "linear-legacy-type-key": 300, "llama3": 100, "yarn": 4 * ORIG,
                   "yarn-mscale": 4 * ORIG, "yarn-attention-factor-no-original": 200, "dynamic": 200}
    assert ModelConfig.from_dict(hf_dict(None, max_pos=100)).max_context_len == 100


# ---------------------------------------------------------------- logits against transformers

@pytest.mark.parametrize("name", ["linear", "yarn-mscale"])
def test_logits_match_transformers(name):
    raw = hf_dict(CASES[name])
    cfg = ModelConfig.from_dict(raw)
    params = init_params(cfg, scale=5.0, seed=1)
    llm = tiny_llm(cfg, params)
    assert_generated_logits_match(llm, hf_model(raw, cfg, params), hf_model(hf_dict(None), cfg, params), prompt(48))


def test_llama3_checkpoint_converts_and_matches_transformers(tmp_path):
    """A Llama-3.1-style checkpoint as transformers 5 saves it goes through the converter
    and the normal loading path, then matches transformers."""
    from jaxinfer.weights.convert import convert

    raw = hf_dict(LLAMA3)
    cfg = ModelConfig.from_dict(raw)
    params = init_params(cfg, scale=5.0, seed=2)
    model = hf_model(raw, cfg, params)
    model.save_pretrained(str(tmp_path / "src"))
    out = convert(tmp_path / "src", tmp_path / "weights" / "llama3-tiny")
    assert ModelConfig.from_dir(out) == cfg
    llm = LLM(str(out), weights_dir=str(tmp_path / "weights"), max_model_len=96, max_num_seqs=2,
              max_num_batched_tokens=64, num_blocks=16, warmup=False, return_logits=True)
    assert_generated_logits_match(llm, model, hf_model(hf_dict(None), cfg, params), prompt(48, seed=1))


def test_dynamic_matches_transformers_generate_past_the_original_context():
    """Prompt within max_position_embeddings (32), generation 8 tokens past it: every logit
    equals transformers' cached ``generate`` (which grows the NTK base each step). The model
    also serves 2 x 32 tokens and refuses more."""
    import torch

    raw = hf_dict(CASES["dynamic"], max_pos=ORIG)
    cfg = ModelConfig.from_dict(raw)
    params = init_params(cfg, scale=5.0, seed=3)
    with pytest.raises(ValueError, match="exceeds the model's context of 64"):
        tiny_llm(cfg, params, max_model_len=65)
    llm = tiny_llm(cfg, params, max_model_len=64)
    p, n = prompt(24, seed=2), 16
    out = llm.generate([p], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), use_tqdm=False)[0]
    model = hf_model(raw, cfg, params)
    with torch.no_grad():
        ref = model.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    assert out.outputs[0].token_ids == ref.sequences[0, len(p):].tolist()
    ref_logits = torch.stack(ref.logits)[:, 0].numpy()
    np.testing.assert_allclose(np.stack(out.outputs[0].logits), ref_logits, atol=1e-4)
    plain = hf_logits(hf_model(hf_dict(None, max_pos=ORIG), cfg, params), p + out.outputs[0].token_ids)
    plain = plain[len(p) - 1:-1]
    k = ORIG - len(p) + 1  # logits from k on have their query past the original context
    np.testing.assert_allclose(plain[:k], ref_logits[:k], atol=1e-4)
    assert np.abs(plain[k:] - ref_logits[k:]).max(axis=1).min() > 1e-2


def test_dynamic_frequencies_per_position_match_transformers():
    """Past the original context, the token at position p uses transformers' dynamic NTK
    frequencies for ``seq_len = p + 1``; within it, the unscaled ones."""
    import jax.numpy as jnp
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    raw = hf_dict(CASES["dynamic"], max_pos=ORIG)
    cfg, hf_cfg = ModelConfig.from_dict(raw), hf_config(raw)
    positions = np.array([0, 7, ORIG - 1, ORIG, ORIG + 1, 2 * ORIG - 1, 5 * ORIG])
    got = np.asarray(rope.dynamic_inv_freq(jnp.asarray(positions, jnp.int32), cfg))
    for p, g in zip(positions, got):
        ref, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf_cfg, seq_len=torch.tensor(int(p) + 1))
        np.testing.assert_allclose(g, ref.numpy(), rtol=1e-6, err_msg=str(p))
    np.testing.assert_array_equal(got[:3], np.broadcast_to(rope.inv_freq(cfg), (3, cfg.head_dim // 2)))
