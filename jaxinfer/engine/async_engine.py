"""`AsyncEngine`: runs the single-threaded `LLMEngine` in one dedicated thread for asyncio callers.

Where it sits: HTTP handlers (asyncio) -> `AsyncEngine` -> engine thread -> `LLMEngine.step`.

Threading contract:
  * One thread owns the engine. It first builds it (loading weights and compiling every
    bucket may take minutes: the HTTP server is already listening), then loops:
    apply every queued command (add / abort / stop), run one ``step``, hand the outputs
    back. With nothing to do it blocks on the command queue: no busy-wait, no polling.
  * Commands arrive through a thread-safe `queue.SimpleQueue`, applied at the start of each
    loop iteration, so an abort takes effect before the next step (a queued request whose
    client left is never prefilled).
  * Outputs travel back with ``loop.call_soon_threadsafe`` into one `asyncio.Queue` per
    group of requests (`OutputStream`: one HTTP request, its ``n`` choices); the first item
    is the verdict on admission (accepted, or the `RequestError` / `QueueFullError` raised).
  * If the engine raises, the thread marks itself dead (the fault policy of docs/api.md):
    every request in flight or queued fails with `EngineDeadError` (``in_flight``: HTTP
    500), new work is refused (HTTP 503), `is_healthy` turns False at once and the death
    callbacks run (the server exits non-zero: `jaxinfer.entrypoints.openai.engine_death`).
    ``JAXINFER_FAIL_STEP=N`` makes the Nth step raise (`jaxinfer.engine.fault_injection`, a test hook).
    A step whose host-side preparation raised is not a death: the engine fails that
    step's requests itself (their outputs finish with ``failed``: HTTP 500) and goes on
    (`jaxinfer.engine.llm_engine.LLMEngine._fail_step`).
  * `start_draining` (SIGTERM) refuses new requests while in-flight ones finish;
    `shutdown` aborts what is left and joins the thread.
  * `add` counts a group's prompts in `ttft` (`jaxinfer.engine.ttft_estimator.TTFTEstimator`)
    at once, before the engine thread takes them, so that every request of a burst sees
    the ones handed over before it; the engine thread feeds the rest (outputs, finishes,
    refusals, step timings). Any thread may ask it for a new request's expected time to
    first token (graceful degradation).
"""
from __future__ import annotations

import asyncio
import enum
import logging
import queue
import threading
import time
import traceback
from typing import AsyncIterator, Callable, Sequence

from jaxinfer.engine import request_log
from jaxinfer.engine.protocol import Engine, RequestSpec  # noqa: F401 - RequestSpec is part of this API
from jaxinfer.errors import QueueFullError, RequestError
from jaxinfer.engine.fault_injection import StepFault
from jaxinfer.engine.output_stream import ACCEPTED, OutputStream
from jaxinfer.outputs import RequestOutput
from jaxinfer.engine.ttft_estimator import TTFTEstimator

logger = logging.getLogger(__name__)

UNSCHEDULABLE_RECHECK_S = 1.0  # safety net: longest wait while work exists but nothing was schedulable


class EngineState(str, enum.Enum):
    STARTING = "starting"  # loading weights / compiling: not ready
    READY = "ready"
    DRAINING = "draining"  # shutting down: in-flight requests finish, new ones are refused
    STOPPED = "stopped"
    DEAD = "dead"  # the engine raised; the process should be restarted


class EngineNotReadyError(RuntimeError):
    """The engine cannot take requests now: HTTP 503 + Retry-After, with the error ``code``
    "not_ready" (warming up) or "draining" (shutting down), as ``/health`` says."""

    def __init__(self, message: str, retry_after: float = 5.0, code: str = "not_ready"):
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.code = code


class EngineDeadError(RuntimeError):
    """The engine thread died.

    Attributes:
      in_flight: True for a request that was running or queued when the engine failed
        (HTTP 500: the server lost it); False for one refused afterwards (HTTP 503: retry
        on a restarted server).
    """

    def __init__(self, message: str, in_flight: bool = False):
        super().__init__(message)
        self.message = message
        self.in_flight = in_flight


