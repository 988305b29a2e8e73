"""Scheduler: budgets, chunked prefill, watermark, preemption, deadlines (pure Python)."""
import pytest

from jaxinfer.core.kv_cache.block_manager import BlockManager
from jaxinfer.config import CacheConfig, SchedulerConfig
from jaxinfer.core.request import FinishReason, Request, RequestStatus
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.core.sched.continuous import ContinuousScheduler as Scheduler


def make(num_blocks=11, budget=64, max_seqs=4, watermark=0.0, max_len=256):
    bm = BlockManager(num_blocks, 16)
    s = Scheduler(SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=max_len),
                  CacheConfig(watermark=watermark), bm)
    return s, bm


def req(rid, n_prompt, max_tokens=8, **kw):
    return Request(str(rid), list(range(1000 * rid, 1000 * rid + n_prompt)), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   seed=0, max_tokens=max_tokens, **kw)


def run_step(s, token=7):
    out = s.schedule()
    s.update(out, [token] * len(out.scheduled))
    return out


def test_chunked_prefill_then_decode():
    s, bm = make(budget=32)
    r = req(0, 70)
    s.add_request(r)
    sizes = [n for _, n in run_step(s).scheduled]
    assert sizes == [32] and r.num_computed_tokens == 32 and r.output_token_ids == []
    assert [n for _, n in run_step(s).scheduled] == [32]
    out = run_step(s)
    assert [n for _, n in out.scheduled] == [6] and r.output_token_ids == [7]
    assert len(r.block_ids) == 5  # ceil(70/16)
    out = run_step(s)
    assert [n for _, n in out.scheduled] == [1] and r.num_tokens == 72


def test_running_topped_up_before_admission_and_seq_cap():
    s, bm = make(budget=64, max_seqs=2)
    a, b, c = req(0, 10), req(1, 10), req(2, 10)
    for r in (a, b, c):
        s.add_request(r)
    out = run_step(s)
    assert [r.request_id for r, _ in out.scheduled] == ["0", "1"]  # cap of 2 sequences
    out = run_step(s)
    assert [(r.request_id, n) for r, n in out.scheduled] == [("0", 1), ("1", 1)]
    assert c.status == RequestStatus.WAITING


def test_finish_frees_blocks_same_step():
    s, bm = make()
    r = req(0, 20, max_tokens=2)
    s.add_request(r)
    run_step(s)
    assert bm.num_free_blocks == 10 - 2
    run_step(s)
    assert r.is_finished and r.finish_reason == FinishReason.LENGTH
    assert bm.num_free_blocks == 10 and s.running == []


def test_watermark_holds_back_new_prefills_not_running():
    # 20 usable blocks, watermark 25% = 5 blocks kept free.
    s, bm = make(num_blocks=21, budget=256, watermark=0.25)
    a = req(0, 16 * 10, max_tokens=40)  # 10 blocks
    s.add_request(a)
    run_step(s)
    b = req(1, 16 * 6)  # would leave 20-10-6 = 4 < 5 free
    s.add_request(b)
    out = run_step(s)
    assert [r.request_id for r, _ in out.scheduled] == ["0"] and b.status == RequestStatus.WAITING
    c = req(2, 16 * 5)  # FIFO: c must not overtake b even though it would fit
    s.add_request(c)
    out = run_step(s)
    assert [r.request_id for r, _ in out.scheduled] == ["0"]


def test_lone_request_ignores_watermark():
    s, bm = make(num_blocks=11, budget=256, watermark=0.5)
    r = req(0, 16 * 9)  # 9 of 10 blocks: above the watermark, but nothing else runs
    s.add_request(r)
    assert [x.request_id for x, _ in run_step(s).scheduled] == ["0"]


def test_preemption_newest_first_and_recompute():
    s, bm = make(num_blocks=7, budget=64, max_seqs=4)  # 6 usable blocks
    a, b = req(0, 32, max_tokens=40), req(1, 32, max_tokens=40)  # 2 blocks each
    s.add_request(a)
    s.add_request(b)
    run_step(s)
    assert bm.num_free_blocks == 2
    # Grow both until the pool is exhausted: b (newest) must be preempted, not a.
    preempted = []
    for _ in range(40):
        out = run_step(s)
        preempted += out.preempted
        if preempted:
            break
    assert preempted and preempted[0] is b
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.block_ids == []
    assert s.waiting[0] is b and len(b.output_token_ids) > 0  # output kept
    assert s.num_preemptions == 1


def test_preempted_not_readmitted_until_whole_context_fits():
    s, bm = make(num_blocks=7, budget=128, max_seqs=4)
    a, b = req(0, 32, max_tokens=60), req(1, 32, max_tokens=60)
    s.add_request(a)
    s.add_request(b)
    for _ in range(80):
        out = run_step(s)
        if b.status == RequestStatus.PREEMPTED:
            break
    # While a keeps running, b comes back only when its whole context + 1 token fits.
    for _ in range(200):
        if a.is_finished and b.is_finished:
            break
        out = run_step(s)
        if any(r is b for r, _ in out.scheduled) and b.num_computed_tokens <= b.num_tokens:
            assert bm.num_free_blocks >= 0
    assert a.is_finished and b.is_finished and b.num_output_tokens == 60
    assert s.num_preemptions <= 3  # no thrash
    assert bm.num_free_blocks == 6


