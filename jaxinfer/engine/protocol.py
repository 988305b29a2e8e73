"""The engine interface: what the front ends (`jaxinfer.engine.async_engine.AsyncEngine`,
`jaxinfer.entrypoints.llm.LLM`, the metrics endpoint) may call on an engine.

Owns `RequestSpec` (one request to add), `EngineDescription` (what the start-up log says
of an engine), `SharedGrammar` (the grammar engine an engine hands out, one for all
data-parallel replicas) and `Engine`, a `typing.Protocol` that
`jaxinfer.engine.llm_engine.LLMEngine` (one replica) and `jaxinfer.engine.dp_router.DataParallelRouter`
(several) both implement in full: nothing reads an engine's internals (scheduler,
runner, stats) through it, and the gauges and counters come from one `snapshot`.
Plain Python; no JAX import (`jaxinfer.structured_outputs.grammar` is imported on first use).
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Protocol, Sequence, runtime_checkable

from jaxinfer.config import EngineConfig, ModelConfig
from jaxinfer.engine.snapshot import EngineSnapshot
from jaxinfer.errors import RequestError
from jaxinfer.outputs import RequestOutput
from jaxinfer.pooling_params import PoolingParams
from jaxinfer.sampling_params import SamplingParams


@dataclasses.dataclass
class RequestSpec:
    """One engine request to add (an HTTP request fans out into several for ``n > 1``).

    Attributes:
      request_id: unique id.
      prompt_token_ids: the prompt ids (already truncated if asked).
      params: sampling options with ``n == 1`` (``params.priority`` orders it under the
        priority policy).
      prompt: the prompt text, if any (for outputs).
      deadline: absolute ``time.monotonic()`` seconds after which it times out, or None.
      max_queue_wait: seconds it may wait unadmitted (from its arrival) before being rejected, or None.
      arrival_time: ``time.monotonic()`` seconds when the server received the request, or
        None (then: when the engine takes it). Its TTFT, queue time and end-to-end latency
        count from here, so the HTTP layer's part and the wait for the step in progress to end
        are in them, as in vLLM, whose API server stamps a request's arrival.
      pooling: a pooling (embedding) request's options: it computes its prompt only and
        returns a pooled vector (`RequestOutput.pooled`); ``params`` then only orders it
        (``priority``). None: a generation request.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    deadline: float | None = None
    max_queue_wait: float | None = None
    arrival_time: float | None = None
    pooling: PoolingParams | None = None


class SharedGrammar:
    """One `jaxinfer.structured_outputs.grammar.GrammarEngine` for a tokenizer, made on first use (thread-safe).
    Data-parallel replicas hold one (same tokenizer, vocabulary and EOS ids), so a constraint
    compiled for one is in the cache of all.

    Args:
      tokenizer: a `jaxinfer.tokenizer.tokenizer.Tokenizer`, or None (then `get` raises).
      vocab_size: the model's logit rows. eos_token_ids: the ids that end generation.
    """

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids):
        self._args = (tokenizer, vocab_size, eos_token_ids)
        self._engine = None
        self._lock = threading.Lock()

    def get(self):
        """The grammar engine. Raises: RequestError: no tokenizer (structured outputs need one)."""
        if self._engine is None:
            with self._lock:
                if self._engine is None:
                    if self._args[0] is None:
                        raise RequestError("structured outputs need the model's tokenizer",
                                           param="structured_outputs")
                    from jaxinfer.structured_outputs.grammar import GrammarEngine

                    self._engine = GrammarEngine(*self._args)
        return self._engine


@dataclasses.dataclass(frozen=True)
class EngineDescription:
    """What the start-up log says of a built engine (`Engine.describe`).

    Attributes:
      num_blocks: KV blocks of one replica's pool, the null block included.
      kv_cache: one line on how the KV pool was sized (e.g. ``"5800 blocks x 0.70 MiB per
        device = 3.97 GiB (default CPU budget ...)"``), prefixed ``"N replicas x "`` by a router.
      replicas: data-parallel replicas behind the engine (1 for one `LLMEngine`).
      plan: the runner's `jaxinfer.platform.execution_plan.ExecutionPlan` (every replica's alike), or None
        when the runner has none (a test double).
    """

    num_blocks: int
    kv_cache: str
    replicas: int = 1
    plan: object | None = None


@runtime_checkable
class Engine(Protocol):
    """A continuous-batching engine driven one step at a time by one thread.

    Attributes:
      config, model_config: its configuration and model hyperparameters.
      tokenizer: a `jaxinfer.tokenizer.tokenizer.Tokenizer`, or None.
    """

    config: EngineConfig
    model_config: ModelConfig
    tokenizer: object

    def add_requests(self, specs: Sequence[RequestSpec]) -> None:
        """Admit a group all or none: validate every spec and check queue room for all,
        then queue them.

        Raises:
          RequestError: a spec is invalid (empty, too long, never fits, duplicate id,
            more sequences than the queue can ever hold); nothing was queued.
          QueueFullError: the waiting queue has no room for the whole group now.
        """

    def abort_request(self, request_id: str) -> None:
        """Finish a request now (its blocks freed); unknown ids are ignored."""

    def step(self) -> list[RequestOutput]:
        """One scheduling step; the outputs of requests that advanced or ended."""

    def has_unfinished_requests(self) -> bool:
        """True while a request waits, runs, or has an output not yet returned."""

    def snapshot(self) -> EngineSnapshot:
        """The gauges and counters of ``GET /metrics`` (callable from another thread)."""

    def wake_time(self) -> float | None:
        """Earliest ``time.monotonic()`` at which a step may make progress with no new
        request (a deadline, a queue-wait limit, a static batch falling due), or None."""

    def warmup(self) -> float:
        """Compile every shape ahead of time; returns seconds spent."""

    def grammar_engine(self):
        """The `jaxinfer.structured_outputs.grammar.GrammarEngine` that compiles this engine's structured-output
        constraints (made once, on first use; thread-safe, so a front end may compile a
        request's constraint in its own thread before `add_requests`, and the engine thread
        then finds it in the grammar cache).

        Raises:
          RequestError: the engine has no tokenizer (structured outputs need one).
        """

    def describe(self) -> EngineDescription:
        """The KV pool and replica layout for the start-up log (`EngineDescription`)."""

    @property
    def num_steps(self) -> int:
        """Steps that executed a batch (monotonic)."""

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...
