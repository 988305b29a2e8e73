"""Continuous batching by request priority (``--scheduling-policy priority``).

Same steps as `jaxinfer.core.sched.continuous.ContinuousScheduler` (budgets, chunked
prefill, watermark, recompute after preemption); only three orders change, all by the
sort key of `priority_key` (smaller = served first; ``priority`` is the request's
``SamplingParams.priority``, lower first, default 0, as in vLLM):

  - admission: the waiting request with the smallest key is admitted next; admission
    stops at the first that does not fit, so a request is never overtaken by one with
    a larger key;
  - top-up: running requests get their tokens smallest key first;
  - preemption: when memory runs short, the running request with the largest key (the
    worst priority, the newest first among equals) not yet scheduled in this step is
    preempted.

**Aging** (``priority_aging_s`` = a, seconds; None or 0: off) bounds starvation: a
request's effective priority decreases by 1 for every a seconds it has waited since
arrival, ``priority - (now - arrival) / a``. Comparing two requests at the same moment,
that is the same as ordering by ``arrival + priority * a``: a request of priority p is
ordered as if it had arrived p x a seconds later. So a request is never overtaken by one
of priority q that arrives more than (p - q) x a seconds after it; under any sustained
load of priority-q traffic it waits at most (p - q) x a plus the time to serve what
arrived before it (and before that horizon). Without aging the key is
(priority, arrival): strict priority, FCFS within a priority.
Plain Python; no JAX import.
"""
from __future__ import annotations

from jaxinfer.core.sched.continuous import ContinuousScheduler
from jaxinfer.core.request import Request


def priority_key(req: Request, aging_s: float | None) -> tuple[float, float]:
    """Sort key of a request (smaller = first): ``(arrival + priority * aging_s, arrival)``
    with aging, else ``(priority, arrival)``; times in ``time.monotonic()`` seconds."""
    if aging_s:
        return req.arrival_time + req.params.priority * aging_s, req.arrival_time
    return req.params.priority, req.arrival_time


class PriorityScheduler(ContinuousScheduler):
    """Continuous batching ordered by `priority_key` (see the module docstring)."""

    def _key(self, req: Request) -> tuple[float, float]:
        return priority_key(req, self.config.priority_aging_s)

    def _top_up_order(self, reqs: list[Request]) -> list[Request]:
        """Smallest key first, so the worst ones are still unscheduled when a victim is needed."""
        return sorted(reqs, key=self._key)

    def _victim(self, candidates: list[Request]) -> Request:
        """The largest key: worst priority, newest first."""
        return max(candidates, key=self._key)

    def _next_waiting(self) -> Request:
        """The smallest key (a preempted request keeps its priority and arrival)."""
        return min(self.waiting, key=self._key)

    def waiting_in_order(self) -> list[Request]:
        """Smallest key first: the order `_next_waiting` admits them in."""
        return sorted(self.waiting, key=self._key)
