"""`LLMEngine`: the request lifecycle, one step at a time.

Lifecycle of a request:
  1. ``add_requests`` (the one admission path; ``add_request`` is a group of one)
     validates a group on the host (`jaxinfer.engine.admission`: non-empty prompt, ids in the vocabulary,
     prompt + max_tokens within ``max_model_len`` and within the whole KV pool, bounded
     queue) and raises `RequestError` / `QueueFullError` before any device work: all
     of the group is queued, or none.
  2. It waits in the scheduler's queue (FCFS or by priority) until the watermark admits it.
  3. Each ``step``: **schedule** (expire deadlines, top up running requests, preempt the
     policy's victim on memory pressure, admit waiting ones) -> **execute** (pack into a bucket,
     one jitted call, sampled ids back once) -> **update** (`jaxinfer.engine.output_processor`: append
     tokens, stop rules, incremental detokenization and stop strings, logprobs; prompt logprobs
     of the prompt positions the step computed, `jaxinfer.core.prompt_logprobs`). A step with structured-output
     rows also has a **mask** phase between pack and call: the grammar engine
     (`jaxinfer.structured_outputs.grammar`) fills those rows' token bitmask, and update advances their
     matchers (a matcher whose grammar is complete finishes its request with ``stop``).
  4. A finished request (stop, length, abort, timeout, rejected) frees its blocks in the
     step it ends and is reported once with ``finished=True``.
If preparing a step's batch (after schedule, before the runner) raises, only that step's
requests fail (``failed``) and the engine goes on (`LLMEngine._fail_step`); a raise
anywhere else in ``step`` propagates (the caller's fault policy: the engine is dead).
The engine is single-threaded: the async front end calls it from one thread.
"""
from __future__ import annotations

import collections
import logging
import math
import time
from typing import Sequence

import numpy as np

from jaxinfer.engine import admission
from jaxinfer.runner import batch as batch_mod
from jaxinfer.core.kv_cache.block_manager import BlockManager
from jaxinfer.runner.buckets import BucketLadders
from jaxinfer.config import EngineConfig, ModelConfig
from jaxinfer.engine.drain_rate import DrainRate
from jaxinfer.engine.protocol import EngineDescription, RequestSpec, SharedGrammar
from jaxinfer.engine.snapshot import EngineSnapshot
from jaxinfer.errors import RequestError
from jaxinfer.engine.fault_injection import PREPARE, StepFault
from jaxinfer.engine.output_processor import OutputProcessor
from jaxinfer.outputs import RequestOutput
from jaxinfer.core.request import FinishReason, Request
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.core.sched.scheduler import SchedulerOutput, make_scheduler
from jaxinfer.spec_decode.speculator import make_speculator

logger = logging.getLogger(__name__)


STEP_PHASES = ("schedule", "prepare", "mask", "execute", "update")
MAX_FAILED_PREPARES = 3  # this many step preparations failing in a row kill the engine (`LLMEngine._fail_step`)


