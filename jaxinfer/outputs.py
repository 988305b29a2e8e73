"""Results handed back to callers, in vLLM's shape (`RequestOutput`, `CompletionOutput`; for
pooling requests `PoolingRequestOutput` / `EmbeddingRequestOutput`).

The engine reports every request as a `RequestOutput`; a pooling request's carries its vector
in ``pooled`` (a `PoolingOutput`), which the front doors turn into vLLM's pooling outputs
(`PoolingRequestOutput.from_output`). Plain Python; no JAX import.
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
    from the prefix cache. ``pooled``: a finished pooling request's vector (`PoolingOutput`;
    its ``outputs[0]`` then has no tokens and ``finish_reason`` ``"stop"``), else None."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    pooled: "PoolingOutput | None" = None


@dataclasses.dataclass
class PoolingOutput:
    """The pooled vector of one request (vLLM's ``PoolingOutput``).

    Attributes:
      data: [d] float32 numpy array: the final hidden states pooled (``last`` or ``mean``), the
        first ``dimensions`` values, L2-normalized unless ``normalize=False``
        (`jaxinfer.core.pooling.finalize`).
    """

    data: object


@dataclasses.dataclass
class PoolingRequestOutput:
    """A finished pooling request (vLLM's ``PoolingRequestOutput``)."""

    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool
    num_cached_tokens: int = 0

    @classmethod
    def from_output(cls, out: RequestOutput) -> "PoolingRequestOutput":
        """The pooling view of an engine `RequestOutput` whose ``pooled`` is set.

        Raises:
          ValueError: ``out`` is no finished pooling request's output.
        """
        if out.pooled is None:
            raise ValueError(f"request {out.request_id} has no pooled output "
                             f"(finish reason {out.outputs[0].finish_reason if out.outputs else None})")
        return cls(out.request_id, out.pooled, out.prompt_token_ids, out.finished, out.num_cached_tokens)


@dataclasses.dataclass
class EmbeddingOutput:
    """An embedding as a list of floats (vLLM's ``EmbeddingOutput``)."""

    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclasses.dataclass
class EmbeddingRequestOutput:
    """A finished embedding request (vLLM's ``EmbeddingRequestOutput``, what ``LLM.embed`` returns)."""

    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool
    num_cached_tokens: int = 0

    @classmethod
    def from_base(cls, out: PoolingRequestOutput) -> "EmbeddingRequestOutput":
        return cls(out.request_id, EmbeddingOutput([float(x) for x in out.outputs.data]), out.prompt_token_ids,
                   out.finished, out.num_cached_tokens)
