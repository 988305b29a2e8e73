"""Speculative decoding: cheap proposals of the next few tokens, verified by the target
model in the same fixed-shape step, so that one weight read yields several tokens while
the output stays exactly the target's.

  `config`      `SpeculativeConfig` (vLLM's ``speculative_config`` names) and its checks.
  `ngram`       n-gram prompt lookup proposer (no model; Saxena 2023, "prompt lookup decoding").
  `draft_model` greedy proposals from a smaller model whose KV pool mirrors the target's.
  `verify`      the acceptance rule (greedy longest match; Leviathan et al. 2023 rejection
                sampling for one-hot proposals).
  `switch`      when speculation is off for a step (batch size, recent acceptance rate).
  `speculator`  the engine hook: attaches proposals to a scheduled step, counts results.

How a proposal is verified: a decoding request with k draft tokens is laid out by
`jaxinfer.runner.batch.prepare` as k + 1 single-token rows sharing its block table, row j at
position ``start + j`` with cached context ``start + j`` (the pages hold the earlier
rows' K/V, written in the same layer before attention reads). Every row gets its own
logits and sample, keyed by its output index exactly as a plain decode step would, so no
new shape is compiled and the sample at each position is the one the target would draw.
Plain Python; no JAX import.
"""
from jaxinfer.spec_decode.config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]
