"""Bucket ladders: smallest fitting bucket, fixed set, errors past the top."""
import pytest

from jaxinfer.runner.buckets import Bucket, BucketLadders


def test_ladders_and_round_up():
    lad = BucketLadders(max_num_batched_tokens=512, max_num_seqs=32, max_blocks=256)
    tl = lad.token_ladder
    assert tl[:4] == [1, 2, 4, 8] and tl[-1] == 512 and tl == sorted(set(tl))
    assert all(b / a <= 2.01 for a, b in zip(tl, tl[1:]))
    assert lad.width_ladder == [4, 16, 64, 256]
    assert lad.round_up(1, 1, 1) == Bucket(1, 1, 4)
    assert lad.round_up(3, 3, 1) == Bucket(4, 4, 4)
    assert lad.round_up(5, 2, 4) == Bucket(8, 8, 4)
    assert lad.round_up(17, 3, 5) == Bucket(24, 24, 16)
    assert lad.round_up(512, 32, 256) == Bucket(512, 32, 256)
    assert lad.round_up(40, 32, 1).num_seqs == 32
    assert lad.round_up(32, 32, 1) == Bucket(32, 32, 4)  # a full batch of decodes: max_num_seqs is a rung
    assert lad.round_up(25, 25, 1) == Bucket(32, 32, 4)
    assert BucketLadders(512, 20, 8).round_up(20, 20, 1) == Bucket(20, 20, 4)
    assert BucketLadders(8, 8, 8).token_ladder == [1, 2, 4, 8]  # already a rung: not twice
    for b in [lad.round_up(t, 1, w) for t in (1, 9, 100, 500) for w in (1, 3, 70)]:
        assert b in lad.all_buckets()
    with pytest.raises(ValueError):
        lad.round_up(513, 1, 1)
    with pytest.raises(ValueError):
        lad.round_up(8, 1, 257)


def test_seq_cap_must_fit_budget():
    with pytest.raises(ValueError):
        BucketLadders(16, 32, 8)


def test_larger_slots_keep_the_32_row_decode_rung():
    """128 slots (the default) add their own rung and keep 32: 32 decoding clients run unpadded."""
    lad = BucketLadders(max_num_batched_tokens=512, max_num_seqs=128, max_blocks=256)
    assert lad.round_up(32, 32, 1) == Bucket(32, 32, 4)
    assert lad.round_up(128, 128, 1) == Bucket(128, 128, 4)
    assert len(lad.all_buckets()) == len(BucketLadders(512, 32, 256).all_buckets()) + 4  # one rung x 4 widths


def test_default_slots_follow_the_token_budget():
    from jaxinfer.config import DEFAULT_MAX_NUM_SEQS, SchedulerConfig
    assert SchedulerConfig().max_num_seqs == DEFAULT_MAX_NUM_SEQS == 128
    assert SchedulerConfig(max_num_batched_tokens=64).max_num_seqs == 64  # a step holds one token per sequence
    assert SchedulerConfig(max_num_seqs=8).max_num_seqs == 8
    assert SchedulerConfig(scheduler="static").max_num_seqs == 32  # reserves max_model_len per member
    with pytest.raises(ValueError):
        SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=128)
