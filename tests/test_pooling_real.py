"""The real SmolLM2-135M-Instruct as an embedding model (``runner="pooling"``, float32): the
pooled vectors equal transformers' final hidden states (``last_hidden_state``, after the final
norm) of the same weights, pooled the same way, within 1e-4 before normalization; prompts
longer than one chunk included. transformers runs ``LlamaForCausalLM`` over the converted
checkpoint mapped back to Hugging Face names (tests/data/make_reference.py's ``converted``
source)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from jaxinfer import LLM, PoolingParams

pytestmark = pytest.mark.real_model
CHUNK = 64  # max_num_batched_tokens: the long text below takes several steps
TEXTS = ["The capital of France is Paris.", "hello",
         "Embeddings map text to vectors; " * 12 + "and similar texts land close together."]


@pytest.fixture(scope="module")
def hf(smollm2_dir):
    sys.path.insert(0, str(Path(__file__).parent / "data"))
    from make_reference import load_from_converted

    model, tok, _ = load_from_converted(smollm2_dir.parent)
    return model


def hf_states(hf, ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        return hf.model(torch.tensor([ids])).last_hidden_state[0].numpy().astype(np.float64)


@pytest.mark.parametrize("pooling_type", ["last", "mean"])
def test_pooled_vectors_equal_transformers(smollm2_dir, hf, pooling_type):
    llm = LLM(str(smollm2_dir), dtype="float32", runner="pooling", pooling_type=pooling_type, max_model_len=256,
              max_num_seqs=4, max_num_batched_tokens=CHUNK, num_blocks=64, warmup=False, use_tqdm=False)
    tok = llm.get_tokenizer()
    ids = [tok.encode(t) for t in TEXTS]
    assert len(ids[2]) > CHUNK
    outs = llm.encode(TEXTS, PoolingParams(normalize=False), use_tqdm=False)
    for out, p in zip(outs, ids):
        assert out.prompt_token_ids == p
        h = hf_states(hf, p)
        ref = h[-1] if pooling_type == "last" else h.mean(axis=0)
        np.testing.assert_allclose(out.outputs.data, ref, atol=1e-4, rtol=0)
    unit = llm.embed(TEXTS[0], use_tqdm=False)[0].outputs.embedding
    np.testing.assert_allclose(np.linalg.norm(unit), 1.0, atol=1e-6)
    e = llm.engine
    assert e.num_free_blocks == e.num_total_blocks and not e.requests
