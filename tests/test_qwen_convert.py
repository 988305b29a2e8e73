"""Qwen2 / Qwen3 checkpoints through `jaxinfer.weights.convert`: a GGUF (llama.cpp's layout,
architectures ``qwen2`` and ``qwen3``) written here from a random transformers checkpoint
converts to the same config and bit-equal weights as the checkpoint's safetensors, and the
engine on it gives transformers' greedy tokens (qwen2: q/k/v biases, untied; qwen3: q/k norms,
``attention_bias`` q/k/v/o biases, tied, yarn); malformed checkpoints (an unknown
architecture, a bias missing or where the config has none, a tensor shape config.json does not
explain) fail at conversion with one line naming the problem."""
from __future__ import annotations

import json

import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.config import ModelConfig
from jaxinfer.weights.checkpoint import load_params
from jaxinfer.weights.convert import convert, main
from qwen_helpers import assert_greedy_matches, hf_greedy, hf_qwen, save_hf, write_qwen_gguf
from test_convert import flat, make_tiny_tokenizer

VOCAB = 290  # make_tiny_tokenizer's
MODELS = {
    "qwen2": dict(tie_word_embeddings=False, rope_theta=1e6),  # untied as Qwen2.5-7B (test_qwen_model's is tied)
    "qwen3": dict(head_dim=32, tie_word_embeddings=True, attention_bias=True,  # tied as Qwen3-0.6B
                  rope_parameters={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128,
                                   "rope_theta": 5e5}),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def checkpoint(request, tmp_path_factory):
    """(family, transformers model, its HF folder with tokenizer, its GGUF)."""
    root = tmp_path_factory.mktemp(request.param)
    hf = hf_qwen(request.param, vocab_size=VOCAB, **MODELS[request.param])
    src = save_hf(hf, root / "hf")
    make_tiny_tokenizer(src)
    return request.param, hf, src, write_qwen_gguf(hf, src, root / f"tiny-{request.param}.gguf")


def test_gguf_converts_to_the_safetensors_conversion(checkpoint, tmp_path):
    family, hf, src, gguf_path = checkpoint
    from_hf, from_gguf = convert(src, tmp_path / "hf"), convert(gguf_path, tmp_path / "gguf")
    cfg = ModelConfig.from_dir(from_gguf)
    assert cfg == ModelConfig.from_dir(from_hf) and cfg.model_type == family
    a, b = flat(load_params(from_hf)), flat(load_params(from_gguf))
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert "layers/attn/q_bias" in a and ("layers/attn/o_bias" in a) == (family == "qwen3")
    assert ("lm_head/kernel" in a) == (family == "qwen2") and cfg.qkv_bias
    tok = json.loads((from_gguf / "tokenizer_config.json").read_text())
    assert tok.get("eos_token") == "</s>"


def test_engine_on_the_converted_gguf_gives_transformers_tokens(checkpoint, tmp_path):
    """The folder converted from the GGUF, loaded by name as a user would (tokenizer included)."""
    family, hf, _, gguf_path = checkpoint
    out = convert(gguf_path, tmp_path / "gguf")
    llm = LLM(str(out), max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32, num_blocks=16, warmup=False,
              use_tqdm=False)
    text = "hello world, the quick brown fox"
    prompt = llm.get_tokenizer().encode(text)
    assert len(prompt) > 5
    got = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0]
    want, margins = hf_greedy(hf, prompt, 8)
    assert_greedy_matches(got.outputs[0].token_ids, want, margins, family)