def test_deadline_and_queue_wait():
    s, bm = make(num_blocks=5, max_seqs=1)
    a = req(0, 16, deadline=None)
    b = req(1, 16, max_queue_wait_deadline=0.0)  # already expired
    c = req(2, 16, deadline=0.0)
    for r in (a, b, c):
        s.add_request(r)
    out = s.schedule(now=1.0)
    assert {r.request_id: r.finish_reason for r in out.finished} == {"1": FinishReason.REJECTED,
                                                                     "2": FinishReason.TIMEOUT}
    s.update(out, [7])
    a.deadline = 0.5  # a running request past its deadline is evicted and its blocks freed
    out = s.schedule(now=1.0)
    assert out.finished == [a] and a.finish_reason == FinishReason.TIMEOUT and bm.num_free_blocks == 4


def test_queue_wait_expires_only_beyond_the_free_slots():
    """Requests that have a free slot but wait for their turn at the token budget (a burst of
    prompts prefills one budget per step) are not queued: their queue-wait limit does not fire."""
    s, bm = make(num_blocks=20, budget=16, max_seqs=2)
    reqs = [req(i, 16, max_queue_wait_deadline=0.0) for i in range(3)]
    for r in reqs:
        s.add_request(r)
    out = s.schedule(now=1.0)  # one 16-token prompt per step; 0 and 1 hold the two slots, 2 is queued
    assert [r.request_id for r in out.finished] == ["2"] and reqs[2].finish_reason == FinishReason.REJECTED
    s.update(out, [7] * len(out.scheduled))
    out = s.schedule(now=2.0)
    assert out.finished == [] and [r.request_id for r, _ in out.scheduled][-1] == "1"


@pytest.mark.parametrize("kwargs", [dict(max_num_seqs=0), dict(max_num_batched_tokens=0), dict(max_model_len=1),
                                    dict(max_queue_len=-1), dict(batch_timeout_s=-1.0), dict(scheduler="fifo")])
def test_scheduler_config_rejects_limits_that_never_schedule(kwargs):
    with pytest.raises(ValueError):
        SchedulerConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(watermark=1.0), dict(watermark=-0.1), dict(num_blocks=1)])
def test_cache_config_rejects_impossible_pools(kwargs):
    with pytest.raises(ValueError):
        CacheConfig(**kwargs)


def make_capped(cap, num_blocks=40, budget=64, max_seqs=4):
    bm = BlockManager(num_blocks, 16)
    s = Scheduler(SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=256,
                                  prefill_budget_while_decoding=cap), CacheConfig(watermark=0.0), bm)
    return s, bm


def test_decodes_scheduled_before_a_continuing_prefill_chunk():
    """A long chunk ahead of a decode in the running list must not push the decode out."""
    s, _ = make_capped(None, budget=32)
    a = req(0, 10)
    s.add_request(a)
    run_step(s)  # a prefilled, now decoding
    b = req(1, 100)
    s.add_request(b)
    run_step(s)  # b admitted: 31 tokens of its prompt
    s.running.remove(a)
    s.running.append(a)  # a now sits behind b's continuing prefill (as after a re-admission)
    out = run_step(s)
    assert [(r.request_id, n) for r, n in out.scheduled] == [("0", 1), ("1", 31)]


def test_prefill_budget_while_decoding_caps_chunks_and_admissions():
    s, _ = make_capped(8, budget=64)
    a = req(0, 10)
    s.add_request(a)
    assert [n for _, n in run_step(s).scheduled] == [10]  # nothing decoding: full budget
    b, c = req(1, 40), req(2, 40)
    s.add_request(b)
    s.add_request(c)
    out = run_step(s)
    assert [(r.request_id, n) for r, n in out.scheduled] == [("0", 1), ("1", 8)]
    assert out.num_tokens == 9
    out = run_step(s)
    assert [(r.request_id, n) for r, n in out.scheduled] == [("0", 1), ("1", 8)]


def test_prefill_budget_does_not_limit_prefill_only_steps():
    s, _ = make_capped(8, budget=64)
    s.add_request(req(0, 50))
    assert [n for _, n in run_step(s).scheduled] == [50]


def test_preemption_never_takes_a_request_scheduled_this_step():
    """Decodes are scheduled first, so the newest running request may already hold a row
    of this step when an older prefill runs out of blocks: the victim must then be the
    newest *unscheduled* request (here the prefill itself), never a scheduled row."""
    s, bm = make_capped(None, num_blocks=6, budget=16)  # 5 usable blocks
    d, p = req(1, 30, max_tokens=4), req(0, 40, max_tokens=4)
    s.add_request(d)
    s.add_request(p)
    preempted_at = None
    for step in range(8):
        if len(s.running) == 2 and s.running[0] is d:
            s.running.reverse()  # p older than d in the running order (as after a re-admission)
        out = s.schedule()
        for r, n in out.scheduled:
            assert len(r.block_ids) * 16 >= r.num_computed_tokens + n  # every row has its blocks
        if out.preempted:
            preempted_at = step
            assert out.preempted == [p] and [r for r, _ in out.scheduled] == [d]
        s.update(out, [7] * len(out.scheduled))
    assert preempted_at is not None and d.is_finished
