"""`TTFTEstimator` and the KV split of several models: pure functions, checked by hand."""
from __future__ import annotations

import math

import pytest

from jaxinfer.entrypoints.served_models import ModelSpec, describe_split, model_specs, split_kv_budget
from jaxinfer.engine.ttft_estimator import TTFTEstimator


def test_no_estimate_before_a_measurement():
    est = TTFTEstimator()
    est.on_added("a", 100)
    assert est.estimate(10) is None


def test_estimate_is_tokens_ahead_over_the_measured_rate():
    est = TTFTEstimator(tau_s=1.0)
    est.on_added("a", 1000)
    est.on_added("b", 500)
    est.on_step(0.5, 200)  # saturated (work pending after): 400 tokens/s
    assert est.rate == pytest.approx(400.0)
    assert est.estimate(100) == pytest.approx((1000 + 500 + 100) / 400.0)
    est.on_output("a")  # a's first token: its prompt is no longer ahead
    est.on_output("a")  # idempotent
    assert est.estimate(100) == pytest.approx((500 + 100) / 400.0)


def test_rate_is_a_time_weighted_moving_average_of_saturated_steps():
    est = TTFTEstimator(tau_s=2.0)
    est.on_added("a", 10_000)
    est.on_step(1.0, 100)  # 100 tok/s: first measurement taken as is
    est.on_step(0.5, 100)  # 200 tok/s, weight 1 - exp(-0.5 / 2)
    w = 1 - math.exp(-0.25)
    assert est.rate == pytest.approx(100 + w * (200 - 100))


def test_steps_without_backlog_lower_nothing_but_raise_to_a_proven_rate():
    est = TTFTEstimator(tau_s=1.0)
    est.on_added("a", 64)
    est.on_step(0.1, 32)  # 320 tok/s, a still pending
    est.on_output("a")
    est.on_step(0.1, 2)  # idle-ish step: 20 tok/s says nothing about capacity
    est.on_step(0.1, 0)  # decode only
    assert est.rate == pytest.approx(320.0)
    est.on_step(0.1, 64)  # 640 tok/s without backlog: the engine can do at least that
    assert est.rate == pytest.approx(640.0)
    est.on_added("b", 1000)
    est.on_step(0.1, 32)  # saturated again: back to the moving average
    assert est.rate == pytest.approx(640 + (1 - math.exp(-0.1)) * (320 - 640))


def test_a_small_first_request_does_not_anchor_the_average():
    est = TTFTEstimator(tau_s=2.0)
    est.on_added("a", 5)
    est.on_output("a")  # its first token came out of the step (outputs are fed before the step's timing)
    est.on_step(0.01, 5)  # a whole 5-token prompt in one step: 500 tok/s, unsaturated
    assert est.rate == pytest.approx(500.0)
    est.on_added("b", 4000)
    est.on_step(0.05, 512)  # the first saturated step is taken as is
    assert est.rate == pytest.approx(512 / 0.05)


def test_a_stalled_queue_drives_the_estimate_up():
    est = TTFTEstimator(tau_s=1.0)
    est.on_added("a", 1000)
    est.on_step(0.1, 100)
    first = est.estimate(0)
    for _ in range(20):  # memory-bound: steps run (decodes) but no prefill progresses
        est.on_step(0.1, 0)
    assert est.estimate(0) > 5 * first
    zero = TTFTEstimator()
    zero.on_added("a", 10)
    zero.on_step(0.1, 0)
    assert zero.estimate(1) == math.inf


