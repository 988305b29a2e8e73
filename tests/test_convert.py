"""Conversion, checkpoint storage and model-name resolution.

References: a tiny random ``LlamaForCausalLM`` written here by transformers (its state dict
mapped onto our tree by hand below), llama.cpp's own q/k permutation, transformers' GGUF
loader (dequantization + un-permutation) for the real model, and the reference outputs'
config (tests/data/).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import load_reference
from jaxinfer.weights.checkpoint import load_params, param_shapes, save_params
from jaxinfer.config import ModelConfig
from jaxinfer.weights.convert import build_tree, convert, main
from jaxinfer.weights.sources import unpermute_qk
from jaxinfer.tokenizer.tokenizer import Tokenizer
from jaxinfer.weights.catalog import DEFAULT_GGUF_SHA256, resolve_model

REPO = Path(__file__).resolve().parents[1]
ORACLE = load_reference()

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


# ---------------------------------------------------------------- the expected mapping, by hand

def expected_tree(sd: dict[str, np.ndarray], L: int, D: int, N: int, K: int, H: int,
                  tied: bool) -> dict[str, np.ndarray]:
    """HF state dict (``[out, in]``) -> our flat ``path: array`` (see jaxinfer.weights.checkpoint)."""
    def stack(name, f):
        return np.stack([f(sd[f"model.layers.{i}.{name}"]) for i in range(L)])

    out = {
        "embed/embedding": sd["model.embed_tokens.weight"],
        "final_norm/scale": sd["model.norm.weight"],
        "layers/attn/q_proj/kernel": stack("self_attn.q_proj.weight", lambda w: w.T.reshape(D, N, H)),
        "layers/attn/k_proj/kernel": stack("self_attn.k_proj.weight", lambda w: w.T.reshape(D, K, H)),
        "layers/attn/v_proj/kernel": stack("self_attn.v_proj.weight", lambda w: w.T.reshape(D, K, H)),
        "layers/attn/o_proj/kernel": stack("self_attn.o_proj.weight", lambda w: w.T.reshape(N, H, D)),
        "layers/mlp/gate_proj/kernel": stack("mlp.gate_proj.weight", lambda w: w.T),
        "layers/mlp/up_proj/kernel": stack("mlp.up_proj.weight", lambda w: w.T),
        "layers/mlp/down_proj/kernel": stack("mlp.down_proj.weight", lambda w: w.T),
        "layers/input_norm/scale": stack("input_layernorm.weight", lambda w: w),
        "layers/post_attention_norm/scale": stack("post_attention_layernorm.weight", lambda w: w),
    }
    if not tied:
        out["lm_head/kernel"] = sd["lm_head.weight"].T
    return out


def flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        out.update(flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def torch_state_dict(model) -> dict[str, np.ndarray]:
    import torch

    return {k: (v.float().numpy().astype(np.dtype("bfloat16")) if v.dtype == torch.bfloat16 else v.numpy())
            for k, v in model.state_dict().items()}


def make_tiny_tokenizer(path: Path) -> None:
    """A byte-level BPE tokenizer (vocab ~290) with a chat template, written into ``path``."""
    from tokenizers import Tokenizer as RawTokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = RawTokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(["hello world, the quick brown fox jumps over the lazy dog"] * 10, trainers.BpeTrainer(
        vocab_size=290, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(str(path))


def make_tiny_llama(path: Path, *, tied=False, bf16=False, shard=False) -> dict[str, np.ndarray]:
    """Write a random 2-layer Llama checkpoint (+ tokenizer, generation config); return its state dict."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=tied, rope_theta=50000.0,
                      max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()  # norms too: no all-ones leaf that a swap could hide behind
    if bf16:
        model = model.to(torch.bfloat16)
    model.save_pretrained(str(path), safe_serialization=True, max_shard_size="60KB" if shard else "5GB")
    GenerationConfig(bos_token_id=1, eos_token_id=[2, 3]).save_pretrained(str(path))
    make_tiny_tokenizer(path)
    return torch_state_dict(model)


# ---------------------------------------------------------------- tiny checkpoints

