"""The acceptance rule: which draft tokens a verification step keeps.

A request with drafts ``d_0 .. d_{k-1}`` is verified by k + 1 rows of one step; row j
holds the target's own sample ``t_j`` at that position, drawn exactly as a plain decode
step draws it (greedy argmax, or the seeded inverse-CDF draw keyed by the output index;
`jaxinfer.layers.sampler`). The accepted run is ``t_0 .. t_m`` where m is the first j with
``d_j != t_j`` (m = k when all match): the longest matching prefix, then the target's
token at the first mismatch (or the bonus token after a full match).

For greedy rows this is the usual longest-prefix rule. For sampled rows it is the
rejection-sampling rule of Leviathan et al. 2023 ("Fast Inference from Transformers via
Speculative Decoding", Algorithm 1) and Chen et al. 2023 ("Accelerating Large Language
Model Decoding with Speculative Sampling") for a one-hot draft distribution q = [x]:
accept x with probability min(1, p(x) / q(x)) = p(x), else draw from the residual
norm(max(0, p - q)), which is p with x removed, renormalised. Drawing ``t ~ p`` and
accepting iff ``t == x`` realises exactly that: P(accept) = p(x), and given a rejection
t is distributed as p conditioned on t != x. The draft must not depend on the target's
random draws at the positions it proposes (n-gram lookup and greedy draft models depend
on the prefix only). With this coupling the output is not only distributed as the
target's: for a given seed it is token for token the output without speculation.
Plain Python; no JAX import.
"""
from __future__ import annotations

from typing import Sequence


def accepted_run(drafts: Sequence[int], targets: Sequence[int]) -> list[int]:
    """The tokens a verification step emits.

    Args:
      drafts: the k proposed tokens.
      targets: the k + 1 target samples, one per verification row (row j conditioned on
        the prefix and ``drafts[:j]``).
    Returns:
      ``targets[:m + 1]`` with m the length of the matching prefix: between 1 and k + 1
      tokens; ``len(result) - 1`` drafts were accepted.
    Raises:
      ValueError: ``len(targets) != len(drafts) + 1``.
    """
    if len(targets) != len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} target samples, got {len(targets)}")
    m = 0
    while m < len(drafts) and int(drafts[m]) == int(targets[m]):
        m += 1
    return [int(t) for t in targets[:m + 1]]
