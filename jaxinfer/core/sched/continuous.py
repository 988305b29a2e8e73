"""Continuous-batching scheduler without phases (vLLM v1 style), first come first served.

Each step, every scheduled request gets ``min(num_tokens - num_computed_tokens, budget)``
new tokens: chunked prefill, decode and recompute after preemption are one rule.

Per step (`ContinuousScheduler.schedule`):
  1. Expire: requests past their deadline finish as TIMEOUT; waiting requests past
     their queue-wait limit finish as REJECTED. Their blocks are freed now.
  2. Running requests are topped up, decodes first, then continuing prefill chunks, so
     a long chunk never pushes a decode out of the step; in a step that decodes, prefill
     tokens (continuing chunks and admissions) are capped by
     ``prefill_budget_while_decoding`` (stall-free batching, Sarathi-Serve). When a
     request cannot get a block, a running request not yet scheduled in this step is
     preempted (`_victim`: the newest; blocks freed, requeued at the front of the
     waiting queue, recomputed later: Kwon et al. 2023, section 4.5).
  3. Only if nothing was preempted, waiting requests are admitted in queue order
     (`_next_waiting`: FIFO) while the token budget, ``max_num_seqs`` and the KV
     **watermark** allow: a prefill is not admitted if it would leave fewer than
     ``watermark`` of all blocks free (unless nothing is running, so a lone request
     always progresses). A preempted request is re-admitted only when its whole context
     plus one token fits above the watermark (no thrash). Admission stops at the first
     request that does not fit: a long prompt is never overtaken (no starvation, SC-19).
     With prefix caching, the leading full blocks already in the cache are taken as
     computed (``num_computed_tokens`` starts past the hit, always leaving at least one
     token to compute so there are logits to sample).
`update` (the base `jaxinfer.core.sched.scheduler.Scheduler`) then applies the sampled tokens and
frees finished requests' blocks in the same step. `jaxinfer.core.sched.priority` changes
only the three orders (top-up, victim, admission). Plain Python; no JAX import.
"""
from __future__ import annotations

import math
import time

from jaxinfer.core.kv_cache.block_manager import BlockManager, chain_hashes
from jaxinfer.config import CacheConfig, SchedulerConfig
from jaxinfer.core import pooling
from jaxinfer.core.request import Request, RequestStatus
from jaxinfer.core.sched.scheduler import Scheduler, SchedulerOutput


