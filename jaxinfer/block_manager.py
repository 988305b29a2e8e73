"""Host-side KV block allocator (PagedAttention's block manager, Kwon et al. 2023).

Owns the free list of physical KV blocks and nothing else: which request holds which
blocks lives on the `Request` (its block table row). Block 0 is the null block:
never handed out, it is where padding tokens write and what padding table entries
point at. Plain Python; no JAX import.

Allocation order is deterministic (lowest free id first at start, then LIFO of freed
blocks), so tests can assert exact block ids.
"""
from __future__ import annotations

import math

NULL_BLOCK = 0


class BlockManager:
    """Free-list allocator over ``num_blocks`` blocks of ``block_size`` tokens.

    Args:
      num_blocks: total physical blocks including the null block 0 (>= 2).
      block_size: tokens per block.

    Raises:
      ValueError: if ``num_blocks < 2``.
    """

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 2:
            raise ValueError(f"need at least 2 KV blocks (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Stack: pop() gives the lowest id first initially.
        self._free: list[int] = list(range(num_blocks - 1, NULL_BLOCK, -1))
        self._is_free = [True] * num_blocks
        self._is_free[NULL_BLOCK] = False

    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can ever be allocated (all but the null block)."""
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks required to hold ``num_tokens`` tokens."""
        return math.ceil(num_tokens / self.block_size)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks off the free list.

        Raises:
          MemoryError: if fewer than ``n`` blocks are free (nothing is taken then).
        """
        if n > len(self._free):
            raise MemoryError(f"asked for {n} KV blocks, {len(self._free)} free")
        out = [self._free.pop() for _ in range(n)]
        for b in out:
            self._is_free[b] = False
        return out

    def free(self, blocks: list[int]) -> None:
        """Return blocks to the free list (in reverse, so a re-allocation reuses them in order).

        Raises:
          ValueError: on the null block, an out-of-range id, or a double free.
        """
        for b in reversed(blocks):
            if b == NULL_BLOCK or not 0 < b < self.num_blocks:
                raise ValueError(f"cannot free block {b}")
            if self._is_free[b]:
                raise ValueError(f"block {b} freed twice")
            self._is_free[b] = True
            self._free.append(b)
