"""The model registry (`jaxinfer.models.registry`): lookups, messages, a family added at run
time without touching any other module, and the Gemma 3 GGUF hooks on a tiny written GGUF."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from jaxinfer.config import ModelConfig
from jaxinfer.weights.convert import build_tree
from jaxinfer.weights.sources import gguf_config, hf_config, read_gguf
from jaxinfer.models import llama_family, registry
from jaxinfer.models.llama import LlamaForCausalLM

SHAPE = dict(vocab_size=6, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=4)


def test_lookups_and_names():
    assert registry.model_types()[:4] == ("llama", "gemma3_text", "qwen2", "qwen3")
    assert registry.gguf_architectures()[:4] == ("llama", "gemma3", "qwen2", "qwen3")
    assert registry.by_gguf_architecture("gemma3") is registry.by_model_type("gemma3_text")
    cfg = ModelConfig.from_dict(SHAPE)
    assert registry.decoder_class(cfg) is registry.decoder_class("gemma3_text") is LlamaForCausalLM


def test_unsupported_names_list_the_registry():
    with pytest.raises(ValueError, match="model_type 'falcon' is not supported; supported: llama, gemma3_text, qwen2"):
        ModelConfig.from_dict({**SHAPE, "model_type": "falcon"})
    with pytest.raises(ValueError, match="GGUF architecture 'falcon' is not supported; supported: llama, gemma3, qwen2"):
        registry.by_gguf_architecture("falcon")
    with pytest.raises(ValueError, match="falcon"):
        registry.decoder_class("falcon")


@pytest.fixture
def toy_family():
    """A family registered at run time: Llama's hooks under new names."""
    fam = dataclasses.replace(llama_family.FAMILY, model_type="toy", hf_architectures=("ToyForCausalLM",),
                              gguf_architecture="toyarch")
    registry.register(fam)
    yield fam
    registry.unregister("toy")
    assert "toy" not in registry.model_types() and "toyarch" not in registry.gguf_architectures()


def test_family_added_at_run_time_needs_no_other_change(toy_family, tmp_path):
    cfg = ModelConfig.from_dict({**SHAPE, "model_type": "toy", "tie_word_embeddings": True})
    hf = cfg.to_hf_dict()
    assert hf["architectures"] == ["ToyForCausalLM"] and hf["model_type"] == "toy"
    assert ModelConfig.from_dict(hf) == cfg
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert hf_config(tmp_path) == cfg
    rng = np.random.default_rng(0)
    D, F, N, K, H = 8, 16, 2, 1, 4
    shapes = {"self_attn.q_proj.weight": (N * H, D), "self_attn.k_proj.weight": (K * H, D),
              "self_attn.v_proj.weight": (K * H, D), "self_attn.o_proj.weight": (D, N * H),
              "mlp.gate_proj.weight": (F, D), "mlp.up_proj.weight": (F, D), "mlp.down_proj.weight": (D, F),
              "input_layernorm.weight": (D,), "post_attention_layernorm.weight": (D,)}
    tensors = [(f"model.layers.{i}.{n}", rng.normal(size=s).astype(np.float32))
               for i in range(2) for n, s in shapes.items()]
    tensors += [("model.embed_tokens.weight", rng.normal(size=(6, D)).astype(np.float32)),
                ("model.norm.weight", np.ones(D, np.float32))]
    tree = build_tree(iter(tensors), cfg, "float32")
    assert tree["layers"]["attn"]["q_proj"]["kernel"].shape == (2, D, N, H)
    assert registry.decoder_class(cfg) is LlamaForCausalLM


def _write_tiny_gemma3_gguf(path, rng) -> dict[str, np.ndarray]:
    """A 2-layer ``gemma3`` GGUF with float32 tensors; returns them by GGUF name."""
    import gguf

    D, F, N, K, H, L = 8, 16, 2, 1, 4, 2
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(L)
    w.add_context_length(64)
    w.add_embedding_length(D)
    w.add_feed_forward_length(F)
    w.add_head_count(N)
    w.add_head_count_kv(K)
    w.add_key_length(H)
    w.add_value_length(H)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(4)
    w.add_token_list(["<pad>", "<eos>", "<bos>", "a", "b", "<end_of_turn>"])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    shapes = {"attn_q": (N * H, D), "attn_k": (K * H, D), "attn_v": (K * H, D), "attn_output": (D, N * H),
              "ffn_gate": (F, D), "ffn_up": (F, D), "ffn_down": (D, F), "attn_norm": (D,),
              "post_attention_norm": (D,), "ffn_norm": (D,), "post_ffw_norm": (D,), "attn_q_norm": (H,),
              "attn_k_norm": (H,)}
    tensors = {"token_embd.weight": rng.normal(size=(6, D)), "output_norm.weight": rng.normal(size=(D,))}
    tensors.update({f"blk.{i}.{n}.weight": rng.normal(size=s) for i in range(L) for n, s in shapes.items()})
    tensors = {k: v.astype(np.float32) for k, v in tensors.items()}
    for name, t in tensors.items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def test_gemma3_gguf_hooks(tmp_path):
    import gguf

    stored = _write_tiny_gemma3_gguf(tmp_path / "tiny.gguf", np.random.default_rng(1))
    reader = gguf.GGUFReader(str(tmp_path / "tiny.gguf"))
    cfg = gguf_config(reader)
    assert cfg.model_type == "gemma3_text" and cfg.eos_token_ids == (1, 5)  # <end_of_turn> stops too
    assert (cfg.sliding_window, cfg.query_pre_attn_scalar, cfg.rope_theta, cfg.rope_local_base) == (4, 4.0, 1e6, 1e4)
    assert cfg.layer_types == ("sliding_attention", "sliding_attention") and cfg.tie_word_embeddings
    got = dict(read_gguf(reader, cfg))
    np.testing.assert_array_equal(got["model.layers.1.self_attn.q_proj.weight"], stored["blk.1.attn_q.weight"])
    np.testing.assert_array_equal(got["model.layers.0.pre_feedforward_layernorm.weight"],
                                  stored["blk.0.ffn_norm.weight"] - np.float32(1))
    np.testing.assert_array_equal(got["model.norm.weight"], stored["output_norm.weight"] - np.float32(1))
    tree = build_tree(iter(got.items()), cfg, "float32")
    assert tree["layers"]["mlp_out_norm"]["scale"].shape == (2, 8)


class ToyDecoder(LlamaForCausalLM):
    """A family's own decoder class (here Llama's computation under another class)."""


def test_the_runner_builds_the_familys_decoder():
    """A family with its own decoder is served by it: the runner asks the registry."""
    from jaxinfer.models.params import init_params
    from jaxinfer.runner.model_runner import ModelRunner
    from tests.helpers import tiny_config

    fam = dataclasses.replace(llama_family.FAMILY, model_type="toydec", hf_architectures=("ToyDecForCausalLM",),
                              gguf_architecture=None, decoder=f"{__name__}:ToyDecoder")
    registry.register(fam)
    try:
        cfg = dataclasses.replace(tiny_config(), model_type="toydec")
        runner = ModelRunner(cfg, init_params(cfg, "float32"), num_blocks=8, block_size=16)
        assert type(runner.model) is ToyDecoder
    finally:
        registry.unregister("toydec")