@pytest.mark.parametrize("tied,bf16,shard,dtype", [
    (False, False, False, "float32"),
    (False, True, True, "bfloat16"),
    (True, True, False, "float32"),
])
def test_hf_checkpoint_round_trip(tmp_path, tied, bf16, shard, dtype):
    src = tmp_path / "tiny-llama"
    sd = make_tiny_llama(src, tied=tied, bf16=bf16, shard=shard)
    assert (src / "model.safetensors.index.json").exists() == shard
    out = convert(src, tmp_path / "out", dtype=dtype)

    cfg = ModelConfig.from_dir(out)
    assert cfg == ModelConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=50000.0,
                              rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=tied,
                              bos_token_id=1, eos_token_ids=(2, 3))
    assert ModelConfig.from_dict(cfg.to_hf_dict()) == ModelConfig.from_dict(
        json.loads((out / "config.json").read_text()))

    got = flat(load_params(out))
    want = expected_tree(sd, 2, 64, 4, 2, 16, tied)
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        assert got[k].dtype == np.dtype(dtype), k
        np.testing.assert_array_equal(got[k], w.astype(dtype), err_msg=k)

    tok_src, tok_out = Tokenizer.from_dir(src), Tokenizer.from_dir(out)
    msgs = [{"role": "user", "content": "hello world"}]
    assert tok_out.apply_chat_template(msgs) == tok_src.apply_chat_template(msgs)
    assert tok_out.encode("the lazy dog") == tok_src.encode("the lazy dog")

    meta = json.loads((out / "source.json").read_text())
    for name, digest in meta["sha256"].items():
        assert hashlib.sha256((src / name).read_bytes()).hexdigest() == digest
    assert all(n in meta["sha256"] for n in ["config.json", "tokenizer.json"])
    assert (out / ".complete").read_text().strip() == meta["digest"]


def test_idempotent_force_and_cli(tmp_path, caplog):
    src = tmp_path / "tiny"
    make_tiny_llama(src)
    out = convert(src, tmp_path / "out")
    stamp = (out / ".complete").stat().st_mtime_ns
    caplog.set_level("INFO", logger="jaxinfer")
    assert convert(src, out) == out and (out / ".complete").stat().st_mtime_ns == stamp
    assert "nothing to do" in caplog.text
    assert convert(src, out, dtype="float32") == out and (out / ".complete").stat().st_mtime_ns == stamp
    with pytest.raises(FileExistsError):
        convert(src, out, dtype="bfloat16")
    time.sleep(0.01)
    assert main([str(src), "--out", str(out), "--dtype", "bfloat16", "--force"]) == out
    assert (out / ".complete").stat().st_mtime_ns != stamp
    assert json.loads((out / "source.json").read_text())["dtype"] == "bfloat16"
    assert flat(load_params(out))["embed/embedding"].dtype == np.dtype("bfloat16")
    assert not list(tmp_path.glob(".out.partial*"))
    (tmp_path / "stranger").mkdir()
    (tmp_path / "stranger" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        convert(src, tmp_path / "stranger")
    assert (tmp_path / "stranger" / "notes.txt").exists()


def test_resolve_model(tmp_path):
    src = tmp_path / "my-llama"
    make_tiny_llama(src)
    wdir = tmp_path / "weights"
    out = resolve_model(src, weights_dir=wdir)
    assert out == wdir / "my-llama" and (out / "params").is_dir()
    assert resolve_model(out, weights_dir=wdir) == out
    assert resolve_model("my-llama", weights_dir=wdir) == out
    with pytest.raises(ValueError, match="my-llama"):
        resolve_model("no-such-model", weights_dir=wdir)


def test_unsupported_model_leaves_nothing_behind(tmp_path):
    src = tmp_path / "falcon-like"
    make_tiny_llama(src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "model_type": "falcon"}))
    with pytest.raises(ValueError, match="falcon"):
        convert(src, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["falcon-like"]


def test_load_params_dtype_and_shardings(tmp_path):
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    tree = {"a": {"kernel": np.arange(12, dtype=np.float32).reshape(3, 4)}, "b": np.ones(5, np.float32)}
    mesh = Mesh(np.array(jax.devices()[:2]), ("model",))  # 2 of conftest's 8 fake CPU devices, if there
    saved_from_device = {"a": {"kernel": jax.device_put(tree["a"]["kernel"], NamedSharding(mesh, PartitionSpec()))},
                         "b": tree["b"]}
    save_params(tmp_path / "params", saved_from_device)
    got = load_params(tmp_path, dtype="bfloat16")
    assert got["a"]["kernel"].dtype == np.dtype("bfloat16")
    assert isinstance(got["a"]["kernel"], np.ndarray) and isinstance(got["b"], np.ndarray)
    shardings = {"a": {"kernel": NamedSharding(mesh, PartitionSpec(None, "model"))},
                 "b": NamedSharding(mesh, PartitionSpec())}
    got = load_params(tmp_path / "params", shardings=shardings)
    assert isinstance(got["a"]["kernel"], jax.Array) and got["a"]["kernel"].sharding == shardings["a"]["kernel"]
    assert {s.data.shape for s in got["a"]["kernel"].addressable_shards} == {(3, 4 // mesh.size)}
    np.testing.assert_array_equal(np.asarray(got["a"]["kernel"]), tree["a"]["kernel"])
    with pytest.raises(ValueError):
        load_params(tmp_path, shardings={"a": shardings["b"]})
    with pytest.raises(FileNotFoundError):
        load_params(tmp_path / "nothing")


def test_unpermute_inverts_llama_cpp_permute():
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute, then ours: identity."""
    def llama_cpp_permute(w, n_head):
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = np.random.default_rng(0).normal(size=(3 * 8, 10)).astype(np.float32)
    assert not np.array_equal(llama_cpp_permute(w, 3), w)
    np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(w, 3), 3), w)
    b = w[:, 0].copy()  # an attention_bias bias: llama.cpp permutes it as its weight's rows
    np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(b, 3), 3), b)


def test_llama_attention_bias_matches_transformers(tmp_path):
    """``attention_bias`` (q, k, v and o biases) converted and served: transformers' greedy
    tokens and first logits."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from jaxinfer import LLM, SamplingParams
    from qwen_helpers import assert_greedy_matches, hf_greedy, hf_logits

    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, attention_bias=True,
                                      max_position_embeddings=128, bos_token_id=1, eos_token_id=2)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else
                    torch.randn_like(p) * (0.1 if name.endswith("bias") else 0.25))
    hf.save_pretrained(str(tmp_path / "hf"))
    out = convert(tmp_path / "hf", tmp_path / "out")
    cfg = ModelConfig.from_dir(out)
    assert cfg.qkv_bias and cfg.o_proj_bias and flat(load_params(out))["layers/attn/o_bias"].shape == (2, 64)
    llm = LLM("tiny-llama-bias", model_config=cfg, params=load_params(out), tokenizer=None, max_model_len=64,
              max_num_seqs=2, max_num_batched_tokens=32, num_blocks=16, warmup=False, return_logits=True,
              use_tqdm=False)
    prompt = list(range(3, 23))
    got = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))[0].outputs[0]
    np.testing.assert_allclose(got.logits[0], hf_logits(hf, prompt)[-1], atol=1e-4, rtol=0)
    assert_greedy_matches(got.token_ids, *hf_greedy(hf, prompt, 8))


