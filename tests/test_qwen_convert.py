"""Qwen2 / Qwen3 checkpoints through `jaxinfer.weights.convert`: a GGUF (llama.cpp's layout,
architectures ``qwen2`` and ``qwen3``) written here from a random transformers checkpoint
converts to the same config and bit-equal weights as the checkpoint's safetensors, and the
engine on it gives transformers' greedy tokens; malformed checkpoints (an unknown
architecture, a bias missing or where the config has none) fail at conversion with one line
naming the problem."""
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
    "qwen2": dict(tie_word_embeddings=True, rope_theta=1e6),
    "qwen3": dict(head_dim=32, tie_word_embeddings=False,
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
    assert ("layers/attn/q_bias" in a) == (family == "qwen2") and ("lm_head/kernel" in a) == (family == "qwen3")
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
    """Qwen2 without its q bias; Qwen3 with a q bias that its config (attention_bias false) lacks."""
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
        tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(4 * 32, np.float32)
        want = "tensor 'model.layers.0.self_attn.q_proj.bias' does not fit the config"
    save_file(tensors, str(bad / "model.safetensors"))
    assert want in _one_line_error([str(bad), "--out", str(tmp_path / "o")], capsys)
