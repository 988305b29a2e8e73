"""Draft-model proposals: a smaller model with the target's vocabulary guesses the next
k tokens greedily (Leviathan et al. 2023; Chen et al. 2023).

The draft has its own `jaxinfer.runner.model_runner.ModelRunner` and its own KV pool with the
target's geometry (same number of blocks, same block size), addressed through the very
block tables the target's scheduler keeps: a request's block ``b`` holds its tokens'
K/V in both pools, so allocation, freeing, preemption, prefix-cache hits and the
roll-back of rejected drafts need no bookkeeping of their own. The draft's pool is kept
a mirror of the target's by running the draft on every target step's inputs (`observe`:
prompts, decodes and verification rows alike; logits dropped). A proposal is k
sequential greedy single-token steps of the draft over the speculating requests
(`propose_batch`), written to the slots the verification step then rewrites with the same
tokens. Greedy drafts are a one-hot draft distribution, so the acceptance rule of
`jaxinfer.spec_decode.verify` keeps the target's output distribution exactly.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxinfer.runner import batch as batch_mod
from jaxinfer.core.request import Request


class DraftModelProposer:
    """Greedy proposals from a draft model whose KV pool mirrors the target's.

    Args:
      runner: the draft's `ModelRunner`, its pool of the target's block count and size.
      layout: the target engine's `jaxinfer.runner.batch.BatchLayout` (same buckets).
    """

    def __init__(self, runner, layout: batch_mod.BatchLayout):
        self.runner = runner
        self.layout = layout

    def compile(self, inputs_like: batch_mod.StepInputs) -> None:
        """Compile the draft for the target's bucket (warm-up)."""
        self.runner.compile(inputs_like)

    def observe(self, inputs: batch_mod.StepInputs) -> None:
        """Run the draft on the target step's inputs, writing the same tokens' K/V into its pool."""
        self.runner.execute(inputs)

    def propose_batch(self, reqs: Sequence[Request], ks: Sequence[int]) -> list[list[int]]:
        """Greedy continuations: ``ks[i]`` tokens for request i, one draft step per position
        (rows whose k is reached drop out). The requests' blocks cover the positions."""
        drafts: list[list[int]] = [[] for _ in reqs]
        for j in range(max(ks, default=0)):
            live = [i for i, k in enumerate(ks) if k > j]
            rows = [batch_mod.Row(reqs[i], reqs[i].num_computed_tokens + j,
                                  [drafts[i][-1] if j else reqs[i].all_token_ids[reqs[i].num_computed_tokens]])
                    for i in live]
            ids = np.asarray(self.runner.execute(batch_mod.prepare_rows(rows, self.layout, greedy=True))["token_ids"])
            for r, i in enumerate(live):
                drafts[i].append(int(ids[r]))
        return drafts


def build_draft_proposer(config, target_config, num_blocks: int, block_size: int, dtype: str, backend: str,
                         layout: batch_mod.BatchLayout, weights_dir: str = "weights", draft_model_config=None,
                         draft_params=None) -> DraftModelProposer:
    """Load the draft model ``config.model`` (or take ``draft_model_config`` / ``draft_params``,
    for tests) and give it a runner over a pool of ``num_blocks`` blocks.

    Raises:
      ValueError: the draft's vocabulary size differs from the target's (it must share
        the tokenizer).
    """
    import jax

    from jaxinfer.engine.builder import load_model
    from jaxinfer.config import EngineConfig
    from jaxinfer.runner.model_runner import ModelRunner

    if draft_model_config is None:
        draft_model_config, draft_params, _, _ = load_model(EngineConfig(model_path=config.model, dtype=dtype),
                                                            weights_dir=weights_dir)
    if draft_model_config.vocab_size != target_config.vocab_size:
        raise ValueError(f"the draft model's vocabulary ({draft_model_config.vocab_size} tokens) differs from the "
                         f"target's ({target_config.vocab_size}): a draft model must share the target's tokenizer")
    if draft_params is None:
        from jaxinfer.models.params import init_params

        draft_params = init_params(draft_model_config, dtype)
    runner = ModelRunner(draft_model_config, jax.device_put(draft_params), num_blocks, block_size, dtype, backend,
                         max_logprobs=1)
    return DraftModelProposer(runner, layout)
