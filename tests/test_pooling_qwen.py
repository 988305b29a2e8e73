"""Pooling on a Qwen-family checkpoint: a tiny random Qwen2 (q/k/v biases, tied embeddings, a
sliding-window layer of 8) written by transformers (`qwen_helpers`) and converted, served with
``runner="pooling"`` in float32: ``last`` and ``mean`` vectors equal transformers' own
``Qwen2Model`` final hidden states (after its final norm) within 1e-4 before normalization,
prompts longer than the window and than one chunk included."""
from __future__ import annotations

import numpy as np
import pytest

from jaxinfer import LLM, PoolingParams
from jaxinfer.config import ModelConfig
from jaxinfer.weights.checkpoint import load_params
from jaxinfer.weights.convert import convert
from qwen_helpers import hf_qwen, save_hf

CHUNK = 32
PROMPTS = [[5, 17, 99, 3], np.random.RandomState(0).randint(3, 256, 70).tolist(), [7]]


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    hf = hf_qwen("qwen2", tie_word_embeddings=True, rope_theta=1e6, use_sliding_window=True, sliding_window=8,
                 max_window_layers=1)
    root = tmp_path_factory.mktemp("qwen2")
    out = convert(save_hf(hf, root / "hf"), root / "converted")
    return hf, ModelConfig.from_dir(out), load_params(out)


@pytest.mark.parametrize("pooling_type", ["last", "mean"])
def test_qwen2_pooled_vectors_equal_transformers(qwen2, pooling_type):
    import torch

    hf, cfg, params = qwen2
    llm = LLM("tiny-qwen2", model_config=cfg, params=params, tokenizer=None, dtype="float32", runner="pooling",
              pooling_type=pooling_type, max_model_len=96, max_num_seqs=4, max_num_batched_tokens=CHUNK,
              num_blocks=32, warmup=False, use_tqdm=False)
    outs = llm.encode(PROMPTS, PoolingParams(normalize=False), use_tqdm=False)
    for out, p in zip(outs, PROMPTS):
        with torch.no_grad():
            h = hf.model(torch.tensor([p])).last_hidden_state[0].numpy().astype(np.float64)
        ref = h[-1] if pooling_type == "last" else h.mean(axis=0)
        np.testing.assert_allclose(out.outputs.data, ref, atol=1e-4, rtol=0)
    e = llm.engine
    assert e.num_free_blocks == e.num_total_blocks and not e.requests