def _one_line_error(argv, capsys) -> str:
    """The CLI's one ``error:`` line (exit status 2, no traceback; progress bars aside)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and err.rstrip().endswith(lines[0]) and "Traceback" not in err, err
    return lines[0]


def test_unknown_architecture_fails_with_one_line(checkpoint, tmp_path, capsys):
    family, hf, src, _ = checkpoint
    d = json.loads((src / "config.json").read_text())
    bad = tmp_path / "seqcls"
    bad.mkdir()
    for f in src.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "config.json").write_text(json.dumps({**d, "architectures": [d["architectures"][0].replace(
        "CausalLM", "SequenceClassification")]}))
    line = _one_line_error([str(bad), "--out", str(tmp_path / "o1")], capsys)
    assert "ForSequenceClassification is not supported" in line and "ForCausalLM" in line
    (bad / "config.json").write_text(json.dumps({**d, "model_type": "falcon", "architectures": ["FalconForCausalLM"]}))
    line = _one_line_error([str(bad), "--out", str(tmp_path / "o2")], capsys)
    assert "model_type 'falcon' is not supported; supported: llama, gemma3_text, qwen2, qwen3" in line
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_unknown_gguf_architecture_fails_with_one_line(tmp_path, capsys):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "falcon")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    line = _one_line_error([str(tmp_path / "x.gguf"), "--out", str(tmp_path / "o")], capsys)
    assert "GGUF architecture 'falcon' is not supported; supported: llama, gemma3, qwen2, qwen3" in line


def test_bias_missing_or_unexpected_fails_with_one_line(checkpoint, tmp_path, capsys):
    """Qwen2 without its q bias; Qwen3 with biases that its config (attention_bias set false) lacks."""
    from safetensors.numpy import load_file, save_file

    family, hf, src, _ = checkpoint
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in src.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(src / "model.safetensors"))
    if family == "qwen2":
        del tensors["model.layers.1.self_attn.q_proj.bias"]
        want = "layers [1] have no attn/q_bias"
    else:
        d = json.loads((src / "config.json").read_text())
        (bad / "config.json").write_text(json.dumps({**d, "attention_bias": False}))
        want = "_proj.bias' does not fit the config"
    save_file(tensors, str(bad / "model.safetensors"))
    assert want in _one_line_error([str(bad), "--out", str(tmp_path / "o")], capsys)


def test_hub_style_configs_read_as_transformers_reads_them():
    """Qwen2.5-7B-Instruct's config.json (top-level rope_theta, the legacy ``type`` key of the
    yarn block its model card adds for long contexts) and sliding windows from
    ``max_window_layers``: the same layer types and RoPE as transformers' Qwen2Config."""
    import transformers

    from conftest import ROOT

    d = json.loads((ROOT / "configs" / "qwen2.5-7b-instruct.json").read_text())
    cfg = ModelConfig.from_dict(d)
    assert cfg.qkv_bias and not cfg.o_proj_bias and cfg.sliding_window is None and cfg.rope_theta == 1e6
    yarn = {**d, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    cfg = ModelConfig.from_dict(yarn)
    assert (cfg.rope_scaling.rope_type, cfg.rope_scaling.factor, cfg.max_context_len) == ("yarn", 4.0, 131072)
    assert transformers.Qwen2Config(**yarn).rope_parameters["rope_type"] == "yarn"
    for window_layers in (20, 28, 0):
        d2 = {**d, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": window_layers}
        cfg = ModelConfig.from_dict(d2)
        want = transformers.Qwen2Config(**d2).layer_types
        assert [w is not None for w in cfg.layer_windows] == [t == "sliding_attention" for t in want]
        assert ModelConfig.from_dict(cfg.to_hf_dict()) == cfg
    with pytest.raises(ValueError, match="use_sliding_window is true but sliding_window is None"):
        ModelConfig.from_dict({**d, "use_sliding_window": True, "sliding_window": None})
    q3 = ModelConfig.from_dict(json.loads((ROOT / "configs" / "qwen3-8b.json").read_text()))
    assert (q3.head_dim, q3.qk_norm, q3.qkv_bias, q3.o_proj_bias, q3.sliding_window) == (128, True, False, False, None)


def test_tensor_shape_that_does_not_fit_the_config_fails_with_one_line(checkpoint, tmp_path, capsys):
    """A config.json whose head layout does not match the weights (a kv head count edited, or
    a Qwen3 config without its head_dim) names the tensor, its shape and the config's, instead
    of numpy's "cannot reshape array of size ..."."""
    family, hf, src, _ = checkpoint
    d = json.loads((src / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in src.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    edits = [{"num_key_value_heads": 1}, {"intermediate_size": d["intermediate_size"] + 1}]
    for i, edit in enumerate(edits):
        (bad / "config.json").write_text(json.dumps({**d, **edit}))
        line = _one_line_error([str(bad), "--out", str(tmp_path / f"o{i}")], capsys)
        assert "cannot reshape" not in line and "does not fit config.json" in line, line
        assert "model.layers.0." in line and f"{next(iter(edit))} {next(iter(edit.values()))}" in line, line
        assert not (tmp_path / f"o{i}").exists()
