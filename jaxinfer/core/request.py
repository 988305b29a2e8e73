"""`Request`: the host-side state of one sequence as it moves through the engine.

Phase-free bookkeeping (vLLM v1): a request has ``num_tokens`` (prompt + generated) and
``num_computed_tokens`` (tokens whose K/V sit in the cache). Prefill, chunked prefill,
decode and recompute after preemption are all "compute the tokens not yet computed".
Plain Python; no JAX import.
"""
from __future__ import annotations

import dataclasses
import enum
import time

from jaxinfer.pooling_params import PoolingParams
from jaxinfer.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue, will recompute
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    """Why a request ended. ``stop``/``length`` are OpenAI's; the rest are jaxinfer's."""

    STOP = "stop"          # EOS, stop token id or stop string
    LENGTH = "length"      # max_tokens or max_model_len
    ABORT = "abort"        # client went away / caller aborted
    TIMEOUT = "timeout"    # per-request deadline passed (HTTP 504)
    REJECTED = "rejected"  # waited past the maximum queue wait (HTTP 429)
    ERROR = "error"        # static batching: the KV pool could not hold its reservation (HTTP 503)
    FAILED = "failed"      # preparing its step raised before the device was touched (HTTP 500)


@dataclasses.dataclass
class Request:
    """One sequence in the engine.

    Attributes:
      request_id: caller's id, unique among live requests.
      prompt_token_ids: the prompt, as given (no BOS added here).
      params: its sampling options.
      output_token_ids: tokens generated so far (kept across preemption).
      num_computed_tokens: tokens with K/V in the cache.
      block_ids: KV blocks owned, in order (block table row).
      seed: the per-request sampling seed (drawn by the engine when not given).
      arrival_time, deadline: ``time.monotonic()`` seconds; deadline None = none.
      max_queue_wait_deadline: monotonic time after which a still-waiting request is
        rejected (None = wait forever).
      matcher: the grammar state of a structured-output request (`jaxinfer.structured_outputs.grammar`), or None.
      prompt_logprobs: with ``params.prompt_logprobs``, one item per prompt position
        recorded so far: None for position 0, then ``{token_id: Logprob}``.
      draft_token_ids: speculative draft tokens verified in the current step (set by
        `jaxinfer.spec_decode.speculator.Speculator.attach`, cleared by the update); [] otherwise.
      pooling: the resolved options of a pooling request (``max_tokens`` 0: it ends with its
        prefill and returns a pooled vector, `jaxinfer.core.pooling`), or None for generation.
      pooled: a pooling request's running pooled state [D] float64 (`jaxinfer.core.pooling.record`),
        None before its first pooled chunk; its final vector once finished.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int
    max_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    arrival_time: float = dataclasses.field(default_factory=time.monotonic)
    deadline: float | None = None
    max_queue_wait_deadline: float | None = None
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = dataclasses.field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_preemptions: int = 0
    prompt: str | None = None
    block_hashes: list = dataclasses.field(default_factory=list)  # chained hashes of full token blocks
    num_registered_blocks: int = 0  # leading blocks registered in the prefix cache
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    logprobs: list = dataclasses.field(default_factory=list)  # per output token {id: Logprob}
    prompt_logprobs: list = dataclasses.field(default_factory=list)  # per prompt position: None, then {id: Logprob}
    cumulative_logprob: float = 0.0  # sum of the sampled tokens' logprobs (when logprobs are requested)
    logits: list = dataclasses.field(default_factory=list)  # per output token raw logits (debug)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    matcher: object | None = None  # llguidance matcher of a structured-output request (advanced per token)
    draft_token_ids: list[int] = dataclasses.field(default_factory=list)
    pooling: PoolingParams | None = None
    pooled: object | None = None  # numpy array (this module stays import-light)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what the cache must eventually hold."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Prompt logprobs were asked for and some prompt position is not recorded yet
        (`jaxinfer.core.prompt_logprobs`); such a request skips prefix-cache lookups."""
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids)

    def token_at(self, position: int) -> int:
        """The token at absolute ``position`` (prompt then outputs)."""
        p = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < p else self.output_token_ids[position - p]

    def expiry_reason(self, now: float) -> FinishReason | None:
        """TIMEOUT past the deadline; REJECTED if still waiting past the queue-wait limit."""
        if self.deadline is not None and now >= self.deadline:
            return FinishReason.TIMEOUT
        if (self.status == RequestStatus.WAITING and self.max_queue_wait_deadline is not None
                and now >= self.max_queue_wait_deadline):
            return FinishReason.REJECTED
        return None

    def mark_finished(self, reason: FinishReason) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason = reason
        self.finished_time = time.monotonic()

    def append_output(self, token_id: int, now: float) -> None:
        """Record a sampled token (and the time of the first one); the stop rules are
        `jaxinfer.core.stop.check_stop`."""
        self.output_token_ids.append(int(token_id))
        if self.first_token_time is None:
            self.first_token_time = now