class AsyncEngine:
    """Owns the engine thread and the command queue.

    Args:
      engine_or_builder: an engine (`jaxinfer.engine.protocol.Engine`: an `LLMEngine` or a
        data-parallel router), or a zero-argument callable returning one (called
        in the engine thread, so loading and warm-up do not block the event loop).
      log_requests: log one line per accepted and per finished request
        (`jaxinfer.engine.request_log`; ``--disable-log-requests`` turns it off).
    """

    def __init__(self, engine_or_builder: Engine | Callable[[], Engine], log_requests: bool = True):
        self.log_requests = log_requests
        if isinstance(engine_or_builder, Engine) or not callable(engine_or_builder):
            self._builder = lambda e=engine_or_builder: e
        else:
            self._builder = engine_or_builder
        self._ready_callbacks: list[Callable[[Engine], None]] | None = []  # None once run
        self.engine: Engine | None = None
        self.state = EngineState.STARTING
        self.error: str | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, OutputStream] = {}  # request id -> its group's stream (engine thread)
        self._lock = threading.Lock()  # orders "dead" against new commands
        self._thread = threading.Thread(target=self._run, name="jaxinfer-engine", daemon=True)
        self.ready_event = threading.Event()
        self.ttft = TTFTEstimator()  # fed by the engine thread; read by the HTTP layer
        self._death_callbacks: list[Callable[[str], None]] = []
        self._fault = StepFault.from_env()  # the JAXINFER_FAIL_STEP test hook (off unless set)

    # ----- lifecycle ----------------------------------------------------------------------
    def start(self) -> "AsyncEngine":
        """Start the engine thread (build, warm up, then serve); no-op if started. Returns self."""
        with self._lock:
            if self._thread.ident is None:
                self._thread.start()
        return self

    def add_ready_callback(self, fn: Callable[[Engine], None]) -> None:
        """Run ``fn(engine)`` in the engine thread once it is built (now, if it already is)."""
        with self._lock:
            if self._ready_callbacks is not None:
                self._ready_callbacks.append(fn)
                return
        if self.engine is not None:
            fn(self.engine)

    def add_death_callback(self, fn: Callable[[str], None]) -> None:
        """Run ``fn(error)`` (in the engine thread) when the engine dies, after every
        request has been failed; at once (in this thread) if it is already dead."""
        with self._lock:
            if self.state != EngineState.DEAD:
                self._death_callbacks.append(fn)
                return
        fn(self.error or "engine dead")

    @property
    def is_dead(self) -> bool:
        """True once the engine raised (or its thread exited while serving)."""
        return self.state == EngineState.DEAD or (self.state == EngineState.READY and not self._thread.is_alive())

    @property
    def is_healthy(self) -> bool:
        """True when ready to serve: warmed up, not draining, thread alive."""
        return self.state == EngineState.READY and self._thread.is_alive()

    def start_draining(self) -> None:
        """Refuse new requests from now on (HTTP 503); in-flight ones go on."""
        with self._lock:
            if self.state in (EngineState.READY, EngineState.STARTING):
                self.state = EngineState.DRAINING

    def num_in_flight(self) -> int:
        """Engine requests added and not yet finished (approximate; read across threads)."""
        return len(self._streams)

    def num_in_flight_groups(self) -> int:
        """Client requests (groups of engine requests, one per HTTP request) not yet finished
        (approximate; read across threads). What the SIGTERM drain reports."""
        return len({id(s) for s in self._streams.copy().values()})

    def shutdown(self, timeout: float = 10.0) -> None:
        """Abort whatever is still running, stop the thread and wait for it (seconds)."""
        self.start_draining()
        self._inbox.put(("stop", None))
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ----- requests (called on the event loop) --------------------------------------------
    async def add(self, specs: Sequence[RequestSpec]) -> OutputStream:
        """Add a group of engine requests atomically: all are admitted or none.

        Returns:
          the group's `OutputStream`.
        Raises:
          EngineNotReadyError: warming up or draining.
          EngineDeadError: the engine thread died.
          RequestError: a spec failed validation (no request was added).
          QueueFullError: the waiting queue has no room for the group (none was added).
        """
        stream = OutputStream([s.request_id for s in specs], asyncio.get_running_loop())
        with self._lock:
            self.check_accepting()
            max_model_len = self.engine.config.scheduler.max_model_len
            for s in specs:  # counted now: the engine thread takes the group only between two steps
                n = len(s.prompt_token_ids)
                self.ttft.on_handed(s.request_id, n, s.params.max_tokens or max(1, max_model_len - n))
            self._inbox.put(("add", (list(specs), stream)))
        try:
            verdict = await stream.queue.get()
        except asyncio.CancelledError:
            self.abort(stream.request_ids)
            raise
        if isinstance(verdict, BaseException):
            stream.failed = True
            raise verdict
        return stream

    def abort_all(self) -> None:
        """Abort every in-flight request (end of the SIGTERM grace period): their clients get
        503 / an error event instead of a cut connection. Thread-safe."""
        self._inbox.put(("abort_all", None))

    def fail(self, exc: BaseException) -> None:
        """Fail every request as if the engine had raised ``exc`` (the engine is dead
        afterwards); from any thread, also while the engine thread is blocked in a device
        call (a peer process of a multi-host run died). No-op once dead."""
        with self._lock:
            if self.state == EngineState.DEAD:
                return
        self._die(exc)

    def abort(self, request_ids: Sequence[str]) -> None:
        """Abort requests (client gone); applied before the engine's next step. Thread-safe."""
        if request_ids:
            self._inbox.put(("abort", list(request_ids)))

    async def generate(self, spec: RequestSpec) -> AsyncIterator[RequestOutput]:
        """Add one request and yield its cumulative outputs until it finishes.

        Aborts the request when the consumer stops early (cancellation, ``aclose``).
        """
        stream = await self.add([spec])
        try:
            while not stream.finished:
                for out in await stream.next_batch():
                    yield out
        finally:
            if not stream.finished:
                self.abort([spec.request_id])

    def check_accepting(self) -> None:
        """Raise unless new requests can be taken now.

        Raises:
          EngineDeadError: the engine thread died (or exited).
          EngineNotReadyError: still loading / compiling, or draining.
        """
        if self.is_dead:
            raise EngineDeadError(f"the engine is not running: {self.error or 'thread exited'}")
        if self.state == EngineState.STARTING:
            raise EngineNotReadyError("the model is loading and compiling; retry later", retry_after=5.0)
        if self.state != EngineState.READY:
            raise EngineNotReadyError("the server is shutting down", retry_after=10.0, code="draining")

    # ----- the engine thread --------------------------------------------------------------
    def _run(self) -> None:
        try:
            engine = self._builder()
            self.ttft.slots = engine.config.scheduler.max_num_seqs * engine.config.parallel.data_parallel_size
            self.ttft.full_tokens = engine.config.scheduler.max_num_batched_tokens
            with self._lock:
                self.engine = engine
                callbacks, self._ready_callbacks = self._ready_callbacks, None
            for fn in callbacks:
                fn(engine)
            with self._lock:
                if self.state == EngineState.STARTING:
                    self.state = EngineState.READY
            self.ready_event.set()
            logger.info("engine ready")
            self._loop()
            self.state = EngineState.STOPPED
        except BaseException as exc:  # noqa: BLE001 - any failure kills the engine; report it
            self._die(exc)

    def _loop(self) -> None:
        """Serve until a stop command: commands, one step, outputs; block when idle."""
        engine = self.engine
        while True:
            if not engine.has_unfinished_requests() and self._apply(self._inbox.get()):
                return  # idle: blocked until there was work
            while True:
                try:
                    cmd = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if self._apply(cmd):
                    return
            steps = engine.num_steps
            before = engine.snapshot()
            t0 = time.perf_counter()
            self._fault.before_step()
            outputs = engine.step()
            seconds = time.perf_counter() - t0
            self._deliver(outputs)
            if engine.num_steps != steps:
                after = engine.snapshot()
                self.ttft.on_step(seconds, after.prefill_tokens - before.prefill_tokens,
                                  max(before.num_running, after.num_running))
            if not outputs and engine.num_steps == steps and engine.has_unfinished_requests():
                if self._wait_for_deadline():  # nothing could run: wait for a command or a deadline
                    return

    def _apply(self, cmd) -> bool:
        """Apply one command in the engine thread. Returns True on stop."""
        kind, arg = cmd
        if kind == "add":
            self._add_group(arg)
        elif kind == "abort":
            for rid in arg:
                self.engine.abort_request(rid)
        elif kind == "abort_all":
            for rid in list(self._streams):
                self.engine.abort_request(rid)
        elif kind == "stop":
            for rid in list(self._streams):
                self.engine.abort_request(rid)
            self._deliver(self.engine.step() if self.engine.has_unfinished_requests() else [])
            return True
        return False

    def _add_group(self, group: tuple[list[RequestSpec], OutputStream]) -> None:
        """Admit a group all or none (`jaxinfer.engine.protocol.Engine.add_requests`); the
        stream gets the verdict first."""
        specs, stream = group
        try:
            self.engine.add_requests(specs)
        except (RequestError, QueueFullError) as exc:
            for spec in specs:
                self.ttft.on_dropped(spec.request_id)
            self._post([(stream, exc)])
            return
        except Exception as exc:  # a bug in admission fails this group (HTTP 500), not the engine thread
            logger.exception("adding requests %s failed", [spec.request_id for spec in specs])
            for spec in specs:
                self.engine.abort_request(spec.request_id)  # whatever part of the group got in
                self.ttft.on_dropped(spec.request_id)
            self._post([(stream, exc)])
            return
        for spec in specs:
            self._streams[spec.request_id] = stream
            self.ttft.on_added(spec.request_id, len(spec.prompt_token_ids), spec.params.max_tokens)
            if self.log_requests:
                request_log.log_added(spec.request_id, len(spec.prompt_token_ids), spec.params, spec.pooling)
        self._post([(stream, ACCEPTED)])

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        items = []
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            self.ttft.on_output(out.request_id, finished=out.finished)
            if out.finished:
                del self._streams[out.request_id]
                if self.log_requests:
                    request_log.log_finished(out)
            items.append((stream, out))
        self._post(items)

    def _post(self, items: list[tuple[OutputStream, object]]) -> None:
        """Hand items to their event loops: one ``call_soon_threadsafe`` per stream and batch."""
        by_stream: dict[int, tuple[OutputStream, list]] = {}
        for stream, item in items:
            by_stream.setdefault(id(stream), (stream, []))[1].append(item)
        for stream, batch in by_stream.values():
            try:
                stream.loop.call_soon_threadsafe(stream.put_batch, batch)
            except RuntimeError:  # its event loop is closed: nobody is listening
                for rid in stream.request_ids:
                    self.ttft.on_dropped(rid)
                    if self._streams.pop(rid, None) is not None:
                        self.engine.abort_request(rid)

    def _wait_for_deadline(self) -> bool:
        """Work exists but nothing was schedulable (the static scheduler collecting a batch):
        sleep until a command arrives, the batch is due, or the earliest request deadline,
        capped by `UNSCHEDULABLE_RECHECK_S`. True on stop."""
        wake = self.engine.wake_time()
        timeout = UNSCHEDULABLE_RECHECK_S if wake is None else min(UNSCHEDULABLE_RECHECK_S, wake - time.monotonic())
        try:
            cmd = self._inbox.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return False
        return self._apply(cmd)

    def _die(self, exc: BaseException) -> None:
        logger.error("engine thread died:\n%s", "".join(traceback.format_exception(exc)))
        with self._lock:
            self.state = EngineState.DEAD
            self.error = f"{type(exc).__name__}: {exc}"
        dead = EngineDeadError(f"the engine failed: {self.error}", in_flight=True)
        pending = [(s, dead) for s in {id(s): s for s in self._streams.values()}.values()]
        self._streams.clear()
        while True:  # answer adds that were queued before the state changed
            try:
                kind, arg = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                pending.append((arg[1], dead))
        self._post(pending)
        self.ready_event.set()
        with self._lock:
            callbacks, self._death_callbacks = self._death_callbacks, []
        for fn in callbacks:
            try:
                fn(self.error)
            except Exception:  # noqa: BLE001 - one failing callback must not skip the others
                logger.exception("engine death callback failed")

