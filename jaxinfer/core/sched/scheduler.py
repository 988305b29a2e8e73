"""The scheduler interface: `Scheduler`, the base every scheduling policy extends.

The base owns what all policies share: the waiting queue and the running list,
``add_request``, ``finish``, expiry of deadlines and queue-wait limits, ``update``
(applying one step's sampled tokens and the stop rules of `jaxinfer.core.stop`) and the
counters the metrics read. A policy is a small subclass that decides, in
``schedule``, which requests compute how many tokens this step:

  ``jaxinfer.core.sched.continuous.ContinuousScheduler``  continuous batching, FCFS
  ``jaxinfer.core.sched.priority.PriorityScheduler``      continuous batching by priority
  ``jaxinfer.core.sched.static.StaticScheduler``          static batching (the baseline)

`make_scheduler` picks one from the `SchedulerConfig`. Plain Python; no JAX import.
"""
from __future__ import annotations

import abc
import collections
import dataclasses
import time
from typing import Callable, Sequence

import numpy as np

from jaxinfer.core.kv_cache.block_manager import BlockManager
from jaxinfer.config import CacheConfig, SchedulerConfig
from jaxinfer.core.request import FinishReason, Request, RequestStatus
from jaxinfer.core.stop import check_stop

TextStop = Callable[[Request], "str | None"]  # the stop string the request's new text matched, if any