class EngineStats:
    """Counters the metrics endpoint and benchmarks read (monotonic totals), and the KV
    slots held at the end of the last step (``kv_slots``: (reserved, filled), a gauge)."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.prefill_tokens = 0
        self.generation_tokens = 0
        self.num_steps = 0
        self.step_seconds = 0.0
        self.aborted = 0
        self.timeouts = 0
        self.rejected = 0
        self.fragmentation_sum = 0.0
        self.fragmentation_samples = 0
        # FinishReason value -> requests; every key present from the start, so a scrape copying it
        # from another thread never sees the dict change size
        self.finished: collections.Counter[str] = collections.Counter({r.value: 0 for r in FinishReason})
        self.kv_slots: tuple[int, int] = (0, 0)  # one tuple: a scrape never sees half an update
        self.retry_after_s = 1.0  # the waiting queue's drain time at the measured rate (a gauge)
        # Wall seconds per phase of `LLMEngine.step` (host work vs. the runner's call, which
        # includes the device work and the one read back): where a step's time goes.
        self.phase_seconds: dict[str, float] = dict.fromkeys(STEP_PHASES, 0.0)
        self.mask_steps = 0  # steps that had a ``mask`` phase (its per-step cost = seconds / steps)
        self.mask_rows = 0  # constrained rows masked, over those steps
        self.failed_steps = 0  # steps whose host-side preparation raised (their requests failed)


class LLMEngine:
    """Continuous-batching engine over a `ModelRunner` (or any object with ``execute``).

    Args:
      config: the engine configuration.
      model_config: the model's hyperparameters.
      runner: executes `StepInputs` and returns sampler outputs (numpy).
      num_blocks: KV pool size including the null block.
      tokenizer: optional `jaxinfer.tokenizer.tokenizer.Tokenizer` (text, stop strings, logprob text).
      proposer_factory: ``layout -> proposer`` when ``config.speculative`` names a draft
        model (`jaxinfer.spec_decode.draft_model`; ngram builds its own).
      grammar: the `SharedGrammar` to compile constraints with (replicas share one), or
        None for this engine's own.
      kv_cache_description: how the KV pool was sized, for `describe` (start-up log).
      mesh: the replica's ``jax.sharding.Mesh``, or None on one device (kept as ``mesh``).
    """

    def __init__(self, config: EngineConfig, model_config: ModelConfig, runner, num_blocks: int, tokenizer=None,
                 proposer_factory=None, *, grammar: SharedGrammar | None = None, kv_cache_description: str = "",
                 mesh=None):
        self.config = config
        self.model_config = model_config
        self.runner = runner
        self.tokenizer = tokenizer
        self.kv_cache_description = kv_cache_description
        self.mesh = mesh
        sc, cc = config.scheduler, config.cache
        self.block_manager = BlockManager(num_blocks, cc.block_size, cc.enable_prefix_caching)
        self.scheduler = make_scheduler(sc, cc, self.block_manager, cache_salt=config.model_path.encode())
        self.layout = batch_mod.BatchLayout(
            ladders=BucketLadders(sc.max_num_batched_tokens, sc.max_num_seqs,
                                  math.ceil(sc.max_model_len / cc.block_size)),
            block_size=cc.block_size, vocab_size=model_config.vocab_size, max_model_len=sc.max_model_len,
            max_logit_bias=config.max_logit_bias)
        self.requests: dict[str, Request] = {}
        self._drain = DrainRate()  # admissions per second, for Retry-After
        self._drain.record(time.monotonic(), 0)  # the measurement starts now
        self._admitted_seen = 0
        self._pending_outputs: list[RequestOutput] = []
        self._rng = np.random.default_rng(config.seed)
        self.stats = EngineStats()
        self.eos_token_ids = frozenset(model_config.eos_token_ids)
        self._grammar = grammar or SharedGrammar(tokenizer, model_config.vocab_size, self.eos_token_ids)
        self.speculator = make_speculator(config.speculative, sc, self.block_manager,
                                          proposer_factory(self.layout) if proposer_factory else None)
        self.output_processor = OutputProcessor(lambda: self.scheduler, self.stats, self.requests, tokenizer,
                                                self.eos_token_ids, config.return_logits, lambda: self.speculator)
        self.prepare_fault = StepFault.from_env(phase=PREPARE)  # the JAXINFER_FAIL_PHASE=prepare test hook
        self._failed_prepares = 0  # consecutive steps whose preparation raised (`_fail_step`)
        pool_tokens = self.block_manager.num_usable_blocks * cc.block_size
        if pool_tokens < sc.max_model_len:
            logger.warning("the KV pool holds %d tokens, less than max_model_len %d: longer requests get 400",
                           pool_tokens, sc.max_model_len)

    # ----- warm-up ------------------------------------------------------------------------
    def warmup(self, progress=None) -> float:
        """Compile every bucket ahead of time; returns seconds spent. ``progress(done, total)``,
        when given, is called after each bucket (`jaxinfer.engine.warmup_progress.WarmupProgress`)."""
        t0 = time.perf_counter()
        buckets = self.layout.ladders.all_buckets()
        if progress is not None:
            progress(0, len(buckets))
        for i, b in enumerate(buckets):
            inputs = batch_mod.empty_inputs(b, self.layout)
            self.runner.compile(inputs)
            if self.speculator is not None:  # a draft model compiles the same buckets
                self.speculator.compile(inputs)
            if progress is not None:
                progress(i + 1, len(buckets))
        dt = time.perf_counter() - t0
        logger.info("warm-up: %d buckets compiled or loaded from the compilation cache in %.1f s (tokens %s x "
                    "context blocks %s)", len(buckets), dt,
                    self.layout.ladders.token_ladder, self.layout.ladders.width_ladder)
        return dt

    # ----- requests -----------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *,
                    prompt: str | None = None, deadline: float | None = None,
                    max_queue_wait: float | None = None) -> None:
        """Queue one request: `add_requests` with a group of one.

        Args:
          deadline: absolute ``time.monotonic()`` after which it is evicted (TIMEOUT).
          max_queue_wait: seconds it may wait unadmitted before REJECTED.

        Raises:
          RequestError, QueueFullError: as `add_requests`.
        """
        self.add_requests([RequestSpec(request_id, prompt_token_ids, params, prompt, deadline, max_queue_wait)])

    def add_requests(self, specs: Sequence[RequestSpec]) -> None:
        """Admit a group all or none (the one admission path): `check_requests`, then
        queue every spec in order (host only, no device work).

        Raises:
          RequestError: empty prompt, ids outside the vocabulary, too long, never fits,
            duplicate id, more sequences than ``max_queue_len``.
          QueueFullError: the waiting queue (requests beyond the free sequence slots) has no
            room for the whole group now.
        """
        max_tokens = self.check_requests(specs)
        for spec, n in zip(specs, max_tokens):
            self._enqueue(spec, n)

    def check_requests(self, specs: Sequence[RequestSpec]) -> list[int]:
        """Validate a group against this engine without queueing anything (ids, prompts,
        options, room in the waiting queue for all of it).

        Returns:
          Each spec's effective ``max_tokens``.
        Raises:
          RequestError, QueueFullError: as `add_requests`.
        """
        admission.check_ids(specs, self.requests)
        max_tokens = [self._check_prompt(s) for s in specs]
        admission.check_room(len(specs), max_queue_len=self.config.scheduler.max_queue_len,
                             num_waiting=self.num_waiting, free_slots=self.scheduler.free_slots,
                             retry_after=lambda: self._drain.seconds_to_drain(self.scheduler.num_queued,
                                                                               time.monotonic()))
        return max_tokens

    def _check_prompt(self, spec: RequestSpec) -> int:
        """One spec's prompt and options (`jaxinfer.engine.admission`); its effective ``max_tokens``."""
        mc = self.model_config
        if spec.pooling is not None:
            return admission.check_pooling_prompt(spec.prompt_token_ids, self._pooling(spec), vocab_size=mc.vocab_size,
                                                  hidden_size=mc.hidden_size, config=self.config,
                                                  block_manager=self.block_manager)
        return admission.check_prompt(spec.prompt_token_ids, spec.params, vocab_size=mc.vocab_size,
                                      config=self.config, block_manager=self.block_manager,
                                      grammar_engine=self.grammar_engine)

    def _pooling(self, spec: RequestSpec):
        """A pooling spec's options with the engine's defaults (``--pooling-type``, normalized)."""
        return spec.pooling.resolved(self.config.pooling_type)

    def _enqueue(self, spec: RequestSpec, max_tokens: int) -> None:
        params = spec.params
        if spec.pooling is not None:  # nothing is sampled: its row is a plain greedy one (no penalties, logprobs)
            params = SamplingParams(temperature=0.0, max_tokens=None, priority=params.priority)
        seed = params.seed if params.seed is not None else int(self._rng.integers(0, 2**63))
        now = time.monotonic()
        mqw = spec.max_queue_wait
        arrival = now if spec.arrival_time is None else min(spec.arrival_time, now)
        req = Request(spec.request_id, list(spec.prompt_token_ids), params, seed=seed & (2**64 - 1),
                      max_tokens=max_tokens, eos_token_ids=self.eos_token_ids, arrival_time=arrival,
                      deadline=spec.deadline, max_queue_wait_deadline=None if mqw is None else arrival + mqw)
        req.prompt = spec.prompt
        if spec.pooling is not None:
            req.pooling = self._pooling(spec)
        elif params.structured_outputs is not None:
            req.matcher = self.grammar_engine().matcher(params.structured_outputs)
        self.requests[spec.request_id] = req
        self.output_processor.add(req)
        self.stats.prompt_tokens += req.num_prompt_tokens
        self.scheduler.add_request(req)

    def grammar_engine(self):
        """The `jaxinfer.structured_outputs.grammar.GrammarEngine` of this model (made once, on first use; thread-safe).

        Raises:
          RequestError: the engine has no tokenizer (structured outputs need one).
        """
        return self._grammar.get()

    def describe(self) -> EngineDescription:
        """The KV pool for the start-up log (`jaxinfer.engine.protocol.EngineDescription`)."""
        return EngineDescription(self.block_manager.num_blocks, self.kv_cache_description,
                                 plan=getattr(self.runner, "plan", None))

    def abort_request(self, request_id: str) -> None:
        """Finish a request now (client gone); its blocks are freed immediately. Unknown ids are ignored."""
        req = self.requests.get(request_id)
        if req is None or req.is_finished:
            return
        self.scheduler.finish(req, FinishReason.ABORT)
        self.stats.aborted += 1
        self._pending_outputs.append(self.output_processor.finish(req))

    def reset_prefix_cache(self) -> bool:
        """Drop all cached prefix blocks (as vLLM's ``reset_prefix_cache``); only when idle.

        Returns False if requests still hold blocks.
        """
        return self.block_manager.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.num_unfinished > 0 or bool(self._pending_outputs)

    # ----- the step -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, execute, update. Returns outputs of requests that advanced or ended.

        Each phase's wall time is added to ``stats.phase_seconds`` (``schedule`` includes
        the outputs of requests that ended while scheduling; ``update`` includes stop
        rules and detokenization).
        """
        t0 = time.perf_counter()
        outputs, self._pending_outputs = self._pending_outputs, []
        sched = self.scheduler.schedule()
        for req in sched.finished:
            self.stats.timeouts += req.finish_reason == FinishReason.TIMEOUT
            self.stats.rejected += req.finish_reason == FinishReason.REJECTED
            outputs.append(self.output_processor.finish(req))
        phases = self.stats.phase_seconds
        t1 = time.perf_counter()
        phases["schedule"] += t1 - t0
        if sched.scheduled:
            self._sample_fragmentation()
            # counted before update advances num_computed_tokens (else a prompt's last chunk is missed)
            prefill = sum(n for r, n in sched.scheduled if r.num_computed_tokens < r.num_prompt_tokens)
            if self.speculator is not None:
                self.speculator.attach(sched, self.num_running)
            try:  # host-side only: a raise here fails this step's requests, not the engine (_fail_step)
                self.prepare_fault.before_step()
                inputs = batch_mod.prepare(sched, self.layout)
                tm = time.perf_counter()
                self._fill_mask(sched, inputs)
            except Exception as exc:  # noqa: BLE001 - any bug in preparation; bounded by MAX_FAILED_PREPARES
                outputs.extend(self._fail_step(sched, exc))
                phases["prepare"] += time.perf_counter() - t1
            else:
                self._failed_prepares = 0
                t2 = time.perf_counter()
                result = self.runner.execute(inputs)
                if self.speculator is not None:
                    self.speculator.observe(inputs)
                t3 = time.perf_counter()
                outputs.extend(self.output_processor.process(sched, result))
                self.stats.num_steps += 1
                self.stats.prefill_tokens += prefill
                phases["prepare"] += tm - t1
                phases["mask"] += t2 - tm
                phases["execute"] += t3 - t2
                phases["update"] += time.perf_counter() - t3
        self.stats.kv_slots = self._kv_slots()
        self._record_drain()
        self.stats.step_seconds += time.perf_counter() - t0
        return outputs

    def _fail_step(self, sched: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
        """Preparing ``sched``'s batch raised before the step reached the device: fail the
        step's requests alone (``FinishReason.FAILED``, HTTP 500 ``step_failed``), keep serving.

        Safe because nothing of the step left the host: the runner was not called (no
        device work, no step sent to the followers of a multi-host run), so the KV cache,
        the runner and the followers hold exactly what the last completed step left; and
        the host state the step changed belongs to its requests alone: the blocks
        `schedule` gave them (freed here by `Scheduler.finish`; prefix-cache blocks are
        registered only in ``update``, after their KV is computed, so no block of this
        step's uncomputed tokens can be found by a later request), their drafts (cleared;
        a draft model's proposals, already run, wrote only at positions past each
        request's computed tokens, in its own unregistered blocks, freed with it) and their
        grammar matchers (filling the mask does not advance them). Requests
        preempted by this schedule are back in the waiting queue without blocks, as after
        any step; waiting ones are untouched. (docs/api.md, "Engine faults".)

        Returns:
          The failed requests' final outputs.
        Raises:
          RuntimeError: the `MAX_FAILED_PREPARES`-th preparation in a row failed (a bug
            that every step hits): the engine dies as for any step failure.
        """
        self._failed_prepares += 1
        ids = [req.request_id for req, _ in sched.scheduled]
        if self._failed_prepares >= MAX_FAILED_PREPARES:
            raise RuntimeError(f"preparing the engine step failed {self._failed_prepares} times in a row "
                               f"(last: {type(exc).__name__}: {exc})") from exc
        logger.error("preparing an engine step raised before it reached the device; its %d request(s) %s fail, "
                     "serving goes on", len(ids), ids, exc_info=exc)
        outputs = []
        for req, _ in sched.scheduled:
            req.draft_token_ids = []
            self.scheduler.finish(req, FinishReason.FAILED)
            outputs.append(self.output_processor.finish(req))
        self.stats.failed_steps += 1
        return outputs

    def _record_drain(self) -> None:
        """Feed this step's admissions to the drain-rate estimate behind ``Retry-After``."""
        now = time.monotonic()
        admitted = self.scheduler.num_admitted
        self._drain.record(now, admitted - self._admitted_seen)
        self._admitted_seen = admitted
        self.stats.retry_after_s = self._drain.seconds_to_drain(len(self.scheduler.waiting), now)

    def _fill_mask(self, sched: SchedulerOutput, inputs: batch_mod.StepInputs) -> None:
        """Fill the structured-output rows of the step's bitmask (when the step has one)."""
        bitmask = inputs.sampling.bitmask
        if bitmask is None:
            return
        rows = [(req.matcher, i) for i, (req, _) in enumerate(sched.scheduled) if req.matcher is not None]
        self.grammar_engine().fill_bitmask(rows, bitmask)
        self.stats.mask_steps += 1
        self.stats.mask_rows += len(rows)

    def _sample_fragmentation(self) -> None:
        """KV fragmentation = (reserved slots - slots holding tokens) / reserved slots."""
        bs = self.block_manager.block_size
        holders = self.scheduler.kv_holders
        reserved = sum(len(r.block_ids) for r in holders) * bs
        if reserved:
            held = sum(min(r.num_tokens, len(r.block_ids) * bs) for r in holders)
            self.stats.fragmentation_sum += (reserved - held) / reserved
            self.stats.fragmentation_samples += 1

    def _kv_slots(self) -> tuple[int, int]:
        """(reserved, filled) token slots of the KV blocks requests hold now: reserved =
        blocks x block_size, filled = tokens whose K/V is computed (capped by reserved)."""
        bs = self.block_manager.block_size
        reserved = filled = 0
        for r in self.scheduler.kv_holders:
            n = len(r.block_ids) * bs
            reserved += n
            filled += min(r.num_computed_tokens, n)
        return reserved, filled

    # ----- introspection ------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.block_manager.num_free_blocks

    @property
    def num_total_blocks(self) -> int:
        return self.block_manager.num_usable_blocks

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_steps(self) -> int:
        return self.stats.num_steps

    def wake_time(self) -> float | None:
        """Earliest monotonic time a step may progress unprompted: a request's deadline or
        queue-wait limit, or the static batch timeout; None if there is none. A queue-wait
        limit already past belongs to a request holding a free slot (`Scheduler.expire` spares
        it): no reason to wake, so not a time here (else the idle wait would spin)."""
        now = time.monotonic()
        times = [r.deadline for r in self.requests.values() if r.deadline is not None]
        times += [t for r in self.requests.values() if (t := r.max_queue_wait_deadline) is not None and t > now]
        if self.scheduler.batch_deadline is not None:
            times.append(self.scheduler.batch_deadline)
        return min(times, default=None)

    def snapshot(self) -> EngineSnapshot:
        """The gauges and counters ``GET /metrics`` exposes (safe to call from another thread)."""
        st, sched = self.stats, self.scheduler
        reserved, filled = st.kv_slots
        return EngineSnapshot(
            num_running=self.num_running, num_waiting=self.num_waiting, kv_blocks_total=self.num_total_blocks,
            kv_blocks_free=self.num_free_blocks, kv_slots_reserved=reserved, kv_slots_filled=filled,
            preemptions=sched.num_preemptions, prefix_cache_queries=sched.prefix_queries,
            prefix_cache_hits=sched.prefix_hits, prefix_cache_evictions=sched.block_manager.num_evictions,
            prompt_tokens=st.prompt_tokens, prefill_tokens=st.prefill_tokens,
            generation_tokens=st.generation_tokens, compilations=self.runner.num_compilations,
            timeouts=st.timeouts, aborted=st.aborted, finished=dict(st.finished),
            fragmentation_step_sum=st.fragmentation_sum, fragmentation_steps=st.fragmentation_samples,
            retry_after_s=st.retry_after_s, **self._spec_counters())

    def _spec_counters(self) -> dict[str, int]:
        """The speculative decoding counters of `snapshot` (none when speculation is off)."""
        if self.speculator is None:
            return {}
        s = self.speculator.stats
        return dict(spec_num_drafts=s.num_drafts, spec_num_draft_tokens=s.num_draft_tokens,
                    spec_num_accepted_tokens=s.num_accepted_tokens)
