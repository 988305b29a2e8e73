"""Priority scheduling: admission and preemption order, aging bound; one scheduler base
for every policy; the one stop check (pure Python, a simulated clock: step t runs at
``now = t``)."""
import pytest

from jaxinfer.core.kv_cache.block_manager import BlockManager
from jaxinfer.config import CacheConfig, SchedulerConfig
from jaxinfer.core.sched.continuous import ContinuousScheduler
from jaxinfer.core.sched.priority import PriorityScheduler
from jaxinfer.core.request import FinishReason, Request, RequestStatus
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.core.sched.scheduler import Scheduler, make_scheduler
from jaxinfer.core.sched.static import StaticScheduler
from jaxinfer.core.stop import check_stop


def make(policy="priority", num_blocks=64, budget=64, max_seqs=4, aging=None):
    config = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=256,
                             scheduling_policy=policy, priority_aging_s=aging)
    return make_scheduler(config, CacheConfig(watermark=0.0), BlockManager(num_blocks, 16))


def req(rid: int, priority: int, n_prompt=4, max_tokens=1, arrival=0.0) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, priority=priority)
    return Request(str(rid), list(range(n_prompt)), params, seed=0, max_tokens=max_tokens,
                   arrival_time=arrival + rid * 1e-6)  # ties in time broken by id, as arrival order


def step(s, now: float) -> list[str]:
    """One step at ``now``; returns the ids admitted in it (first scheduled now)."""
    out = s.schedule(now)
    s.update(out, [7] * len(out.scheduled))
    return [r.request_id for r, _ in out.scheduled if r.first_scheduled_time == now]


def admission_order(s, reqs) -> list[str]:
    for r in reqs:
        s.add_request(r)
    order, t = [], 0.0
    while s.num_unfinished:
        order += step(s, t)
        t += 1
    return order


PRIORITIES = [5, 0, 3, 0, 10, -2, 3]


def test_policies_are_subclasses_of_one_base():
    assert isinstance(make("fcfs"), ContinuousScheduler) and type(make("fcfs")) is ContinuousScheduler
    assert isinstance(make("priority"), PriorityScheduler)
    static = make_scheduler(SchedulerConfig(scheduler="static"), CacheConfig(), BlockManager(64, 16))
    assert isinstance(static, StaticScheduler)
    for cls in (ContinuousScheduler, PriorityScheduler, StaticScheduler):
        assert issubclass(cls, Scheduler)
        for shared in ("add_request", "expire", "update"):  # owned by the base, not copied
            assert shared not in vars(cls), (cls, shared)


@pytest.mark.parametrize("max_seqs", [1, 2])
def test_admission_order_by_priority_then_arrival(max_seqs):
    reqs = [req(i, p) for i, p in enumerate(PRIORITIES)]
    order = admission_order(make(max_seqs=max_seqs), reqs)
    assert order == [r.request_id for r in sorted(reqs, key=lambda r: (r.params.priority, r.arrival_time))]
    fcfs = admission_order(make("fcfs", max_seqs=max_seqs), [req(i, p) for i, p in enumerate(PRIORITIES)])
    assert fcfs == [str(i) for i in range(len(PRIORITIES))]  # the default policy ignores priority


def test_priority_request_arriving_later_is_admitted_next():
    s = make(max_seqs=1)
    for r in (req(0, 5, max_tokens=3), req(1, 5), req(2, 5)):
        s.add_request(r)
    assert step(s, 0) == ["0"]
    s.add_request(req(3, 0, arrival=0.5))
    step(s, 1)
    assert step(s, 2) == []  # "0" still decoding (max_seqs 1)
    assert step(s, 3) == ["3"]  # ahead of the older priority-5 requests


def preemption_victims(policy: str, priorities: list[int]) -> list[str]:
    """Four one-block prompts on 5 usable blocks: the second step needs a block each."""
    s = make(policy, num_blocks=6, max_seqs=4)
    for i, p in enumerate(priorities):
        s.add_request(req(i, p, n_prompt=16, max_tokens=8))
    step(s, 0)
    assert len(s.running) == 4 and s.block_manager.num_free_blocks == 1
    out = s.schedule(1.0)
    return [r.request_id for r in out.preempted]


def worst_first(reqs_prio: list[int], k: int) -> list[str]:
    """The k requests with the largest (priority, arrival): worst priority, newest first."""
    ranked = sorted(range(len(reqs_prio)), key=lambda i: (reqs_prio[i], i), reverse=True)
    return [str(i) for i in ranked[:k]]


@pytest.mark.parametrize("priorities", [[1, 3, 0, 3], [0, 0, 0, 0], [2, 1, 0, -1], [-1, 0, 1, 2]])
def test_preemption_takes_worst_priority_newest_first(priorities):
    victims = preemption_victims("priority", priorities)
    # 1 free block, 4 requests each needing one: the best one takes it, each preemption frees one
    assert len(victims) == 2
    assert victims == worst_first(priorities, 2)


def test_fcfs_preempts_newest_regardless_of_priority():
    assert preemption_victims("fcfs", [3, 0, 0, 0]) == ["3", "2"]


