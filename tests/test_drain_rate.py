"""Retry-After from the measured drain rate (`jaxinfer.engine.drain_rate`), alone and in the engine."""
import pytest

from jaxinfer.engine.drain_rate import DrainRate
from jaxinfer.errors import QueueFullError
from jaxinfer.sampling_params import SamplingParams

from api_helpers import fake_engine


def test_rate_over_the_window():
    d = DrainRate(window_s=10.0)
    d.record(0.0, 0)
    for t in range(1, 11):
        d.record(float(t), 2)  # 2 admissions a second
    assert d.rate(10.0) == pytest.approx(2.0)
    assert d.seconds_to_drain(10, 10.0) == pytest.approx(5.0)  # 10 queued at 2/s
    d.record(30.0, 0)  # 20 s without an admission: the window is empty again
    assert d.rate(30.0) is None
    assert d.seconds_to_drain(3, 30.0) == d.max_s  # a queue that does not move


def test_clamped_and_idle():
    d = DrainRate(min_s=1.0, max_s=60.0)
    assert d.seconds_to_drain(0, 0.0) == 1.0  # nothing measured, nothing queued
    d.record(0.0, 0)
    d.record(1.0, 100)
    assert d.seconds_to_drain(1, 1.0) == 1.0  # fast drain: the floor
    d2 = DrainRate(window_s=100.0, min_s=1.0, max_s=60.0)
    d2.record(0.0, 0)
    d2.record(100.0, 1)
    assert d2.seconds_to_drain(1000, 100.0) == 60.0  # slow drain: the ceiling


def test_engine_queue_full_carries_measured_retry_after():
    """One admission per 0.5 s step (a sequence cap of 1): a full queue of 4 drains in
    about 2 s at the measured rate, and the 429's Retry-After says so (not a constant)."""
    e = fake_engine(max_num_seqs=1, max_num_batched_tokens=8, max_queue_len=4, step_delay=0.5)
    sp = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0)
    for i in range(4):
        e.add_request(f"r{i}", [10 + i], sp)
    for _ in range(3):
        e.step()  # each step admits one request and finishes it
    for i in range(4, 8):  # 5 waiting: the free slot takes one, 4 are queued
        e.add_request(f"r{i}", [10 + i], sp)
    with pytest.raises(QueueFullError) as info:
        e.add_request("over", [99], sp)
    assert 1.5 <= info.value.retry_after <= 2.7  # 4 queued / (3 admitted in ~1.5 s)
    assert e.snapshot().retry_after_s == 1.0  # after the last step 1 was queued: 0.5 s, the floor
