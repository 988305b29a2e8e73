"""Results handed back to callers, in vLLM's shape (`RequestOutput`, `CompletionOutput`).

Plain Python; no JAX import.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Logprob:
    """Log-probability of one token (natural log), its 1-based rank, and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclasses.dataclass
class CompletionOutput:
    """One completion of a request.

    Attributes:
      index: choice index (for ``n > 1``).
      text: generated text so far (safe to stream: no broken UTF-8, no partial stop string).
      token_ids: generated token ids so far (EOS included when it ended the output).
      finish_reason: "stop", "length", "abort", "timeout", "rejected", "error", "failed"
        (`jaxinfer.core.request.FinishReason`), or None while running.
      stop_reason: the stop token id or stop string that ended it, if any.
      logprobs: per generated token, ``{token_id: Logprob}`` (sampled token plus top-N).
      cumulative_logprob: sum of the sampled tokens' logprobs (natural log) so far, i.e.
        the log-probability of ``token_ids`` under the logprobs' distribution (after bias
        and penalties, before temperature and filtering; `jaxinfer.layers.sampler.sample`). None
        unless the request asked for logprobs (``SamplingParams.logprobs`` not None, 0
        included), as in vLLM V1: the step computes logprobs only for such requests.
      logits: per generated token, the raw float32 logits [V] (only with
        ``EngineConfig.return_logits``; for tests and debugging).
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    logits: list | None = None
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclasses.dataclass
class RequestMetrics:
    """Timestamps in ``time.monotonic()`` seconds."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None
    num_preemptions: int = 0


@dataclasses.dataclass
class RequestOutput:
    """The state of one request after a step (cumulative, not a delta).

    ``prompt_logprobs`` (only with ``SamplingParams.prompt_logprobs``, as vLLM): one item per
    prompt position computed so far, None for position 0, then ``{token_id: Logprob}`` for
    the actual prompt token (with its rank) and the top alternatives; complete (one per
    prompt token) by the first output token. ``num_cached_tokens``: prompt tokens served
    from the prefix cache."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
