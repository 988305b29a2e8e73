"""The scheduling-policy registry: names from one table, a new policy is one module plus one line."""
import pytest

from jaxinfer.config import CacheConfig, SchedulerConfig
from jaxinfer.config.args import flag
from jaxinfer.core.kv_cache.block_manager import BlockManager
from jaxinfer.core.sched import registry
from jaxinfer.core.sched.continuous import ContinuousScheduler
from jaxinfer.core.sched.priority import PriorityScheduler
from jaxinfer.core.sched.scheduler import make_scheduler
from jaxinfer.core.sched.static import StaticScheduler


def _make(**kw):
    cache = CacheConfig(num_blocks=64)
    return make_scheduler(SchedulerConfig(max_model_len=256, **kw), cache, BlockManager(64, 16))


def test_names_come_from_the_registry():
    assert tuple(flag("scheduling_policy").choices) == tuple(registry.SCHEDULING_POLICIES) == ("fcfs", "priority")
    assert type(_make()) is ContinuousScheduler
    assert type(_make(scheduling_policy="priority")) is PriorityScheduler
    assert type(_make(scheduler="static")) is StaticScheduler
    with pytest.raises(ValueError, match="known: fcfs, priority"):
        registry.policy_class("lottery")


class LastComeFirstServed(ContinuousScheduler):
    """A policy defined outside the package, for the test below."""


def test_a_registered_policy_is_accepted_and_built(monkeypatch):
    monkeypatch.setitem(registry.SCHEDULING_POLICIES, "lcfs", f"{__name__}:LastComeFirstServed")
    assert type(_make(scheduling_policy="lcfs")) is LastComeFirstServed
    with pytest.raises(ValueError, match="scheduling_policy must be one of"):
        SchedulerConfig(max_model_len=256, scheduling_policy="lottery")
