"""A fake model runner whose next token is computable by hand.

Next token of a row = (last token of the row + 1) % vocab_size, except that a row whose
logit_bias names a token with bias >= 50 emits that token (so tests can force EOS).
Prompt logprobs (steps with ``prompt_targets``) follow the same rule: after token t the
model's top-N are t + 1, t + 2, ... with logprobs -0.5, -1.5, ...; any other token has rank
N + 1 and logprob -N - 0.5.
Pooling steps (``pool_rows`` set) return ``pooled``: the weighted per-row sums of `fake_hidden`,
the fake final hidden state of each token (a function of the token id alone).
Lets engine and server tests exercise scheduling, streaming and cancellation without
compiling anything (`step_delay` simulates device time).
"""
from __future__ import annotations

import time

import numpy as np


def fake_hidden(token_ids, hidden_size: int = 8) -> np.ndarray:
    """[T, D] float32: the fake runner's final hidden state of each token (1 .. 7 per value)."""
    t = np.asarray(token_ids, np.int64)[:, None]
    return (((t + 1) * (np.arange(hidden_size)[None, :] + 3)) % 7 + 1).astype(np.float32)


class FakeRunner:
    def __init__(self, vocab_size: int, step_delay: float = 0.0, max_logprobs: int = 20, hidden_size: int = 8):
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.step_delay = step_delay
        self.max_logprobs = max_logprobs
        self.num_compilations = 0
        self.compiled: set = set()
        self.steps = 0

    def compile(self, inputs) -> None:
        if inputs.bucket not in self.compiled:
            self.compiled.add(inputs.bucket)
            self.num_compilations += 1

    def execute(self, inputs) -> dict[str, np.ndarray]:
        self.compile(inputs)
        self.steps += 1
        if self.step_delay:
            time.sleep(self.step_delay)
        rows, s = inputs.attention.logits_indices, inputs.sampling
        R = rows.shape[0]
        last = inputs.token_ids[rows]
        nxt = (last + 1) % self.vocab_size
        forced = np.where(s.bias_values >= 50, s.bias_ids, -1).max(axis=1)
        nxt = np.where(forced >= 0, forced, nxt).astype(np.int32)
        N = self.max_logprobs
        top = (nxt[:, None] + np.arange(N)[None, :]) % self.vocab_size
        out = {"token_ids": nxt, "logprob": np.full(R, -0.5, np.float32), "rank": np.ones(R, np.int32),
               "top_ids": top.astype(np.int32), "top_logprobs": np.tile(-0.5 - np.arange(N, dtype=np.float32), (R, 1))}
        if inputs.prompt_targets is not None:
            out.update(self._prompt_logprobs(inputs.token_ids, inputs.prompt_targets))
        if inputs.pool_rows is not None:
            pooled = np.zeros((R + 1, self.hidden_size), np.float32)  # row R: padding, dropped
            np.add.at(pooled, np.minimum(inputs.pool_rows, R),
                      fake_hidden(inputs.token_ids, self.hidden_size) * inputs.pool_weights[:, None])
            out["pooled"] = pooled[:R]
        return out

    def _prompt_logprobs(self, tokens: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
        N, T = self.max_logprobs, len(tokens)
        top = ((tokens[:, None] + 1 + np.arange(N)[None, :]) % self.vocab_size).astype(np.int32)
        j = (targets - tokens - 1) % self.vocab_size  # where the target sits in that order
        rank = np.where(j < N, j + 1, N + 1).astype(np.int32)
        return {"prompt_logprob": (-0.5 - (rank - 1)).astype(np.float32), "prompt_rank": rank, "prompt_top_ids": top,
                "prompt_top_logprobs": np.tile(-0.5 - np.arange(N, dtype=np.float32), (T, 1))}
