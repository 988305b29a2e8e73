"""Every static shape the jitted step is compiled for, in one place.

A step is padded to a `Bucket` = (num_tokens T, num_seqs R, context width W):
  * T, tokens per step: 1, 2, 4 (a lone decoding stream runs matmuls with one row,
    ~2x faster on CPU than padding to 8), then from 8 up to the per-step token budget
    growing by about 1.5x in multiples of 8 (8, 16, 24, 40, 64, 96, 144, ...), so padding
    wastes at most ~1/3; and ``max_num_seqs`` itself, the step of a full batch of decoding
    sequences (32 rows by default ran in the 40 bucket: 5.6-8.5% slower on a 2-core CPU),
    and `DECODE_RUNGS` below it (32 clients decoding keep their unpadded 32-row step when
    ``max_num_seqs`` is larger: 4 more compiles at warm-up, one per context width).
  * R, sequence rows: tied to T as ``min(T, max_num_seqs)`` (a step never has more
    sequences than tokens). Padding rows cost a row of the LM head each where XLA's dot runs
    it; the packed-product kernels (CPU) skip padding rows and padding tokens altogether.
  * W, block-table width in blocks for each row's whole context including this step's
    tokens (one rule for both attention backends, `jaxinfer.layers.step_metadata.AttentionMetadata`):
    ``min_width`` then powers of ``width_growth`` up to ``ceil(max_model_len / block_size)``.
    A step always has a new token, so W is never 0.
The runner compiles every (T, W) pair at start-up; `round_up` picks the smallest bucket
that fits. Keep ``len(token_ladder) * len(width_ladder)`` small: each is one compile.
Plain Python; no JAX import.
"""
from __future__ import annotations

import bisect
import dataclasses
import math


DECODE_RUNGS = (32,)  # full-batch decode steps of the common load (`--concurrency` 32), kept as rungs


@dataclasses.dataclass(frozen=True, order=True)
class Bucket:
    """Static shape of one step: T tokens, R sequence rows, W context blocks per row."""

    num_tokens: int
    num_seqs: int
    ctx_blocks: int


def _ladder(lo: int, hi: int, growth: float) -> list[int]:
    """Increasing integers from lo to hi (inclusive), each ~growth x the last, multiples of 8 past 8."""
    out = [lo]
    while out[-1] < hi:
        nxt = max(out[-1] + 1, int(math.ceil(out[-1] * growth / 8.0)) * 8)
        out.append(min(nxt, hi))
    return out


@dataclasses.dataclass(frozen=True)
class BucketLadders:
    """The ladders for one engine configuration.

    Args:
      max_num_batched_tokens: per-step token budget (top of the T ladder).
      max_num_seqs: cap on sequences per step (top of R).
      max_blocks: ceil(max_model_len / block_size) (top of W).
      token_growth: ratio between T rungs (1.5 default).
      width_growth: ratio between W rungs (4 default: few compiles, at most 4x
        over-read of context).
      min_width: smallest W rung.
    """

    max_num_batched_tokens: int
    max_num_seqs: int
    max_blocks: int
    token_growth: float = 1.5
    width_growth: int = 4
    min_width: int = 4

    def __post_init__(self) -> None:
        if self.max_num_seqs > self.max_num_batched_tokens:
            raise ValueError("max_num_seqs must not exceed max_num_batched_tokens")

    @property
    def token_ladder(self) -> list[int]:
        small = [t for t in (1, 2, 4) if t < self.max_num_batched_tokens]
        rungs = small + _ladder(min(8, self.max_num_batched_tokens), self.max_num_batched_tokens, self.token_growth)
        decode = {r for r in DECODE_RUNGS if r < self.max_num_seqs} | {self.max_num_seqs}
        return sorted(set(rungs) | decode)  # a full batch of decoding rows runs unpadded

    @property
    def width_ladder(self) -> list[int]:
        out = []
        w = min(self.min_width, self.max_blocks)
        while w < self.max_blocks:
            out.append(w)
            w *= self.width_growth
        out.append(self.max_blocks)
        return out

    def num_seqs_for(self, num_tokens: int) -> int:
        return min(num_tokens, self.max_num_seqs)

    def all_buckets(self) -> list[Bucket]:
        """Every bucket the runner compiles at warm-up."""
        return [Bucket(t, self.num_seqs_for(t), w) for t in self.token_ladder for w in self.width_ladder]

    def round_up(self, num_tokens: int, num_seqs: int, ctx_blocks: int) -> Bucket:
        """Smallest bucket holding a step of this size.

        Raises:
          ValueError: if the step exceeds the largest bucket (a scheduler bug).
        """
        tl, wl = self.token_ladder, self.width_ladder
        i = bisect.bisect_left(tl, num_tokens)
        j = bisect.bisect_left(wl, ctx_blocks)
        if i == len(tl) or j == len(wl) or num_seqs > self.max_num_seqs:
            raise ValueError(f"step ({num_tokens} tokens, {num_seqs} seqs, {ctx_blocks} blocks) exceeds the buckets")
        return Bucket(tl[i], self.num_seqs_for(tl[i]), wl[j])
