"""The real SmolLM2-135M-Instruct as an embedding model (``runner="pooling"``, float32): the
pooled vectors equal transformers' final hidden states (``last_hidden_state``, after the final
norm) of the same weights, pooled the same way (``last`` and ``mean``), within 1e-4 before
normalization; a prompt longer than one chunk included. transformers runs ``LlamaForCausalLM``
over the converted checkpoint mapped back to Hugging Face names (`helpers.hf_model`, as
tests/data/make_reference.py's ``converted`` source)."""
from __future__ import annotations

import numpy as np
import pytest

from helpers import hf_model
from jaxinfer import LLM, PoolingParams

pytestmark = pytest.mark.real_model
CHUNK = 64  # max_num_batched_tokens: the long text below takes several steps
TEXTS = ["The capital of France is Paris.", "hello",
         "Embeddings map text to vectors; " * 12 + "and similar texts land close together."]


@pytest.fixture(scope="module")
def weights(smollm2_dir):
    """(ModelConfig, float32 params) of the converted checkpoint, loaded once for both sides."""
    from jaxinfer.config import ModelConfig
    from jaxinfer.weights.checkpoint import load_params

    return ModelConfig.from_dir(smollm2_dir), load_params(smollm2_dir, dtype="float32")


@pytest.fixture(scope="module")
def hf(weights):
    return hf_model(*weights)


def hf_states(hf, ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        return hf.model(torch.tensor([ids])).last_hidden_state[0].numpy().astype(np.float64)


def test_pooled_vectors_equal_transformers(smollm2_dir, weights, hf):
    """One engine, ``last`` then ``mean`` per request (`PoolingParams.pooling_type`): the same
    steps and buckets twice (no prefix caching), so the second pass compiles nothing."""
    cfg, params = weights
    llm = LLM("smollm2", model_config=cfg, params=params, tokenizer=str(smollm2_dir), dtype="float32", runner="pooling", max_model_len=256, max_num_seqs=4,
              max_num_batched_tokens=CHUNK, num_blocks=64, warmup=False, use_tqdm=False,
              enable_prefix_caching=False)
    tok = llm.get_tokenizer()
    ids = [tok.encode(t) for t in TEXTS]
    assert len(ids[2]) > CHUNK
    states = [hf_states(hf, p) for p in ids]
    for pooling_type in ("last", "mean"):
        outs = llm.encode(TEXTS, PoolingParams(normalize=False, pooling_type=pooling_type), use_tqdm=False)
        for out, p, h in zip(outs, ids, states):
            assert out.prompt_token_ids == p
            ref = h[-1] if pooling_type == "last" else h.mean(axis=0)
            np.testing.assert_allclose(out.outputs.data, ref, atol=1e-4, rtol=0)
    unit = llm.embed(TEXTS[:2], use_tqdm=False)[0].outputs.embedding
    np.testing.assert_allclose(np.linalg.norm(unit), 1.0, atol=1e-6)
    e = llm.engine
    assert e.num_free_blocks == e.num_total_blocks and not e.requests
