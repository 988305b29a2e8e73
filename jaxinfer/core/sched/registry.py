"""The scheduling policies by name (``--scheduling-policy``): `SCHEDULING_POLICIES`.

Owns the one list of policy names: the flag's choices (`jaxinfer.config.args`), the config's
check (`jaxinfer.config.SchedulerConfig`) and `jaxinfer.core.sched.scheduler.make_scheduler`
read it. Each entry names its class as ``"module:Class"``, imported on first use, so this module
imports nothing (the config imports it). Adding a policy is its own module under
``jaxinfer/core/sched/`` (a `jaxinfer.core.sched.scheduler.Scheduler` subclass) plus one line here.
"""
from __future__ import annotations

import importlib

SCHEDULING_POLICIES = {
    "fcfs": "jaxinfer.core.sched.continuous:ContinuousScheduler",  # continuous batching, first come first served
    "priority": "jaxinfer.core.sched.priority:PriorityScheduler",  # by the request's priority, then arrival
}
STATIC = "jaxinfer.core.sched.static:StaticScheduler"  # ``scheduler="static"``: the benchmark baseline


def policy_class(name: str) -> type:
    """The scheduler class of policy ``name`` (a key of `SCHEDULING_POLICIES`, or ``"static"``).

    Raises:
      ValueError: an unknown name (the message lists the known ones).
    """
    target = STATIC if name == "static" else SCHEDULING_POLICIES.get(name)
    if target is None:
        raise ValueError(f"unknown scheduling policy {name!r}; known: {', '.join(SCHEDULING_POLICIES)}")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)
