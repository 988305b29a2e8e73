"""`EngineSnapshot`: one reading of an engine's gauges and counters, for ``GET /metrics``.

`LLMEngine.snapshot` and `DataParallelRouter.snapshot` both return one, so the metrics
endpoint reads a single interface whatever stands behind it (a router merges its
replicas' snapshots with `EngineSnapshot.merge`; no attribute is guessed with a default).
Every field is a plain number written by the engine thread, so reading them from the
HTTP thread needs no lock (a scrape may see a step half applied, never a torn number).
Plain Python; no JAX import.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Iterable, Mapping


@dataclasses.dataclass(frozen=True)
class EngineSnapshot:
    """Gauges (current values) and counters (totals since start) of one engine.

    Attributes:
      num_running: requests holding KV blocks (running; static batching: live batch members).
      num_waiting: requests queued for admission.
      kv_blocks_total: usable KV blocks (the null block excluded).
      kv_blocks_free: free KV blocks (evictable prefix-cache blocks included).
      kv_slots_reserved: token slots of the KV blocks held by requests at the end of the
        last step (blocks x block_size, summed over requests).
      kv_slots_filled: of those, slots holding a computed token's K/V.
      preemptions, prefix_cache_queries, prefix_cache_hits, prefix_cache_evictions, prompt_tokens,
      prefill_tokens, generation_tokens, compilations, timeouts, aborted: counters (see
      `jaxinfer.entrypoints.openai.metrics`).
      finished: finish reason (``jaxinfer.core.request.FinishReason`` value) -> requests ended so.
      fragmentation_step_sum, fragmentation_steps: the per-step fragmentation samples
        (sum of ratios, number of steps) for a mean over an interval.
      retry_after_s: seconds the waiting queue needs to drain at the measured admission
        rate (`jaxinfer.engine.drain_rate.DrainRate`), the ``Retry-After`` of a 429.
      spec_num_drafts, spec_num_draft_tokens, spec_num_accepted_tokens: speculative decoding
        counters (`jaxinfer.spec_decode.speculator.SpecStats`; 0 when it is off).
    """

    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_total: int = 0
    kv_blocks_free: int = 0
    kv_slots_reserved: int = 0
    kv_slots_filled: int = 0
    preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_evictions: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    generation_tokens: int = 0
    compilations: int = 0
    timeouts: int = 0
    aborted: int = 0
    finished: Mapping[str, int] = dataclasses.field(default_factory=dict)
    fragmentation_step_sum: float = 0.0
    fragmentation_steps: int = 0
    retry_after_s: float = 1.0
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0

    @property
    def kv_cache_usage_ratio(self) -> float:
        """Share of usable KV blocks in use, in [0, 1] (0 with no blocks)."""
        total = self.kv_blocks_total
        return (total - self.kv_blocks_free) / total if total else 0.0

    @property
    def kv_fragmentation_ratio(self) -> float:
        """Current KV fragmentation: ``1 - filled / reserved`` over the slots requests hold,
        in [0, 1]; 0 when no request holds blocks (an idle engine)."""
        r = self.kv_slots_reserved
        return 1.0 - self.kv_slots_filled / r if r else 0.0

    @property
    def spec_mean_acceptance_length(self) -> float:
        """Tokens emitted per speculative verification: 1 + accepted / drafts (0 before any)."""
        n = self.spec_num_drafts
        return 1.0 + self.spec_num_accepted_tokens / n if n else 0.0

    @classmethod
    def merge(cls, snapshots: Iterable["EngineSnapshot"]) -> "EngineSnapshot":
        """The snapshot of several replicas: every field summed (``finished`` per reason),
        so the ratios are pooled over all replicas' blocks; ``retry_after_s`` is the
        smallest (the router sends a retry to the replica that drains first)."""
        totals: dict = {}
        finished: collections.Counter = collections.Counter()
        retry = []
        for snap in snapshots:
            for f in dataclasses.fields(cls):
                if f.name not in ("finished", "retry_after_s"):
                    totals[f.name] = totals.get(f.name, 0) + getattr(snap, f.name)
            finished.update(snap.finished)
            retry.append(snap.retry_after_s)
        return cls(**totals, finished=dict(finished), retry_after_s=min(retry, default=1.0))
