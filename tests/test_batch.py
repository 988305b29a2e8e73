"""Host-side batch packing (`jaxinfer.batch.prepare`): what a step ships (pure numpy)."""
import numpy as np

from jaxinfer import batch as B
from jaxinfer.block_manager import BlockManager
from jaxinfer.buckets import BucketLadders
from jaxinfer.config import CacheConfig, SchedulerConfig
from jaxinfer.request import Request
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.continuous_scheduler import ContinuousScheduler as Scheduler

V, MAX_LEN = 100, 128
LAYOUT = B.BatchLayout(BucketLadders(64, 4, MAX_LEN // 16), 16, V, MAX_LEN, 4, False)


def scheduled(params: list[SamplingParams], prompt_len: int = 20):
    s = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=MAX_LEN),
                  CacheConfig(watermark=0.0), BlockManager(40, 16))
    for i, p in enumerate(params):
        ids = [(7 * i + j) % V for j in range(prompt_len)]
        s.add_request(Request(str(i), ids, p, seed=0, max_tokens=p.max_tokens))
    return s.schedule()


def test_no_penalty_step_ships_no_history():
    a = B.prepare(scheduled([SamplingParams(max_tokens=4), SamplingParams(temperature=0.7, max_tokens=4)]),
                  LAYOUT).arrays
    assert not any(k in a for k in B.PENALTY_FIELDS)
    assert not a["any_penalty"]


def test_penalty_step_ships_history_of_penalised_rows_only():
    plain, pen = SamplingParams(max_tokens=4), SamplingParams(max_tokens=4, repetition_penalty=1.3)
    out = scheduled([plain, pen], prompt_len=20)
    a = B.prepare(out, LAYOUT).arrays
    assert a["any_penalty"]
    assert a["hist_ids"].shape == (a["temperature"].shape[0], MAX_LEN)
    pen_req = out.scheduled[1][0]
    np.testing.assert_array_equal(a["hist_ids"][1, :20], pen_req.all_token_ids)
    assert a["num_hist"][1] == 20 and a["num_prompt"][1] == 20
    assert (a["hist_ids"][0] == V).all() and a["num_hist"][0] == 0  # the plain row sends nothing


def test_warmup_shapes_include_history():
    bucket = LAYOUT.ladders.all_buckets()[0]
    a = B.empty_inputs(bucket, LAYOUT)
    assert all(k in a for k in B.PENALTY_FIELDS)


def test_step_inputs_bytes_without_penalties_are_small():
    """A 4-row decode-size step: no array scales with max_model_len unless penalties are on."""
    a = B.prepare(scheduled([SamplingParams(max_tokens=4)] * 4), LAYOUT).arrays
    with_hist = B.prepare(scheduled([SamplingParams(max_tokens=4, presence_penalty=0.5)] * 4), LAYOUT).arrays
    size = lambda d: sum(v.nbytes for v in d.values())  # noqa: E731
    assert size(with_hist) - size(a) == sum(with_hist[k].nbytes for k in B.PENALTY_FIELDS)