class ContinuousScheduler(Scheduler):
    """Continuous batching, first come first served (see the module docstring).

    Args: as `jaxinfer.core.sched.scheduler.Scheduler`; ``cache_config.watermark`` sets the share
    of blocks new prefills must leave free.
    """

    def __init__(self, config: SchedulerConfig, cache_config: CacheConfig, block_manager: BlockManager,
                 cache_salt: bytes = b""):
        super().__init__(config, cache_config, block_manager, cache_salt)
        self.watermark_blocks = math.ceil(cache_config.watermark * block_manager.num_usable_blocks)

    # ----- the orders a policy may change ----------------------------------------------
    def _top_up_order(self, reqs: list[Request]) -> list[Request]:
        """Order in which running requests get their tokens: admission order (oldest first)."""
        return reqs

    def _victim(self, candidates: list[Request]) -> Request:
        """The running request to preempt among ``candidates`` (in running order): the newest."""
        return candidates[-1]

    def _next_waiting(self) -> Request:
        """The waiting request to admit next: the head of the queue (FIFO; preempted
        requests are put back at the front)."""
        return self.waiting[0]

    # ----- one step ---------------------------------------------------------------------
    def schedule(self, now: float | None = None) -> SchedulerOutput:
        """Choose this step's requests and token counts; allocate their blocks."""
        now = time.monotonic() if now is None else now
        finished = self.expire(now)
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted: list[Request] = []
        running = self._top_up_order(self.running)
        decoding = [r for r in running if r.num_tokens - r.num_computed_tokens == 1]
        prefilling = [r for r in running if r.num_tokens - r.num_computed_tokens > 1]
        budget = self._top_up(decoding, budget, scheduled, preempted)
        prefill_budget = budget
        if scheduled and self.config.prefill_budget_while_decoding is not None:
            prefill_budget = min(budget, self.config.prefill_budget_while_decoding)
        left = self._top_up(prefilling, prefill_budget, scheduled, preempted)
        if not preempted:
            left = self._admit(now, left, scheduled)
        budget -= prefill_budget - left
        total = self.config.max_num_batched_tokens - budget
        return SchedulerOutput(scheduled, total, preempted, finished)

    def _top_up(self, reqs: list[Request], budget: int, scheduled: list, preempted: list[Request]) -> int:
        """Schedule the next tokens of running ``reqs`` in order; returns the budget left."""
        for req in reqs:
            if req.status != RequestStatus.RUNNING or budget == 0:
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self._grow_or_preempt(req, n, scheduled, preempted):
                continue
            scheduled.append((req, n))
            budget -= n
        return budget

    def _grow_or_preempt(self, req: Request, n: int, scheduled: list, preempted: list[Request]) -> bool:
        """Give ``req`` blocks for ``n`` more tokens, preempting running requests not yet
        scheduled in this step (`_victim`; possibly ``req`` itself) while needed.

        Returns False if ``req`` itself had to be preempted.
        """
        need = self.block_manager.blocks_needed(req.num_computed_tokens + n) - len(req.block_ids)
        while not self.block_manager.can_allocate(need):
            taken = {id(r) for r, _ in scheduled}
            victim = self._victim([r for r in self.running if id(r) not in taken])  # req is never taken
            self._preempt(victim)
            preempted.append(victim)
            if victim is req:
                return False
        if need > 0:
            req.block_ids.extend(self.block_manager.allocate(need))
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.block_manager.free(req.block_ids)
        req.block_ids = []
        req.num_computed_tokens = 0
        req.num_registered_blocks = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _admit(self, now: float, budget: int, scheduled: list[tuple[Request, int]]) -> int:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self._next_waiting()
            hits = self._prefix_hits(req)
            num_cached = len(hits) * bm.block_size
            n = min(req.num_tokens - num_cached, budget)
            need = bm.blocks_needed(num_cached + n) - len(hits)
            taken_from_pool = bm.num_evictable_in(hits)  # hits sitting in the free (evictable) pool
            # A preempted request comes back only when its whole context (+1) fits.
            total = bm.blocks_needed(req.num_tokens + 1) - len(hits) if req.num_preemptions else need
            headroom = self.watermark_blocks if self.running else 0
            if bm.num_free_blocks - total - taken_from_pool < headroom:
                break
            self.waiting.remove(req)
            self.num_admitted += 1
            bm.touch(hits)
            req.block_ids = hits + bm.allocate(need)
            req.num_computed_tokens = num_cached
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
                req.num_cached_tokens = num_cached
                self.prefix_queries += req.num_prompt_tokens
                self.prefix_hits += num_cached
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            scheduled.append((req, n))
            budget -= n
        return budget

    def _prefix_hits(self, req: Request) -> list[int]:
        """Cached blocks for the request's leading full blocks, leaving >= 1 token to compute."""
        bm = self.block_manager
        # cached positions would get no logprobs, nor a hidden state to pool
        if not bm.enable_prefix_caching or req.needs_prompt_logprobs or pooling.needs_every_position(req):
            return []
        req.block_hashes = chain_hashes(req.all_token_ids, bm.block_size, self.cache_salt, req.block_hashes)
        return bm.lookup(req.block_hashes[:(req.num_tokens - 1) // bm.block_size])

    def _computed(self, req: Request) -> None:
        """Put the request's newly completed full blocks into the prefix cache."""
        bm = self.block_manager
        full = req.num_computed_tokens // bm.block_size
        if not bm.enable_prefix_caching or full <= req.num_registered_blocks:
            return
        req.block_hashes = chain_hashes(req.all_token_ids, bm.block_size, self.cache_salt, req.block_hashes)
        for i in range(req.num_registered_blocks, full):
            bm.register(req.block_ids[i], req.block_hashes[i])
        req.num_registered_blocks = full
