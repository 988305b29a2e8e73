"""Host-side batch packing (`jaxinfer.runner.batch.prepare`): what a step ships (pure numpy)."""
import dataclasses

import numpy as np

from jaxinfer.runner import batch as B
from jaxinfer.core.kv_cache.block_manager import BlockManager
from jaxinfer.runner.buckets import BucketLadders
from jaxinfer.config import CacheConfig, SchedulerConfig
from jaxinfer.core.request import Request
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.core.sched.continuous import ContinuousScheduler as Scheduler

V, MAX_LEN = 100, 128
LAYOUT = B.BatchLayout(BucketLadders(64, 4, MAX_LEN // 16), 16, V, MAX_LEN, 4)


def scheduled(params: list[SamplingParams], prompt_len: int = 20):
    s = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=MAX_LEN),
                  CacheConfig(watermark=0.0), BlockManager(40, 16))
    for i, p in enumerate(params):
        ids = [(7 * i + j) % V for j in range(prompt_len)]
        s.add_request(Request(str(i), ids, p, seed=0, max_tokens=p.max_tokens))
    return s.schedule()


def test_no_penalty_step_ships_no_history():
    s = B.prepare(scheduled([SamplingParams(max_tokens=4), SamplingParams(temperature=0.7, max_tokens=4)]),
                  LAYOUT).sampling
    assert s.hist_ids is None and s.num_prompt is None and s.num_hist is None
    assert not s.any_penalty


def test_penalty_step_ships_history_of_penalised_rows_only():
    plain, pen = SamplingParams(max_tokens=4), SamplingParams(max_tokens=4, repetition_penalty=1.3)
    out = scheduled([plain, pen], prompt_len=20)
    s = B.prepare(out, LAYOUT).sampling
    assert s.any_penalty
    assert s.hist_ids.shape == (s.temperature.shape[0], MAX_LEN)
    pen_req = out.scheduled[1][0]
    np.testing.assert_array_equal(s.hist_ids[1, :20], pen_req.all_token_ids)
    assert s.num_hist[1] == 20 and s.num_prompt[1] == 20
    assert (s.hist_ids[0] == V).all() and s.num_hist[0] == 0  # the plain row sends nothing


def test_warmup_shapes_include_history():
    bucket = LAYOUT.ladders.all_buckets()[0]
    s = B.empty_inputs(bucket, LAYOUT).sampling
    assert s.has_history and s.has_bitmask


def test_step_inputs_bytes_without_penalties_are_small():
    """A 4-row decode-size step: no array scales with max_model_len unless penalties are on."""
    a = B.prepare(scheduled([SamplingParams(max_tokens=4)] * 4), LAYOUT).to_arrays()
    with_hist = B.prepare(scheduled([SamplingParams(max_tokens=4, presence_penalty=0.5)] * 4), LAYOUT).to_arrays()
    size = lambda d: sum(v.nbytes for v in d.values())  # noqa: E731
    assert size(with_hist) - size(a) == sum(with_hist[k].nbytes for k in B.PENALTY_FIELDS)


def test_block_table_covers_each_rows_new_tokens():
    """One rule for both attention backends: a row's table reaches its last new token (a
    fresh 20-token prompt needs 2 blocks of 16, though it has no cached context)."""
    out = scheduled([SamplingParams(max_tokens=4)] * 2, prompt_len=20)
    inputs = B.prepare(out, LAYOUT)
    meta = inputs.attention
    for i, (req, n) in enumerate(out.scheduled):
        need = -(-(req.num_computed_tokens + n) // 16)
        assert inputs.bucket.ctx_blocks >= need
        np.testing.assert_array_equal(meta.block_tables[i, :need], req.block_ids[:need])
        assert meta.kv_lens[i] == req.num_computed_tokens + n
        assert meta.query_start_loc[i + 1] - meta.query_start_loc[i] == n


def test_step_inputs_round_trip_through_flat_arrays():
    """The multi-process step stream sends `to_arrays` and rebuilds with `from_arrays`: the
    same arrays land in the same fields, and absent optional fields stay absent."""
    for params in (SamplingParams(max_tokens=4), SamplingParams(max_tokens=4, presence_penalty=0.5)):
        inputs = B.prepare(scheduled([params] * 2), LAYOUT)
        back = B.StepInputs.from_arrays(inputs.bucket, {k: v.copy() for k, v in inputs.to_arrays().items()})
        np.testing.assert_array_equal(back.token_ids, inputs.token_ids)
        for meta, got in ((inputs.attention, back.attention), (inputs.sampling, back.sampling)):
            for f in dataclasses.fields(meta):
                want = getattr(meta, f.name)
                if want is None:
                    assert getattr(got, f.name) is None, f.name
                else:
                    np.testing.assert_array_equal(getattr(got, f.name), want, err_msg=f.name)
        assert back.sampling.has_history == params.has_penalties
    want = B.prepare(scheduled([SamplingParams(max_tokens=4, prompt_logprobs=1)]), LAYOUT)
    assert want.prompt_targets is not None  # followers run the prompt-logprobs pass too
    back = B.StepInputs.from_arrays(want.bucket, want.to_arrays())
    np.testing.assert_array_equal(back.prompt_targets, want.prompt_targets)