def test_build_tree_rejects_unknown_and_missing():
    cfg = ModelConfig(vocab_size=8, hidden_size=4, intermediate_size=6, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=2, tie_word_embeddings=True)
    with pytest.raises(ValueError, match="q_proj.bias"):
        build_tree(iter([("model.layers.0.self_attn.q_proj.bias", np.zeros(4))]), cfg, "float32")
    with pytest.raises(ValueError, match="layers \\[0\\]"):
        build_tree(iter([("model.embed_tokens.weight", np.zeros((8, 4)))]), cfg, "float32")


def test_param_shapes_match_the_model():
    params = pytest.importorskip("jaxinfer.models.params")
    import jax

    cfg = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    model = jax.tree.map(lambda x: tuple(x.shape), params.abstract_params(cfg))
    assert model == param_shapes(cfg)


# ---------------------------------------------------------------- the real model

@pytest.fixture(scope="module")
def smol_dir(smollm2_dir) -> Path:
    """The converted default model (``smollm2_dir``: tests/conftest.py, ensure_default_weights)."""
    return smollm2_dir


@pytest.mark.real_model
def test_default_model_folder(smol_dir):
    hf = ORACLE["model"]["hf_config"]
    cfg = ModelConfig.from_dir(smol_dir)
    want = ModelConfig.from_dict(hf)
    # the GGUF stores eps as float32: a folder converted from it says 1e-05 (the shortest decimal of
    # that float32) where a folder written before that rule said 9.999999747378752e-06
    assert np.float32(cfg.rms_norm_eps) == np.float32(want.rms_norm_eps)
    assert dataclasses.replace(cfg, rms_norm_eps=want.rms_norm_eps) == want
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.head_dim, cfg.rope_theta) == (30, 576, 64, 100000.0)
    assert cfg.tie_word_embeddings and cfg.eos_token_ids == (2,) and cfg.bos_token_id == 1
    assert ORACLE["model"]["sha256"] == DEFAULT_GGUF_SHA256 == (smol_dir / ".complete").read_text().strip()
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= {p.name for p in smol_dir.iterdir()}
    stamp = (smol_dir / ".complete").stat().st_mtime_ns
    for name in ["smollm2-135m-instruct", "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"]:
        assert resolve_model(name, weights_dir=REPO / "weights") == smol_dir
    assert (smol_dir / ".complete").stat().st_mtime_ns == stamp


@pytest.mark.real_model
def test_default_model_weights_equal_transformers_gguf_load(smol_dir):
    import torch
    from transformers import AutoModelForCausalLM

    gguf = REPO / "weights" / ".download" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    sd = torch_state_dict(model)
    del model
    want = expected_tree(sd, 30, 576, 9, 3, 64, tied=True)
    got = flat(load_params(smol_dir))
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        np.testing.assert_array_equal(got[k], w, err_msg=k)  # bit for bit
    # q/k rows really were un-permuted: the raw GGUF order differs
    q0 = sd["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(got["layers/attn/q_proj/kernel"][0], q0.reshape(9, 2, 32, 576).swapaxes(1, 2)
                              .reshape(576, 576).T.reshape(576, 9, 64))
