"""`TTFTEstimator`: a new request's expected time to first token on one engine, from measurements.

Graceful degradation (``--fallback-model``, ``--degrade-ttft-slo``) sends a request to
the fallback model when its estimated TTFT on the requested model exceeds the SLO. The
estimate is

    TTFT ~= slot wait + (prefill tokens ahead + the request's own prompt tokens) / measured prefill rate

* **Queue position** (tokens ahead): the prompt tokens of every request handed to this
  engine that has not yet produced its first token (waiting, or part-way through a
  chunked prefill). A request counts from the moment the HTTP layer hands it over
  (`on_handed`), not from the moment the engine thread takes it between two steps: a
  burst that arrives during one step must see itself (counted at the engine's next step,
  every request of a burst saw the same empty queue and none moved). Prefix-cache hits
  and chunks already computed are not subtracted, so this is an upper bound: under doubt
  the estimate errs towards degrading.
* **Slot wait**: the engine runs at most ``slots`` sequences (``max_num_seqs`` x data
  replicas). A request that finds them all taken by requests handed over before it
  (running, or waiting ahead of it) waits for a slot to free. Each live request has
  output tokens still to come (its ``max_tokens`` minus the outputs seen: an upper
  bound, it may stop earlier); the first ``slots`` of them in hand-over order hold the
  slots, each waiting one takes the first slot to free and holds it for its own tokens,
  and the new request gets the next slot to free. Steps are converted to seconds with
  the measured wall time of a step that ran a full batch (every slot busy; a moving
  average like the rate's). A step that prefilled the whole token budget (``full_tokens``)
  seeds that time before the first full-batch step (it costs at least as much as a decode
  step of every slot, so the seed errs long): a cold-start flood, whose slots fill one
  prompt per step, gets an estimate after one step. Before either that wait is
  unknown, ``inf``: a request beyond the slots then moves to a fallback that has room.
  Slots held back by KV memory are not modelled here (see running load).
* **Measured prefill rate** (tokens/s): an exponentially weighted moving average, with
  time constant ``tau_s`` seconds of engine time, of ``prefill tokens computed in a step
  / that step's wall time`` over *saturated* steps: steps after which prefill work that
  the engine had taken before the step was still pending, so the rate measures what the
  engine can do, not how little work it was given (the first saturated step is taken as
  is; requests handed over during a step do not make it saturated). A step that computed
  the whole backlog says only that the engine can do at least its rate: it raises the
  estimate's rate to its own when that is higher, and never lowers it.
* **Running load**: the decode rows of running requests share every step with the
  prefill chunks, and the KV-memory watermark can hold waiting prompts back while
  running ones decode. Both show up in the measurement: a saturated step's wall time
  includes its decode rows, and a step that computed no prefill because memory was
  short is a saturated step with rate 0, which pulls the average (and so the admission
  outlook) down until requests finish. Other engines of the same process (the primary
  and its fallback) share the device: their work shows only through the step times this
  engine measures, so a rate measured while the other engine was idle is too high once
  it gets busy (by up to its share of the device, until ``tau_s`` of contended steps
  have pulled the average down).

Before any step computed prompt tokens there is no measurement and `estimate` returns
None (the caller does not degrade on a guess). The HTTP layer calls `on_handed` (and
`on_dropped` for a request that never reached the engine); the engine thread calls
`on_added`, `on_dropped`, `on_output` and `on_step`; `estimate` may be called from any
thread (one lock guards the state). Plain Python; no JAX import.
"""
from __future__ import annotations

import heapq
import math
import threading


