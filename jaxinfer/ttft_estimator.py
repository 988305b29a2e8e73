"""`TTFTEstimator`: a new request's expected time to first token on one engine, from measurements.

Graceful degradation (``--fallback-model``, ``--degrade-ttft-slo``) sends a request to
the fallback model when its estimated TTFT on the requested model exceeds the SLO. The
estimate is

    TTFT ~= (prefill tokens ahead + the request's own prompt tokens) / measured prefill rate

* **Queue position** (tokens ahead): the prompt tokens of every request added to this
  engine that has not yet produced its first token (waiting, or part-way through a
  chunked prefill). Prefix-cache hits and chunks already computed are not subtracted,
  so this is an upper bound: under doubt the estimate errs towards degrading.
* **Measured prefill rate** (tokens/s): an exponentially weighted moving average, with
  time constant ``tau_s`` seconds of engine time, of ``prefill tokens computed in a step
  / that step's wall time`` over *saturated* steps: steps after which prefill work was
  still pending, so the rate measures what the engine can do, not how little work it
  was given (the first saturated step is taken as is). A step that computed the whole
  backlog says only that the engine can do at least its rate: it raises the estimate's
  rate to its own when that is higher, and never lowers it.
* **Running load**: the decode rows of running requests share every step with the
  prefill chunks, and the KV-memory watermark can hold waiting prompts back while
  running ones decode. Both show up in the measurement: a saturated step's wall time
  includes its decode rows, and a step that computed no prefill because memory was
  short is a saturated step with rate 0, which pulls the average (and so the admission
  outlook) down until requests finish.

Before any step computed prompt tokens there is no measurement and `estimate` returns
None (the caller does not degrade on a guess). The engine thread calls `on_added`,
`on_output` and `on_step`; `estimate` may be called from any thread (it reads two
numbers, each written atomically). Plain Python; no JAX import.
"""
from __future__ import annotations

import math


class TTFTEstimator:
    """Tokens of prefill ahead and the measured prefill rate of one engine.

    Args:
      tau_s: time constant of the rate's moving average, in seconds of step time
        (a step of ``dt`` seconds moves the average ``1 - exp(-dt / tau_s)`` of the
        way to its own rate).
    """

    def __init__(self, tau_s: float = 2.0):
        if not tau_s > 0:
            raise ValueError(f"tau_s must be > 0 seconds, got {tau_s}")
        self.tau_s = tau_s
        self._pending: dict[str, int] = {}  # request id -> prompt tokens, until its first output
        self.pending_tokens = 0  # sum of _pending (read from other threads)
        self.rate: float | None = None  # prefill tokens / s; None before any prefill was measured
        self._saturated_seen = False  # the moving average has started

    def on_added(self, request_id: str, prompt_tokens: int) -> None:
        """A request entered the engine with ``prompt_tokens`` prompt tokens to prefill."""
        self._pending[request_id] = prompt_tokens
        self.pending_tokens += prompt_tokens

    def on_output(self, request_id: str) -> None:
        """The request produced an output (its first token, or it finished): its prefill
        is no longer ahead of anyone. Idempotent."""
        self.pending_tokens -= self._pending.pop(request_id, 0)

    def on_step(self, seconds: float, prefill_tokens: int) -> None:
        """One engine step of ``seconds`` wall time computed ``prefill_tokens`` prompt
        tokens; call it after the step's outputs went through `on_output`."""
        if seconds <= 0:
            return
        observed = prefill_tokens / seconds
        if self.pending_tokens <= 0:  # unsaturated: a lower bound on the capacity
            if prefill_tokens > 0 and observed > (self.rate or 0.0):
                self.rate = observed
            return
        if not self._saturated_seen or self.rate is None:
            self._saturated_seen = True
            self.rate = observed
            return
        alpha = 1.0 - math.exp(-seconds / self.tau_s)
        self.rate += alpha * (observed - self.rate)

    def estimate(self, prompt_tokens: int) -> float | None:
        """Expected seconds from now to the first token of a new request of
        ``prompt_tokens`` prompt tokens, or None before any measurement; ``inf`` when the
        measured rate is 0 (the queue is not moving)."""
        rate = self.rate
        if rate is None:
            return None
        work = max(0, self.pending_tokens) + prompt_tokens
        return work / rate if rate > 0 else math.inf
