"""Block manager: exact block ids, null block, double free, nothing leaked."""

import pytest

from helpers import assert_imports_no_jax
from jaxinfer.core.kv_cache.block_manager import NULL_BLOCK, BlockManager


def test_host_modules_do_not_import_jax():
    assert_imports_no_jax("import jaxinfer.core.sched.scheduler, jaxinfer.core.sched.continuous, jaxinfer.core.sched.priority, "
                          "jaxinfer.core.stop, jaxinfer.engine.protocol, jaxinfer.core.kv_cache.block_manager, jaxinfer.runner.batch, "
                          "jaxinfer.layers.step_metadata, "
                          "jaxinfer.runner.buckets, jaxinfer.core.request, jaxinfer.sampling_params, jaxinfer.tokenizer.tokenizer, "
                          "jaxinfer.tokenizer.chat; import jaxinfer")


def test_allocation_order_and_null_block():
    bm = BlockManager(8, 16)
    assert bm.num_usable_blocks == 7 and bm.num_free_blocks == 7
    a = bm.allocate(3)
    assert a == [1, 2, 3]
    b = bm.allocate(2)
    assert b == [4, 5]
    bm.free(a)
    assert bm.num_free_blocks == 5
    assert bm.allocate(3) == [1, 2, 3]  # freed blocks come back in order
    assert NULL_BLOCK not in a + b


def test_exhaustion_and_errors():
    bm = BlockManager(4, 16)
    blocks = bm.allocate(3)
    with pytest.raises(MemoryError):
        bm.allocate(1)
    assert bm.num_free_blocks == 0
    bm.free(blocks[:1])
    with pytest.raises(ValueError):
        bm.free(blocks[:1])  # double free
    with pytest.raises(ValueError):
        bm.free([NULL_BLOCK])
    with pytest.raises(ValueError):
        bm.free([99])
    with pytest.raises(ValueError):
        BlockManager(1, 16)


def test_blocks_needed():
    bm = BlockManager(4, 16)
    assert [bm.blocks_needed(n) for n in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]
