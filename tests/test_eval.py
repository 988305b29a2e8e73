"""``python -m jaxinfer.eval perplexity``: the windows it scores, its errors, and (real
SmolLM2, float32) its value against transformers' forward over the same windows."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from jaxinfer.entrypoints.eval import DEFAULT_TEXT, main, windows


class CharTokenizer:
    """One token per character (ids = code points), optionally with a BOS of id 1."""

    def __init__(self, bos: bool):
        self.bos = bos

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if self.bos and add_special_tokens else []) + [ord(c) for c in text]


def test_windows_cut_the_first_tokens_in_pieces():
    text = "abcdefghij"
    assert windows(CharTokenizer(False), text, max_tokens=7, window=3) == [[97, 98, 99], [100, 101, 102]]  # "g" alone: dropped
    assert windows(CharTokenizer(True), text, max_tokens=7, window=3) == [[1, 97, 98, 99], [1, 100, 101, 102], [1, 103]]
    with pytest.raises(ValueError):
        windows(CharTokenizer(False), "a", max_tokens=8, window=4)
    with pytest.raises(ValueError):
        windows(CharTokenizer(False), text, max_tokens=8, window=0)


def test_unreadable_text_is_an_error_before_any_model_loads(tmp_path, capsys):
    assert main(["perplexity", "--text", str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt" in capsys.readouterr().err


@pytest.mark.real_model
@pytest.mark.slow
def test_perplexity_matches_transformers(smollm2_dir, capsys):
    import torch

    from helpers import hf_model
    from jaxinfer.weights.checkpoint import load_params
    from jaxinfer.config import ModelConfig
    from jaxinfer.tokenizer.tokenizer import Tokenizer

    args = ["--model", str(smollm2_dir), "--dtype", "float32", "--max-tokens", "512", "--window", "256"]
    assert main(["perplexity", *args]) == 0
    got = float(re.fullmatch(r"perplexity: (\S+)\n", capsys.readouterr().out).group(1))

    prompts = windows(Tokenizer.from_dir(smollm2_dir), open(DEFAULT_TEXT, encoding="utf-8").read(), 512, 256)
    assert [len(p) for p in prompts] == [256, 256]
    model = hf_model(ModelConfig.from_dir(smollm2_dir), load_params(smollm2_dir, dtype="float32"))
    nll, count = 0.0, 0
    with torch.no_grad():
        for p in prompts:
            lp = torch.log_softmax(model(torch.tensor([p])).logits[0].double(), -1).numpy()
            nll -= np.sum(lp[np.arange(len(p) - 1), p[1:]])
            count += len(p) - 1
    want = math.exp(nll / count)
    assert abs(got - want) / want < 1e-3, (got, want)