def test_a_handed_request_counts_at_once_but_does_not_make_a_step_saturated():
    est = TTFTEstimator(tau_s=1.0)
    est.on_added("a", 64)
    est.on_output("a")
    est.on_step(0.1, 64)  # 640 tok/s, backlog cleared
    est.on_handed("b", 320, 8)  # handed over during a step: the next request sees it
    assert est.estimate(0) == pytest.approx(320 / 640)
    est.on_step(0.1, 6)  # b was not the engine's yet: an unsaturated step, which lowers nothing
    assert est.rate == pytest.approx(640.0)
    est.on_added("b", 320, 8)  # the engine took it: counted once
    assert est.pending_tokens == 320
    est.on_step(0.1, 32)  # now saturated: the first saturated step is taken as is
    assert est.rate == pytest.approx(320.0)
    est.on_handed("c", 100)
    est.on_dropped("c")  # refused: gone, and idempotent
    est.on_dropped("c")
    assert est.pending_tokens == 320


def test_beyond_the_slots_a_request_waits_for_the_soonest_finish():
    est = TTFTEstimator(tau_s=1.0, slots=2)
    est.on_added("a", 10, 5)
    est.on_added("b", 10, 8)
    est.on_step(0.2, 20, running=1)  # not a full batch: says nothing about the slot wait
    est.on_output("a")
    est.on_output("b")  # first tokens: 4 and 7 to go
    assert est.slot_wait() == math.inf  # every slot taken, no full-batch step measured yet
    assert est.estimate(10) == math.inf
    est.on_step(0.1, 0, running=2)
    assert est.full_step_s == pytest.approx(0.1)
    assert est.estimate(10) == pytest.approx(4 * 0.1 + 10 / est.rate)  # waits for a's last 4 steps
    est.on_handed("c", 10, 3)  # c takes a's slot (free after 4 steps) until step 7; the next waits for b (7)
    assert est.slot_wait() == pytest.approx(7 * 0.1)
    est.on_output("a", finished=True)  # c holds a's slot now: the next new one waits for c (3)
    assert est.slot_wait() == pytest.approx(3 * 0.1)
    est.on_dropped("c")
    assert est.slot_wait() == 0.0
    assert TTFTEstimator().slot_wait() == 0.0  # slots unknown: no slot wait


def test_model_specs_pair_names_and_add_the_fallback():
    specs = model_specs(["m", "m"], ["big", "small"], "small")
    assert [(s.path, s.name) for s in specs] == [("m", "big"), ("m", "small")]
    specs = model_specs(["a"], None, "b")  # a fallback not among the models is loaded too
    assert [(s.path, s.name) for s in specs] == [("a", "a"), ("b", "b")]
    with pytest.raises(ValueError, match="served as 'm'"):
        model_specs(["m", "m"], None, None)
    with pytest.raises(ValueError, match="at most one name per model"):
        model_specs(["m"], ["x", "y"], None)


def test_kv_budget_is_split_evenly_and_described():
    specs = [ModelSpec("a", "a"), ModelSpec("b", "b")]
    gib = 2**30
    split = split_kv_budget(specs, 4 * gib, None, 0.9, None)
    assert [s.kv_cache_memory for s in split] == [2 * gib, 2 * gib]
    assert describe_split(split) == "KV budget per model (per device): a 2.00 GiB, b 2.00 GiB"
    cpu = split_kv_budget(specs, None, None, 0.9, 3 * gib)  # the CPU default, shared
    assert sum(s.kv_cache_memory for s in cpu) <= 3 * gib and cpu[0].kv_cache_memory == 3 * gib // 2
    gpu = split_kv_budget(specs, None, 0.8, 0.9, None)
    assert [s.gpu_memory_utilization for s in gpu] == [0.4, 0.4] and gpu[0].kv_cache_memory is None
    assert [s.gpu_memory_utilization for s in split_kv_budget(specs, None, None, 0.9, None)] == [0.45, 0.45]
    one = split_kv_budget(specs[:1], None, None, 0.9, 3 * gib)  # one model: the flags as given
    assert (one[0].kv_cache_memory, one[0].gpu_memory_utilization) == (None, None)


def test_estimator_and_split_import_no_jax():
    from helpers import assert_imports_no_jax

    assert_imports_no_jax("import jaxinfer.engine.ttft_estimator, jaxinfer.entrypoints.served_models")