class TTFTEstimator:
    """Prefill tokens ahead, sequence slots taken, and the measured rates of one engine.

    Args:
      tau_s: time constant of the moving averages, in seconds of step time (a step of
        ``dt`` seconds moves an average ``1 - exp(-dt / tau_s)`` of the way to its own value).
      slots: sequences the engine runs at once, or None (unbounded: no slot wait); the
        async engine sets it once the engine is built.
    """

    def __init__(self, tau_s: float = 2.0, slots: int | None = None):
        if not tau_s > 0:
            raise ValueError(f"tau_s must be > 0 seconds, got {tau_s}")
        self.tau_s = tau_s
        self.slots = slots
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # request id -> prompt tokens, until its first output
        self._handed: dict[str, int] = {}  # of those, handed over but not yet taken by the engine
        self._remaining: dict[str, float] = {}  # every live request -> output tokens it may still produce
        self.pending_tokens = 0  # sum of _pending
        self._handed_tokens = 0  # sum of _handed
        self.rate: float | None = None  # prefill tokens / s; None before any prefill was measured
        self.full_step_s: float | None = None  # wall time of a step with every slot busy; None before one
        # the per-step token budget: before a full-batch step, a step that prefilled this many
        # tokens seeds full_step_s (its time bounds a decode step of all slots from above), so a
        # cold-start flood has an estimate after its first step, not after every slot prefilled
        self.full_tokens: int | None = None
        self._saturated_seen = False  # the moving average has started

    def on_handed(self, request_id: str, prompt_tokens: int, max_tokens: int | None = None) -> None:
        """The HTTP layer handed a request of ``prompt_tokens`` prompt tokens (and at most
        ``max_tokens`` output tokens; None: unknown) to the engine: it counts at once."""
        with self._lock:
            if request_id in self._remaining:
                return
            self._pending[request_id] = self._handed[request_id] = prompt_tokens
            self.pending_tokens += prompt_tokens
            self._handed_tokens += prompt_tokens
            self._remaining[request_id] = math.inf if max_tokens is None else max_tokens

    def on_added(self, request_id: str, prompt_tokens: int, max_tokens: int | None = None) -> None:
        """The engine took the request (counted now unless `on_handed` counted it already)."""
        with self._lock:
            handed = self._handed.pop(request_id, None)
            if handed is not None:
                self._handed_tokens -= handed
                return
            if request_id in self._remaining:
                return
            self._pending[request_id] = prompt_tokens
            self.pending_tokens += prompt_tokens
            self._remaining[request_id] = math.inf if max_tokens is None else max_tokens

    def on_dropped(self, request_id: str) -> None:
        """The request left without being served (the engine refused it, or nobody listens
        for it any more): it no longer counts anywhere. Idempotent."""
        with self._lock:
            self.pending_tokens -= self._pending.pop(request_id, 0)
            self._handed_tokens -= self._handed.pop(request_id, 0)
            self._remaining.pop(request_id, None)

    def on_output(self, request_id: str, finished: bool = False) -> None:
        """The request produced an output (its first token, one more, or it finished): its
        prefill is no longer ahead of anyone, and it has one output fewer to go (a
        speculative step that emitted several tokens counts as one: the slot wait stays
        an upper bound); a finished request frees its slot."""
        with self._lock:
            self.pending_tokens -= self._pending.pop(request_id, 0)
            self._handed_tokens -= self._handed.pop(request_id, 0)
            if finished:
                self._remaining.pop(request_id, None)
            elif request_id in self._remaining:
                self._remaining[request_id] = max(0.0, self._remaining[request_id] - 1)

    def on_step(self, seconds: float, prefill_tokens: int, running: int | None = None) -> None:
        """One engine step of ``seconds`` wall time computed ``prefill_tokens`` prompt
        tokens with ``running`` sequences (None: not known); call it after the step's
        outputs went through `on_output`."""
        if seconds <= 0:
            return
        alpha = 1.0 - math.exp(-seconds / self.tau_s)
        with self._lock:
            if self.slots is not None and running is not None and running >= self.slots:
                self.full_step_s = seconds if self.full_step_s is None else (
                    self.full_step_s + alpha * (seconds - self.full_step_s))
            elif self.full_step_s is None and self.full_tokens and prefill_tokens >= self.full_tokens:
                self.full_step_s = seconds  # the seed (see full_tokens); full-batch steps move it from here
            observed = prefill_tokens / seconds
            if self.pending_tokens - self._handed_tokens <= 0:  # unsaturated: a lower bound on the capacity
                if prefill_tokens > 0 and observed > (self.rate or 0.0):
                    self.rate = observed
                return
            if not self._saturated_seen or self.rate is None:
                self._saturated_seen = True
                self.rate = observed
                return
            self.rate += alpha * (observed - self.rate)

    def slot_wait(self) -> float:
        """Seconds a new request would wait for a sequence slot: 0 while one is free,
        else the time until the running request it waits for finishes (module docstring;
        ``inf`` before a full-batch step was measured)."""
        with self._lock:
            return self._slot_wait()

    def queue_wait(self, group: int = 1, max_tokens: float = math.inf) -> float | None:
        """Seconds until the last of ``group`` new sequences (of at most ``max_tokens``
        outputs each) would get a sequence slot, behind every live request: 0 when free
        slots hold the whole group, None when unknown (no full-batch step measured yet).
        What the queue-wait bound compares (`jaxinfer.engine.admission.check_wait`)."""
        with self._lock:
            steps = self._slot_wait_steps(group, max_tokens)
            step_s = self.full_step_s
        if steps == 0:
            return 0.0
        return None if step_s is None else steps * step_s

    def _slot_wait(self) -> float:
        steps = self._slot_wait_steps(1)
        if steps == 0:
            return 0.0
        return math.inf if self.full_step_s is None else steps * self.full_step_s

    def _slot_wait_steps(self, group: int, max_tokens: float = math.inf) -> float:
        """Engine steps until the last of ``group`` new requests gets a slot (0: free slots hold them)."""
        if self.slots is None:
            return 0
        live = list(self._remaining.values())  # in hand-over order: the first `slots` run (FCFS)
        if len(live) + group <= self.slots:
            return 0
        ends = live[:self.slots]  # steps until each slot frees
        ends += [0.0] * (self.slots - len(ends))  # free slots: taken at once
        heapq.heapify(ends)
        for steps in live[self.slots:] + [max_tokens] * (group - 1):  # each takes the first slot to free
            heapq.heapreplace(ends, ends[0] + steps)
        return ends[0]

    def estimate(self, prompt_tokens: int) -> float | None:
        """Expected seconds from now to the first token of a new request of
        ``prompt_tokens`` prompt tokens, or None before any prefill measurement; ``inf``
        when the measured rate is 0 (the queue is not moving) or the slot wait is unknown."""
        with self._lock:
            rate = self.rate
            if rate is None:
                return None
            work = max(0, self.pending_tokens) + prompt_tokens
            wait = self._slot_wait()
        return wait + (work / rate if rate > 0 else math.inf)
