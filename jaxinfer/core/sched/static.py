"""Static-batching baseline scheduler (``SchedulerConfig.scheduler = "static"``), host side.

The naive way to serve, kept as a baseline for benchmarks (issue 5). A subclass of
`jaxinfer.core.sched.scheduler.Scheduler` (queues, expiry, ``finish`` and ``update`` come from the
base), same KV block pool, same model and attention code; only the policy differs:

  1. Dynamic batcher: while no batch is in flight, requests queue until ``max_num_seqs``
     of them wait or the oldest has waited ``batch_timeout_s`` (Triton-style
     ``max_queue_delay``). Then up to ``max_num_seqs`` are taken FIFO as one batch.
  2. Each member reserves blocks for the full ``max_model_len`` up front. A member the
     pool cannot hold fails at once with ``FinishReason.ERROR`` (no queueing behind the
     batch, no watermark, no preemption).
  3. The batch first prefills every member (chunked by the per-step token budget), then
     decodes all live members in lockstep until its longest member finishes. A finished
     member keeps its reservation until the whole batch ends: that idle memory is the KV
     fragmentation continuous batching avoids. Only then does the next batch form.
Plain Python; no JAX import.
"""
from __future__ import annotations

import time

from jaxinfer.core.kv_cache.block_manager import BlockManager
from jaxinfer.config import CacheConfig, SchedulerConfig
from jaxinfer.core.request import FinishReason, Request, RequestStatus
from jaxinfer.core.sched.scheduler import Scheduler, SchedulerOutput


class StaticScheduler(Scheduler):
    """One fixed batch at a time, full-length KV reservations (see the module docstring).

    Args:
      config: ``max_num_seqs`` (batch size), ``max_num_batched_tokens`` (per-step token
        budget), ``max_model_len`` (reservation per member), ``batch_timeout_s``.
      cache_config: unused (no watermark).
      block_manager: the KV block allocator (the same pool continuous batching uses).
      cache_salt: unused (static batching shares no blocks).
    """

    def __init__(self, config: SchedulerConfig, cache_config: CacheConfig, block_manager: BlockManager,
                 cache_salt: bytes = b""):
        super().__init__(config, cache_config, block_manager, cache_salt)
        self.reserve_blocks = block_manager.blocks_needed(config.max_model_len)
        self.batch: list[Request] = []  # every member of the batch in flight, finished ones included
        self.num_batches = 0
        self.num_failed = 0  # requests that got no reservation (FinishReason.ERROR)
        # num_preemptions, prefix_queries, prefix_hits stay 0: no preemption, no shared blocks

    # ----- queue management -------------------------------------------------------------
    def finish(self, request: Request, reason: FinishReason) -> None:
        """End a request now. A batch member's blocks stay reserved until the batch ends."""
        super().finish(request, reason)
        if self.batch and not self.running:
            self._release_batch()

    def _release_blocks(self, request: Request) -> None:
        """Nothing: the batch's reservations are freed together (`_release_batch`)."""

    @property
    def kv_holders(self) -> list[Request]:
        """Requests holding KV blocks: every member of the batch in flight."""
        return self.batch

    @property
    def free_slots(self) -> int:
        """Slots the next batch can take: none while a batch is in flight, else a batch."""
        return 0 if self.batch else self.config.max_num_seqs

    @property
    def batch_deadline(self) -> float | None:
        """Monotonic time (s) at which the queued requests form a batch by timeout, or None
        (a batch is in flight or nothing waits). The engine thread sleeps until then."""
        if self.batch or not self.waiting:
            return None
        return self.waiting[0].arrival_time + self.config.batch_timeout_s

    # ----- one step ---------------------------------------------------------------------
    def schedule(self, now: float | None = None) -> SchedulerOutput:
        """Form a batch if none is in flight and one is due; give its members tokens."""
        now = time.monotonic() if now is None else now
        finished = self.expire(now)
        if not self.batch and self._batch_due(now):
            finished.extend(self._form_batch(now))
        scheduled = self._fill(self.config.max_num_batched_tokens)
        return SchedulerOutput(scheduled, sum(n for _, n in scheduled), [], finished)

    def _batch_due(self, now: float) -> bool:
        if len(self.waiting) >= self.config.max_num_seqs:
            return True
        return bool(self.waiting) and now >= self.waiting[0].arrival_time + self.config.batch_timeout_s

    def _form_batch(self, now: float) -> list[Request]:
        """Take up to ``max_num_seqs`` waiting requests; reserve ``max_model_len`` for each.

        Returns:
          The members that failed (the pool could not hold their reservation).
        """
        failed = []
        for _ in range(min(len(self.waiting), self.config.max_num_seqs)):
            req = self.waiting.popleft()
            self.num_admitted += 1
            if not self.block_manager.can_allocate(self.reserve_blocks):
                self.finish(req, FinishReason.ERROR)
                self.num_failed += 1
                failed.append(req)
                continue
            req.block_ids = self.block_manager.allocate(self.reserve_blocks)
            req.status = RequestStatus.RUNNING
            req.first_scheduled_time = now
            self.running.append(req)
            self.batch.append(req)
        self.num_batches += bool(self.batch)
        return failed

    def _fill(self, budget: int) -> list[tuple[Request, int]]:
        """Prefill chunks for every member first; decode steps only once all prompts are in."""
        prefilling = [r for r in self.running if r.num_computed_tokens < r.num_prompt_tokens]
        scheduled = []
        for req in prefilling or self.running:
            if budget == 0:
                break
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            scheduled.append((req, n))
            budget -= n
        return scheduled

    def _release_batch(self) -> None:
        for req in self.batch:
            self.block_manager.free(req.block_ids)
            req.block_ids = []
        self.batch = []
