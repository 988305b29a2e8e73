"""The paged KV cache's host side: `block_manager` owns the blocks (free list, reference counts,
the prefix cache); the device arrays are the runner's.
"""
