"""The XLA path's work lists derived inside the jitted step (`jaxinfer.layers.attention.xla_work_plan`) equal
the host-side plan that `jaxinfer.runner.batch` used to ship, written out here in plain numpy, on
mixed steps packed by the real `batch.prepare_rows` (so with its bucket padding)."""
import types

import jax
import numpy as np
import pytest

from jaxinfer.runner import batch as B
from jaxinfer.runner.buckets import Bucket, BucketLadders
from jaxinfer.layers.attention import xla_work_plan as XW
from jaxinfer.layers.attention.xla_work_plan import plan_xla_work

BS = 16
LAYOUT = B.BatchLayout(BucketLadders(256, 16, 128), BS, 100, 2048, 4)
plan_jit = jax.jit(plan_xla_work, static_argnums=1)


def _rows(spec):
    """spec: (ctx_len, new_tokens) per row -> `batch.Row`s over fresh block ids."""
    rows, next_block = [], 1
    for ctx, n in spec:
        nblocks = -(-(ctx + n) // BS)
        req = types.SimpleNamespace(block_ids=list(range(next_block, next_block + nblocks)))
        next_block += nblocks
        rows.append(B.Row(req, ctx, [0] * n))
    return rows


def _host_plan(spec, bucket: Bucket) -> dict[str, np.ndarray]:
    """The plan as the host built it before it moved into the step (one row at a time)."""
    T, R, W = bucket.num_tokens, bucket.num_seqs, bucket.ctx_blocks
    q_chunk, span = min(XW.Q_CHUNK, T), XW.GROUP_BLOCKS * BS
    p = {"token_seq": np.full(T, -1), "row_ctx_len": np.zeros(R), "row_last": np.full(R, T),
         "item_row": np.zeros(XW.num_work_items(T, R)), "item_start": np.zeros(XW.num_work_items(T, R)),
         "item_len": np.zeros(XW.num_work_items(T, R)), "group_row": np.full(XW.num_context_groups(R, W), R),
         "group_index": np.zeros(XW.num_context_groups(R, W))}
    items, groups, offset = 0, 0, 0
    for i, (ctx, n) in enumerate(spec):
        p["token_seq"][offset:offset + n] = i
        p["row_ctx_len"][i] = ctx
        if n == 1:
            p["row_last"][i] = offset
            k = -(-ctx // span)
            p["group_row"][groups:groups + k], p["group_index"][groups:groups + k] = i, np.arange(k)
            groups += k
        elif ctx > 0:
            for s in range(0, n, q_chunk):
                p["item_row"][items], p["item_start"][items], p["item_len"][items] = i, offset + s, min(q_chunk, n - s)
                items += 1
        offset += n
    return {**p, "num_items": np.array(items), "num_groups": np.array(groups)}


MIXED_STEPS = [
    [(0, 1)],  # a first decode token with no context
    [(300, 1)],  # a lone decode: the one-token bucket
    [(1, 1), (15, 1), (16, 1), (17, 1), (63, 1), (64, 1), (65, 1), (1000, 1)],  # group edges (span 64)
    [(0, 5), (0, 40)],  # fresh prefills only: no context work at all
    [(200, 1), (0, 5), (40, 10), (2, 1), (0, 1)],  # decodes, a fresh prefill and a continuing chunk
    [(700, 1), (300, 7), (33, 70), (0, 3)],  # a 70-token chunk splits into two B2 items
    [(50, 1), (51, 1), (52, 1), (53, 1), (10, 1)],  # spec-verify rows of one request, and another decode
    [(128, 130), (5, 1)],  # a chunk longer than two Q_CHUNKs beside a decode
]


@pytest.mark.parametrize("spec", MIXED_STEPS)
def test_jitted_plan_equals_the_host_plan(spec):
    inputs = B.prepare_rows(_rows(spec), LAYOUT, greedy=True)
    assert inputs.bucket.num_seqs >= len(spec)
    got = plan_jit(inputs.attention, BS)
    want = _host_plan(spec, inputs.bucket)
    for name, value in want.items():
        arr = np.asarray(getattr(got, name))
        assert arr.dtype == np.int32, name
        np.testing.assert_array_equal(arr, value, err_msg=name)


def test_all_padding_step_plans_no_work():
    """Warm-up's all-padding inputs: every token is padding, no row has work."""
    bucket = Bucket(16, 16, 8)
    got = plan_jit(B.empty_inputs(bucket, LAYOUT, penalties=False, mask=False).attention, BS)
    want = _host_plan([], bucket)
    for name, value in want.items():
        np.testing.assert_array_equal(np.asarray(getattr(got, name)), value, err_msg=name)


def test_context_groups_cover_each_rows_real_context_only():
    """B1 reads at most one partly used group per row: a 2,000-token row beside short rows
    does not make the short rows read 2,000 (the bytes stay near the real context)."""
    spec = [(2000, 1)] + [(200, 1)] * 7
    inputs = B.prepare_rows(_rows(spec), LAYOUT, greedy=True)
    plan = plan_jit(inputs.attention, BS)
    span = XW.GROUP_BLOCKS * BS
    n = int(plan.num_groups)
    real_tokens = sum(ctx for ctx, _ in spec)
    assert n == sum(-(-ctx // span) for ctx, _ in spec)
    assert n * span <= 1.3 * real_tokens
    group_row = np.asarray(plan.group_row)
    assert list(group_row[:n]) == sorted(group_row[:n])
    assert (group_row[n:] == inputs.bucket.num_seqs).all()  # padding groups: the null row R