@dataclasses.dataclass
class SchedulerOutput:
    """What one step computes.

    Attributes:
      scheduled: (request, num_new_tokens) in batch order.
      num_tokens: total new tokens this step.
      preempted: requests preempted while scheduling this step.
      finished: requests that ended while scheduling (timeouts, queue rejections, and
        static batching's members without room).
    """

    scheduled: list[tuple[Request, int]]
    num_tokens: int
    preempted: list[Request]
    finished: list[Request]

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler(abc.ABC):
    """Queues, request ends and token bookkeeping shared by every scheduling policy.

    Args:
      config: limits (max_num_seqs, token budget, max_model_len, queue length, policy).
      cache_config: watermark and block size.
      block_manager: the KV block allocator.
      cache_salt: mixed into prefix-cache block hashes (the model, so two models never
        share blocks).

    Attributes:
      waiting: requests not admitted (policies may reorder it); running: admitted ones.
      num_preemptions, num_admitted (admissions from the waiting queue, re-admissions
      included), prefix_queries, prefix_hits (prompt tokens looked up in / found in the
      prefix cache): monotonic counters.
    """

    def __init__(self, config: SchedulerConfig, cache_config: CacheConfig, block_manager: BlockManager,
                 cache_salt: bytes = b""):
        self.config = config
        self.cache_config = cache_config
        self.block_manager = block_manager
        self.cache_salt = cache_salt
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_admitted = 0
        self.prefix_queries = 0
        self.prefix_hits = 0

    # ----- the policy ---------------------------------------------------------------------
    @abc.abstractmethod
    def schedule(self, now: float | None = None) -> SchedulerOutput:
        """Choose this step's requests and token counts and allocate their blocks; expire
        requests first (`expire`). ``now``: ``time.monotonic()`` seconds (None: now)."""

    @property
    def batch_deadline(self) -> float | None:
        """Monotonic time (s) at which waiting requests become schedulable with no new
        event, when the policy holds them back on purpose (static batching's timeout);
        None otherwise."""
        return None

    # ----- queue management -------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a new request (validated by the engine) at the back of the waiting queue."""
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def finish(self, request: Request, reason: FinishReason) -> None:
        """End a request now: release its blocks (`_release_blocks`), drop it from the
        queues, mark it finished. Finishing a finished request does nothing."""
        if request.is_finished:
            return
        self._release_blocks(request)
        if request in self.running:
            self.running.remove(request)
        else:
            try:
                self.waiting.remove(request)
            except ValueError:
                pass
        request.mark_finished(reason)

    def _release_blocks(self, request: Request) -> None:
        """Free a finishing request's KV blocks now (static batching keeps them)."""
        if request.block_ids:
            self.block_manager.free(request.block_ids)
            request.block_ids = []

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def kv_holders(self) -> list[Request]:
        """Requests holding KV blocks (for the fragmentation statistic)."""
        return self.running

    @property
    def free_slots(self) -> int:
        """Sequence slots the next step can start waiting requests in (``max_num_seqs``
        minus running requests)."""
        return max(0, self.config.max_num_seqs - len(self.running))

    @property
    def num_queued(self) -> int:
        """Waiting requests beyond the `free_slots`: those that will still wait after the
        next step; what ``max_queue_len`` bounds. A burst that arrives between two steps
        thus fills the free slots before anything counts as queued (counting every waiting
        request turned a burst of 64 away at 8 queued while 32 slots stood empty)."""
        return max(0, len(self.waiting) - self.free_slots)

    def waiting_in_order(self) -> list[Request]:
        """Waiting requests in the order they will be admitted (FIFO here)."""
        return list(self.waiting)

    def expire(self, now: float) -> list[Request]:
        """Finish requests past their deadline (TIMEOUT) and queued ones past their
        queue-wait limit (REJECTED); returns them.

        Only requests beyond the `free_slots` count as queued: the first ``free_slots``
        waiting ones have their slots and wait only for their turn at the per-step token
        budget (a burst of 128 prompts of 512 tokens prefills one prompt per step), which
        is no reason to turn them away (issue 50: on a busy 2-core CPU the last prompts of
        such a burst were rejected while the slots stood ready for them)."""
        holding = {id(r) for r in self.waiting_in_order()[:self.free_slots]}
        out = []
        for req in list(self.running) + list(self.waiting):
            reason = req.expiry_reason(now)
            if reason == FinishReason.REJECTED and id(req) in holding:
                continue
            if reason is not None:
                self.finish(req, reason)
                out.append(req)
        return out

    # ----- after the step ---------------------------------------------------------------
    def update(self, out: SchedulerOutput, sampled: Sequence[int | Sequence[int]],
               text_stop: TextStop | None = None) -> list[Request]:
        """Apply one step's sampled tokens (per scheduled row, in order: one token, or the
        accepted run of a speculating row, `jaxinfer.spec_decode.verify.accepted_run`).

        A row's sample counts only if the step computed the request's last known token
        (a partial prefill chunk's sample is discarded). A pooling request (``req.pooling``)
        samples nothing: it finishes (``stop``, blocks freed now) in the step that computes its
        last prompt token (`jaxinfer.core.pooling`). After each new token,
        ``text_stop(req)`` (when given) advances the request's text and returns the stop
        string it matched; `jaxinfer.core.stop.check_stop` then decides, and a request that
        must stop finishes (`finish`) now, dropping the rest of its run. A speculating
        row's accepted drafts count as computed one by one as their tokens are appended;
        its rejected drafts' KV is rolled back (`_roll_back`).

        Returns:
          The requests that received new tokens this step (finished ones included).
        """
        now = time.monotonic()
        got_token = []
        for (req, n), toks in zip(out.scheduled, sampled):
            num_drafts = len(req.draft_token_ids)
            req.draft_token_ids = []
            if req.is_finished:  # aborted between schedule and update
                continue
            req.num_computed_tokens += n - num_drafts
            self._computed(req)
            if req.num_computed_tokens < req.num_tokens:
                continue
            got_token.append(req)
            if req.pooling is not None:  # prefill only: it ends with its prompt, no token sampled
                self.finish(req, FinishReason.STOP)
                continue
            for j, tok in enumerate([toks] if isinstance(toks, (int, np.integer)) else toks):
                if j > 0:  # the accepted draft before this token was computed in this step
                    req.num_computed_tokens += 1
                    self._computed(req)
                req.append_output(tok, now)
                stop_string = text_stop(req) if text_stop is not None else None
                reason = check_stop(req, self.config.max_model_len, stop_string)
                if reason is not None:
                    self.finish(req, reason)
                    break
            if num_drafts and not req.is_finished:
                self._roll_back(req)
        return got_token

    def _roll_back(self, req: Request) -> None:
        """Free the blocks past the request's computed tokens (those only rejected drafts used)."""
        keep = self.block_manager.blocks_needed(req.num_computed_tokens)
        if len(req.block_ids) > keep:
            self.block_manager.free(req.block_ids[keep:])
            del req.block_ids[keep:]

    def _computed(self, req: Request) -> None:
        """Hook after ``req``'s computed tokens advanced (prefix caching registers blocks)."""


def make_scheduler(config: SchedulerConfig, cache_config: CacheConfig, block_manager: BlockManager,
                   cache_salt: bytes = b"") -> Scheduler:
    """The policy ``config`` names (`jaxinfer.core.sched.registry`): ``scheduler="static"`` ->
    `StaticScheduler`; else its ``scheduling_policy`` (``"fcfs"`` -> `ContinuousScheduler`,
    ``"priority"`` -> `PriorityScheduler`)."""
    from jaxinfer.core.sched.registry import policy_class

    cls = policy_class("static" if config.scheduler == "static" else config.scheduling_policy)
    return cls(config, cache_config, block_manager, cache_salt)
