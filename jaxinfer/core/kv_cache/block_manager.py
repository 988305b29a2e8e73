"""Host-side KV block allocator with automatic prefix caching.

Owns the physical KV blocks: the free list, reference counts, and the prefix cache
(PagedAttention, Kwon et al. 2023; automatic prefix caching as in vLLM). Which request
holds which blocks lives on the `Request` (its block table row). Block 0 is the null
block: never handed out, it is where padding tokens write.

Prefix caching: a *full* block is identified by a hash chained over its tokens and its
parent block's hash (`chain_hashes`), seeded with a salt for anything else that changes
the KV (the model). A computed full block is registered under its hash; a later request
whose leading blocks hash the same reuses them (reference count + 1) instead of
prefilling them. A block whose count drops to 0 keeps its contents and hash and waits in
an LRU pool of *evictable* blocks, counted as free; it is reclaimed (hash dropped) only
when a fresh block is needed and the plain free list is empty. A block in use is never
evicted; a partial block is never registered, so never shared.

Allocation order is deterministic (lowest id first at start, then LIFO of freed
blocks; evictable blocks least recently freed first), so tests can assert exact ids.
Plain Python; no JAX import.
"""
from __future__ import annotations

import collections
import hashlib
import math
from typing import Sequence

import numpy as np

NULL_BLOCK = 0


def chain_hashes(token_ids: Sequence[int], block_size: int, salt: bytes = b"", known: Sequence[bytes] = ()) -> list[bytes]:
    """Chained hashes of every full block of ``token_ids``.

    ``h_i = blake2b(h_{i-1} || tokens of block i)``, ``h_{-1} = blake2b(salt)``. ``known`` are
    hashes already computed for the leading blocks (extended, not recomputed).

    Returns:
      One 16-byte digest per full block.
    """
    out = list(known)
    parent = out[-1] if out else hashlib.blake2b(salt, digest_size=16).digest()
    for i in range(len(out), len(token_ids) // block_size):
        block = np.asarray(token_ids[i * block_size:(i + 1) * block_size], np.int64).tobytes()
        parent = hashlib.blake2b(parent + block, digest_size=16).digest()
        out.append(parent)
    return out


class BlockManager:
    """Reference-counted allocator over ``num_blocks`` blocks of ``block_size`` tokens.

    Args:
      num_blocks: total physical blocks including the null block 0 (>= 2).
      block_size: tokens per block.
      enable_prefix_caching: register and reuse full blocks by hash.

    Raises:
      ValueError: if ``num_blocks < 2``.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 2:
            raise ValueError(f"need at least 2 KV blocks (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._free: list[int] = list(range(num_blocks - 1, NULL_BLOCK, -1))  # pop() gives lowest id first
        self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()  # LRU first
        self._ref = [0] * num_blocks
        self._hash_of: list[bytes | None] = [None] * num_blocks
        self._cached: dict[bytes, int] = {}
        self.num_evictions = 0

    # ----- counts -------------------------------------------------------------------------
    @property
    def num_usable_blocks(self) -> int:
        """Blocks that can ever be allocated (all but the null block)."""
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks available for allocation: plain free + evictable cached blocks."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks required to hold ``num_tokens`` tokens."""
        return math.ceil(num_tokens / self.block_size)

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free_blocks

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    # ----- allocate / free ----------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """Take ``n`` fresh blocks (free list first, then the least recently used evictable).

        Raises:
          MemoryError: if fewer than ``n`` blocks are free (nothing is taken then).
        """
        if n > self.num_free_blocks:
            raise MemoryError(f"asked for {n} KV blocks, {self.num_free_blocks} free")
        out = []
        for _ in range(n):
            if self._free:
                b = self._free.pop()
            else:
                b, _ = self._evictable.popitem(last=False)
                del self._cached[self._hash_of[b]]
                self._hash_of[b] = None
                self.num_evictions += 1
            self._ref[b] = 1
            out.append(b)
        return out

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block (in reverse, so the tail is evicted first).

        Raises:
          ValueError: on the null block, an out-of-range id, or a block with no reference.
        """
        for b in reversed(blocks):
            if b == NULL_BLOCK or not 0 < b < self.num_blocks:
                raise ValueError(f"cannot free block {b}")
            if self._ref[b] == 0:
                raise ValueError(f"block {b} freed twice")
            self._ref[b] -= 1
            if self._ref[b] == 0:
                if self._hash_of[b] is not None:
                    self._evictable[b] = None
                else:
                    self._free.append(b)

    # ----- prefix cache -------------------------------------------------------------------
    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """Blocks holding the longest cached prefix of ``hashes`` (not yet referenced)."""
        out = []
        if self.enable_prefix_caching:
            for h in hashes:
                b = self._cached.get(h)
                if b is None:
                    break
                out.append(b)
        return out

    def num_evictable_in(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` sit in the evictable pool (taking them uses free space)."""
        return sum(1 for b in blocks if self._ref[b] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        """Add a reference to cached blocks (a prefix hit); evictable ones leave the pool."""
        for b in blocks:
            if self._ref[b] == 0:
                del self._evictable[b]
            self._ref[b] += 1

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (e.g. after the KV memory was written by someone else).

        Only when no block is in use; returns False (and changes nothing) otherwise. The free
        list is rebuilt in its initial order.
        """
        if self.num_used_blocks:
            return False
        self._evictable.clear()
        self._cached.clear()
        self._hash_of = [None] * self.num_blocks
        self._free = list(range(self.num_blocks - 1, NULL_BLOCK, -1))
        return True

    def register(self, block: int, block_hash: bytes) -> None:
        """Record that ``block`` holds the full block ``block_hash`` (first holder wins)."""
        if self.enable_prefix_caching and self._hash_of[block] is None and block_hash not in self._cached:
            self._hash_of[block] = block_hash
            self._cached[block_hash] = block
