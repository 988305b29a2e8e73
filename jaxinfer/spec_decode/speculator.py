"""`Speculator`: the engine's hook. Attaches proposals to a scheduled step, then judges them.

``attach`` runs after the scheduler chose the step: each pure decode row (one token, no
structured-output grammar) gets up to K draft tokens from the proposer, bounded by the
step's spare rows (``max_num_seqs``) and tokens (``max_num_batched_tokens``), by
``max_tokens`` and ``max_model_len``, and by the KV blocks free now: drafts never preempt
or delay anyone. Their tokens sit in ``Request.draft_token_ids`` and count in the row's
scheduled tokens; `jaxinfer.runner.batch.prepare` lays them out as verification rows.
``verify`` turns each row's target samples into the accepted run (`accepted_run`) and
counts it. Rolling back the rejected drafts' KV (`jaxinfer.core.sched.scheduler.Scheduler.update`)
frees blocks that only they used; the K/V of rejected slots in kept blocks is
overwritten by later steps and never read (attention reads below the computed length)
and never registered in the prefix cache (only computed, accepted tokens are).
Plain Python; no JAX import.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from jaxinfer.core.kv_cache.block_manager import BlockManager
from jaxinfer.config import SchedulerConfig
from jaxinfer.core.request import Request
from jaxinfer.core.sched.scheduler import SchedulerOutput
from jaxinfer.spec_decode.config import SpeculativeConfig
from jaxinfer.spec_decode.switch import SpeculationSwitch
from jaxinfer.spec_decode.verify import accepted_run


class Proposer(Protocol):
    """What a proposer offers the `Speculator` (`jaxinfer.spec_decode.ngram.NgramProposer`,
    `jaxinfer.spec_decode.draft_model.DraftModelProposer`)."""

    def propose_batch(self, reqs: Sequence[Request], ks: Sequence[int]) -> list[list[int]]:
        """Up to ``ks[i]`` tokens predicted to follow each request's tokens. The requests'
        blocks already cover ``num_computed_tokens + 1 + ks[i]`` tokens."""

    def observe(self, inputs) -> None:
        """See the target's step inputs after it ran (a draft model mirrors its KV)."""

    def compile(self, inputs_like) -> None:
        """Compile what the proposer needs for a bucket (warm-up)."""


class SpecStats:
    """Monotonic counters (vLLM's ``spec_decode`` metrics): ``num_drafts`` (verified requests
    that had drafts), ``num_draft_tokens``, ``num_accepted_tokens``."""

    def __init__(self) -> None:
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verified request: 1 + accepted / drafts (0 before any draft)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


class Speculator:
    """Proposes, bounds and verifies draft tokens for the engine.

    Args:
      config: the speculative settings.
      scheduler_config: the step limits (rows, tokens, context).
      block_manager: the KV allocator (draft slots take free blocks only).
      proposer: any object with ``propose(token_ids, k)`` (`jaxinfer.spec_decode.ngram.NgramProposer`).
    """

    def __init__(self, config: SpeculativeConfig, scheduler_config: SchedulerConfig, block_manager: BlockManager,
                 proposer: Proposer):
        self.config = config
        self.limits = scheduler_config
        self.block_manager = block_manager
        self.proposer = proposer
        self.switch = SpeculationSwitch(config)
        self.stats = SpecStats()

    def attach(self, sched: SchedulerOutput, num_running: int) -> int:
        """Give this step's decode rows their drafts (in batch order, while room lasts).

        Mutates ``sched`` (row token counts, ``num_tokens``) and the requests'
        ``draft_token_ids`` and ``block_ids``. Returns the number of draft tokens attached.
        """
        if not sched.scheduled or not self.switch.allows(num_running):
            return 0
        rows, tokens = len(sched.scheduled), sched.num_tokens
        chosen: list[tuple[int, Request, int]] = []  # (index in the step, request, most drafts)
        for i, (req, n) in enumerate(sched.scheduled):
            room = min(self.limits.max_num_seqs - rows, self.limits.max_num_batched_tokens - tokens)
            if room <= 0:
                break
            if n != 1 or req.num_tokens - req.num_computed_tokens != 1 or req.matcher is not None:
                continue
            k = self._fits(req, min(self.config.num_speculative_tokens, room, req.max_tokens - req.num_output_tokens - 1,
                                    self.limits.max_model_len - req.num_tokens))
            if k <= 0:
                continue
            self._reserve(req, k)
            chosen.append((i, req, k))
            rows += k
            tokens += k
        if not chosen:
            return 0
        proposals = self.proposer.propose_batch([req for _, req, _ in chosen], [k for _, _, k in chosen])
        total = 0
        for (i, req, k), drafts in zip(chosen, proposals):
            drafts = list(drafts)[:k]
            self._reserve(req, len(drafts))  # give back blocks a shorter proposal does not need
            if drafts:
                req.draft_token_ids = drafts
                sched.scheduled[i] = (req, 1 + len(drafts))
                sched.num_tokens += len(drafts)
                total += len(drafts)
        return total

    def _fits(self, req: Request, k: int) -> int:
        """How many of k drafts fit in the request's blocks plus the free ones."""
        bm = self.block_manager
        slots = (len(req.block_ids) + bm.num_free_blocks) * bm.block_size
        return max(0, min(k, slots - req.num_computed_tokens - 1))

    def _reserve(self, req: Request, k: int) -> None:
        """Make the request's blocks cover its next token and k drafts exactly (allocating
        free blocks, or freeing the ones past that)."""
        bm = self.block_manager
        need = bm.blocks_needed(req.num_computed_tokens + 1 + k) - len(req.block_ids)
        if need > 0:
            req.block_ids.extend(bm.allocate(need))
        elif need < 0:  # never below the next token's blocks: need counts from them
            bm.free(req.block_ids[need:])
            del req.block_ids[need:]

    def observe(self, inputs) -> None:
        """Pass the step's inputs to the proposer after the target ran them."""
        observe = getattr(self.proposer, "observe", None)
        if observe is not None:
            observe(inputs)

    def compile(self, inputs_like) -> None:
        """Warm-up: let the proposer compile for this bucket (a draft model's runner)."""
        compile_ = getattr(self.proposer, "compile", None)
        if compile_ is not None:
            compile_(inputs_like)

    def verify(self, req: Request, targets: Sequence[int]) -> list[int]:
        """The accepted run of ``req`` given its rows' target samples (`accepted_run`), counted."""
        drafts = req.draft_token_ids
        run = accepted_run(drafts, targets)
        self.stats.num_drafts += 1
        self.stats.num_draft_tokens += len(drafts)
        self.stats.num_accepted_tokens += len(run) - 1
        self.switch.record(len(drafts), len(run) - 1)
        return run


def make_speculator(config: SpeculativeConfig | None, scheduler_config: SchedulerConfig,
                    block_manager: BlockManager, proposer: Proposer | None = None) -> Speculator | None:
    """The `Speculator` for ``config`` (None when speculation is off).

    ``proposer``: a ready proposer (a draft model's); ngram builds its own.

    Raises:
      ValueError: a draft model without its proposer.
    """
    if config is None:
        return None
    if proposer is None:
        if config.method != "ngram":
            raise ValueError(f"speculative method {config.method!r} needs its proposer")
        from jaxinfer.spec_decode.ngram import NgramProposer

        proposer = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    return Speculator(config, scheduler_config, block_manager, proposer)
