"""The queue-wait bound on the estimated wait for a sequence slot (issue 50, docs/api.md "Admission").

Unit tests of `TTFTEstimator.queue_wait` and `admission.check_wait` (no clock: the estimate
is in measured steps), and an engine-level test over the fake runner behind a real server:
a burst that will drain within the bound is queued, not refused; a flood is refused at once
with 429 + Retry-After, and the KV pool is idle again after.
"""
from __future__ import annotations

import asyncio
import math
import time

import httpx
import pytest

from api_helpers import LiveServer, fake_engine, parse_metrics, running_app, wait_until
from jaxinfer.engine import admission
from jaxinfer.entrypoints.openai.config import QUEUE_WAIT_EXPIRY_FACTOR, ServerConfig
from jaxinfer.errors import QueueFullError
from jaxinfer.engine.ttft_estimator import TTFTEstimator


def _busy(slots: int, remaining: list[int], step_s: float | None = 0.5) -> TTFTEstimator:
    est = TTFTEstimator(slots=slots)
    for i, n in enumerate(remaining):
        est.on_handed(f"r{i}", 10, n)
    if step_s is not None:
        est.on_step(step_s, 0, running=slots)
    return est


def test_queue_wait_is_zero_while_free_slots_hold_the_group():
    est = _busy(4, [100, 100], step_s=None)
    assert est.queue_wait(1) == 0.0 and est.queue_wait(2) == 0.0
    assert est.queue_wait(3) is None  # one must queue, and no full-batch step was measured


def test_queue_wait_counts_the_slots_freeing_in_order():
    est = _busy(2, [10, 40, 5])  # r0, r1 run; r2 waits for r0 (step 10) then runs 5 steps
    assert est.queue_wait(1) == pytest.approx(15 * 0.5)  # next slot: r2's end (10 + 5) before r1's (40)
    assert est.queue_wait(2, max_tokens=8) == pytest.approx(23 * 0.5)  # the second waits for the first (15 + 8)
    assert est.slot_wait() == pytest.approx(15 * 0.5)  # the degradation estimate is unchanged


def test_check_wait_refuses_over_the_bound_with_the_estimate_as_retry_after():
    admission.check_wait(None, 30.0)  # unknown: queued (bounded by --max-queue-len)
    admission.check_wait(29.0, 30.0)
    admission.check_wait(1e9, None)  # no bound
    with pytest.raises(QueueFullError) as info:
        admission.check_wait(42.4, 30.0)
    assert info.value.retry_after == pytest.approx(42.4) and "42 s" in info.value.message
    with pytest.raises(QueueFullError) as info:
        admission.check_wait(math.inf, 30.0)
    assert info.value.retry_after == 300.0


def test_queued_requests_expire_only_at_the_backstop():
    assert ServerConfig(max_queue_wait=30.0).queue_wait_expiry == QUEUE_WAIT_EXPIRY_FACTOR * 30.0
    assert ServerConfig(max_queue_wait=None).queue_wait_expiry is None


async def _send(url: str, n: int, max_tokens: int, offset: int = 0) -> list[tuple[httpx.Response, float]]:
    async def one(c: httpx.AsyncClient, i: int):
        t0 = time.monotonic()
        r = await c.post("/v1/completions", json={"prompt": [300 + offset + i, 301, 302], "max_tokens": max_tokens,
                                                 "ignore_eos": True})
        return r, time.monotonic() - t0
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=200)) as c:
        return await asyncio.gather(*(one(c, i) for i in range(n)))


def test_burst_that_drains_is_queued_and_flood_gets_fast_429():
    engine = fake_engine(num_blocks=257, max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64,
                         max_queue_len=64, step_delay=0.01)
    with running_app(engine, max_queue_wait=2.0) as (app, ae), LiveServer(app) as live:
        burst = asyncio.run(_send(live.url, 12, 8))  # 3 waves of ~8 steps: well within 2 s
        assert [r.status_code for r, _ in burst] == [200] * 12
        assert ae.ttft.full_step_s is not None  # the full-batch step was measured

        async def flood():
            long = asyncio.create_task(_send(live.url, 4, 150, offset=100))  # the slots, for ~1.5 s or more
            assert await asyncio.to_thread(wait_until, lambda: ae.ttft.queue_wait(1) not in (None, 0.0), 5)
            refused = await _send(live.url, 40, 150, offset=200)
            return await long, refused
        long, refused = asyncio.run(flood())
        assert [r.status_code for r, _ in long] == [200] * 4
        statuses = [r.status_code for r, _ in refused]
        assert set(statuses) <= {200, 429} and statuses.count(429) >= 30, statuses
        for r, seconds in refused:
            if r.status_code == 429:
                assert r.json()["error"]["code"] == "queue_full" and "estimated wait" in r.json()["error"]["message"]
                assert int(r.headers["retry-after"]) >= 2 and seconds < 1.0  # refused at once, told the drain
        assert wait_until(lambda: parse_metrics(httpx.get(live.url + "/metrics").text)["jaxinfer_kv_blocks_free"]
                          == 256, 5)


def test_a_full_budget_prefill_step_seeds_the_step_time():
    """A cold-start flood fills the slots one prompt per step: the first step that prefilled
    the whole budget gives the estimate its step time; full-batch steps move it from there."""
    est = _busy(2, [10, 40, 5], step_s=None)
    est.full_tokens = 512
    est.on_step(0.4, 100, running=1)  # a partial prefill says nothing
    assert est.queue_wait(1) is None
    est.on_step(0.4, 512, running=1)
    assert est.queue_wait(1) == pytest.approx(15 * 0.4)
    est.on_step(0.8, 512, running=1)  # only the seed: later budget steps do not move it
    assert est.full_step_s == pytest.approx(0.4)
    est.on_step(0.2, 0, running=2)  # a full-batch step does
    assert 0.2 < est.full_step_s < 0.4


def test_a_burst_holding_free_slots_is_served_however_slow_its_prefill():
    """Issue 50 measured: a burst of long prompts prefills one token budget per step, so with
    slots free for all of it the last prompts waited past the queue-wait limit and got 429
    queue_wait_expired. They hold their slots: every one is answered."""
    engine = fake_engine(num_blocks=257, max_model_len=256, max_num_seqs=8, max_num_batched_tokens=16,
                         max_queue_len=64, step_delay=0.05)
    with running_app(engine, max_queue_wait=0.1) as (app, _), LiveServer(app) as live:
        async def burst():
            async with httpx.AsyncClient(base_url=live.url, timeout=60) as c:
                return await asyncio.gather(*(c.post("/v1/completions", json={
                    "prompt": list(range(400 + 16 * i, 416 + 16 * i)), "max_tokens": 2, "ignore_eos": True})
                    for i in range(8)))  # 8 steps of prefill (> 2 x 0.1 s), 8 free slots
        assert [r.status_code for r in asyncio.run(burst())] == [200] * 8