def test_preempted_request_readmitted_before_lower_priority_waiting():
    s = make(num_blocks=6, max_seqs=4)
    for i, p in enumerate([0, 1, 2, 3]):
        s.add_request(req(i, p, n_prompt=16, max_tokens=30))
    step(s, 0)
    s.add_request(req(9, 9, n_prompt=16, arrival=0.5))
    out = s.schedule(1.0)
    preempted = [r.request_id for r in out.preempted]
    assert preempted == ["3", "2"]
    keys = [r.request_id for r in sorted(s.waiting, key=lambda r: (r.params.priority, r.arrival_time))]
    assert keys[:2] == ["2", "3"] and s._next_waiting().request_id == "2"


def run_sustained_load(aging: float | None, horizon: int, backlog=3, low=10):
    """One priority-``low`` request under a sustained priority-0 load: a new priority-0
    request every step, each served in one step (max_num_seqs 1), ``backlog`` queued
    ahead. Returns (the low request, {priority-0 id: admission step}, its admission step)."""
    s = make(max_seqs=1, aging=aging)
    for i in range(backlog):
        s.add_request(req(i, 0, arrival=0.0))
    low_req = req(backlog, low, arrival=0.0)
    s.add_request(low_req)
    admitted, next_id = {}, backlog + 1
    for t in range(horizon):
        s.add_request(req(next_id, 0, arrival=float(t)))
        next_id += 1
        for rid in step(s, float(t)):
            admitted[rid] = t
    return low_req, admitted


def test_without_aging_priority_10_starves_under_sustained_priority_0_load():
    low, admitted = run_sustained_load(None, horizon=200)
    assert not low.is_finished and low.status == RequestStatus.WAITING and len(admitted) == 200


@pytest.mark.parametrize("aging", [1.0, 2.0])
def test_aging_bounds_the_wait_of_priority_10(aging):
    """Aging rule: ordered as if arriving priority x aging later, so the priority-10 request
    goes ahead of every priority-0 request arriving after 10 x aging, and behind those
    arriving before; it finishes within 10 x aging + the backlog's service time."""
    horizon, backlog = 100, 3
    low, admitted = run_sustained_load(aging, horizon, backlog)
    assert low.is_finished
    t_low = admitted[low.request_id]
    horizon_arrival = 10 * aging
    for rid, t in admitted.items():
        if rid == low.request_id or int(rid) < backlog:
            continue
        arrival = int(rid) - backlog - 1  # the request added at step t arrives at t
        assert (t < t_low) == (arrival < horizon_arrival), (rid, arrival, t, t_low)
    assert t_low <= horizon_arrival + backlog + 1  # one step per request ahead of it


def test_priority_field_validated_and_defaults_to_zero():
    assert SamplingParams().priority == 0
    from jaxinfer.errors import RequestError

    for bad in (1.5, "1", True, 2**63, -(2**63) - 1):
        with pytest.raises(RequestError) as exc:
            SamplingParams(priority=bad)
        assert exc.value.param == "priority"
    for edge in (-(2**63), 2**63 - 1):  # the API's bounds: the whole signed 64-bit range
        assert SamplingParams(priority=edge).priority == edge


@pytest.mark.parametrize("kwargs", [{"scheduling_policy": "lottery"},
                                    {"scheduling_policy": "priority", "priority_aging_s": 0},
                                    {"scheduling_policy": "priority", "priority_aging_s": float("inf")}])
def test_scheduler_config_rejects_bad_policy(kwargs):
    with pytest.raises(ValueError):
        SchedulerConfig(**kwargs)


def test_aging_without_the_priority_policy_is_refused():
    """fcfs never reads priority_aging_s: a flag that would silently do nothing is an error."""
    with pytest.raises(ValueError, match="scheduling_policy 'priority' only"):
        SchedulerConfig(priority_aging_s=5.0)
    assert SchedulerConfig(scheduling_policy="priority", priority_aging_s=5.0).priority_aging_s == 5.0


def stop_case(token, stop_string=None, max_tokens=5, outputs=1, max_model_len=256, ignore_eos=False):
    r = Request("s", [1, 2], SamplingParams(max_tokens=max_tokens, stop_token_ids=(9,), ignore_eos=ignore_eos),
                seed=0, max_tokens=max_tokens, eos_token_ids=frozenset({0}))
    r.output_token_ids = [3] * (outputs - 1) + [token]
    return check_stop(r, max_model_len, stop_string), r.stop_reason


def test_one_stop_check_in_vllm_order():
    F = FinishReason
    assert stop_case(3) == (None, None)
    assert stop_case(0, "x", outputs=5) == (F.STOP, None)  # EOS first
    assert stop_case(0, ignore_eos=True) == (None, None)
    assert stop_case(9, "x", outputs=5) == (F.STOP, 9)  # then stop token ids
    assert stop_case(3, "x", outputs=5) == (F.LENGTH, None)  # max_tokens before a stop string
    assert stop_case(3, "x", max_model_len=3) == (F.LENGTH, None)  # max_model_len likewise
    assert stop_case(3, "x") == (F.STOP, "x")  # a stop string alone
