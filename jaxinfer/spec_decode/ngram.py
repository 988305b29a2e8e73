"""N-gram prompt lookup proposals: copy what followed the last time the context's suffix
occurred.

For n from ``prompt_lookup_max`` down to ``prompt_lookup_min``, the last n tokens are
searched for earlier in the request's tokens (prompt and output); at the most recent
earlier match, the up to k tokens that followed it are the proposal. Longer matches
first: they predict better. Free to compute, and strong when the output copies spans of
the prompt (editing, rewriting, summaries with quotes, code). Prompt lookup decoding
(A. Saxena, 2023, github.com/apoorvumang/prompt-lookup-decoding), as vLLM's ``ngram``
method. Plain numpy; no JAX import.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    """Proposes draft tokens by suffix lookup.

    Args:
      min_n, max_n: shortest and longest suffix n-gram tried (tokens, 1 <= min_n <= max_n).
    """

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, token_ids: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens predicted to follow ``token_ids``; [] when no suffix of
        ``min_n``..``max_n`` tokens occurred before (or ``k < 1``).

        Args:
          token_ids: the request's tokens so far (prompt then output), int ids.
          k: most tokens to propose.
        Returns:
          The tokens that followed the most recent earlier occurrence of the longest
          matching suffix (fewer than k when that occurrence is near the end).
        """
        toks = np.asarray(token_ids, np.int64)
        L = len(toks)
        if k < 1:
            return []
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            # windows starting at 0 .. L-n-1: every occurrence except the suffix itself
            windows = sliding_window_view(toks[:L - 1], n)
            hits = np.flatnonzero((windows == toks[L - n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return toks[start:start + k].tolist()
        return []

    def propose_batch(self, reqs, ks: Sequence[int]) -> list[list[int]]:
        """`propose` for each request's tokens (``Request.all_token_ids``) and its k."""
        return [self.propose(req.all_token_ids, k) for req, k in zip(reqs, ks)]
