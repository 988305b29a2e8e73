"""One generation request end to end: prompts -> engine requests -> JSON or SSE.

Owns the request lifecycle on the asyncio side:
  1. Model lookup (404 ``model_not_found``) and readiness (503), prompt preparation and
     truncation, `SamplingParams` (400 on any invalid field, before any engine work);
     then graceful degradation (`jaxinfer.entrypoints.openai.degrade`) may move the request to the
     fallback model, whose tokenizer prepares it again.
  2. Fan-out: ``n`` choices per prompt become independent engine requests (seeds
     ``seed + i``), added as one group (all admitted or none: 400 / 429).
  3. While the client waits, a watcher blocks on the ASGI ``receive`` channel; a
     disconnect aborts every unfinished request of the group before the engine's next step
     (non-streaming and streaming alike, SC-14 / SC-17).
  4. Non-streaming: wait for all choices; ``timeout`` -> 504, ``rejected`` -> 429.
     Streaming: the HTTP status is decided when the first output arrives (so a 429 / 504
     while queued is a status, not an in-stream error); then one ``data:`` event per
     choice delta, each choice's finish chunk, an optional usage chunk, ``data: [DONE]``.
     A deadline or engine failure mid-stream sends one error event, then ``[DONE]``.
`run_chat` is the chat path with the answer's shape left to the caller: `/v1/responses`
(`jaxinfer.entrypoints.openai.responses_api`) runs its requests through it as chat requests.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import math
import time
import uuid
from typing import AsyncIterator, Awaitable, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from jaxinfer.engine import admission
from jaxinfer.entrypoints.openai import degrade
from jaxinfer.entrypoints.openai import params as params_mod
from jaxinfer.entrypoints.openai import prompts as prompts_mod
from jaxinfer.entrypoints.openai.config import ServerConfig
from jaxinfer.entrypoints.openai.embeddings import require_runner
from jaxinfer.entrypoints.openai.errors import APIError, client_closed_error, from_exception, queue_wait_error, timeout_error
from jaxinfer.entrypoints.openai.metrics import Metrics
from jaxinfer.entrypoints.openai.model_registry import ModelRegistry, ServedModel
from jaxinfer.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest, PromptTokensDetails, Usage,
                                                  _GenerationRequest)
from jaxinfer.entrypoints.openai.responses import ChatFormat, ChoiceCursor, CompletionFormat, usage
from jaxinfer.entrypoints.openai.responses_store import ResponseStore
from jaxinfer.engine.async_engine import AsyncEngine, EngineNotReadyError, RequestSpec
from jaxinfer.engine.output_stream import OutputStream
from jaxinfer.errors import QueueFullError
from jaxinfer.outputs import RequestOutput
from jaxinfer.reasoning import PROMPT_TAIL_TOKENS, get_parser
from jaxinfer.sampling_params import SamplingParams, choice_seed

logger = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclasses.dataclass
class ServingContext:
    """What the handlers share (one per app): the served models, settings, metrics, and the
    store of `/v1/responses` objects."""

    models: ModelRegistry
    config: ServerConfig
    metrics: Metrics
    responses: ResponseStore = dataclasses.field(default_factory=ResponseStore)
    started: int = dataclasses.field(default_factory=lambda: int(time.time()))  # unix seconds

    @property
    def async_engine(self) -> AsyncEngine:
        """The default (first) model's engine front end."""
        return self.models.default.async_engine

    def model(self, name: str | None) -> ServedModel:
        """The served model named ``name`` (the default for None).

        Raises:
          APIError: 404 ``model_not_found`` for a name not served.
        """
        return self.models.get(name)

    def engine(self, model: ServedModel | None = None):
        """The engine of ``model`` (default: the default model), once ready.

        Raises:
          EngineNotReadyError / EngineDeadError: warming up, draining, dead (503).
        """
        model = model or self.models.default
        try:
            model.async_engine.check_accepting()
        except EngineNotReadyError:
            self.metrics.reject("not_ready", model.name)
            raise
        return model.async_engine.engine


JobOn = Callable[[ServedModel], Awaitable["_Job"]]  # prepares a request for a given model


@dataclasses.dataclass
class _Job:
    """One HTTP generation request after preparation."""

    request: _GenerationRequest
    prompts: list[prompts_mod.Prompt]
    params: SamplingParams
    fmt: CompletionFormat | ChatFormat
    aliases: dict[str, str]
    default_max_tokens: int | None  # when the request gives none (completions: 16)
    max_model_len: int
    model: ServedModel  # the model that answers
    received: float  # time.monotonic() when the handler started: the engine requests' arrival_time
    reasoning_modes: list[str | None] | None = None  # per prompt: where its output starts (`jaxinfer.reasoning`)


async def create_completion(req: CompletionRequest, raw: Request, ctx: ServingContext):
    """``POST /v1/completions``."""
    received = time.monotonic()
    aliases = dict(params_mod.COMPLETION_ALIASES, **params_mod.structured_aliases(req))
    default = params_mod.COMPLETIONS_DEFAULT_MAX_TOKENS

    async def job_on(model: ServedModel) -> _Job:
        engine = ctx.engine(model)
        require_runner(engine, "generate")

        def prepare():  # tokenizing a long prompt must not stall the event loop: run in a thread
            with _as_api_error(aliases):
                params = params_mod.completion_params(req)
                _compile_grammar(engine, params)
                prompts = prompts_mod.completion_prompts(req, engine.tokenizer)
                modes = [_reasoning_mode(engine, p) for p in prompts]
                for mode in set(modes):
                    _compile_grammar(engine, params_mod.with_reasoning(params, mode))
                return params, [_truncate(p, req, params.max_tokens or default, engine, ctx.config)
                                for p in prompts], modes

        params, prompts, modes = await asyncio.to_thread(prepare)
        fmt = CompletionFormat(f"cmpl-{uuid.uuid4().hex}", model.name, int(time.time()), params.logprobs,
                               engine.tokenizer, echo=bool(req.echo), echo_only=params_mod.echo_only(req))
        return _Job(req, prompts, params, fmt, aliases, default, _max_model_len(engine), model, received, modes)

    return await _run(await job_on(ctx.model(req.model)), job_on, raw, ctx, chat=False)


async def create_chat_completion(req: ChatCompletionRequest, raw: Request, ctx: ServingContext):
    """``POST /v1/chat/completions``."""
    def make_fmt(model: ServedModel, engine, params: SamplingParams, mode: str | None) -> ChatFormat:
        return ChatFormat(f"chatcmpl-{uuid.uuid4().hex}", model.name, int(time.time()), params.logprobs,
                          engine.tokenizer, parse_tools=params_mod.tool_mode(req) != "none",
                          max_calls=1 if params_mod.single_call(req) else None,
                          reasoning=get_parser(engine.config.reasoning_parser), reasoning_mode=mode,
                          include_reasoning=req.include_reasoning is not False)

    return await run_chat(req, raw, ctx, aliases=params_mod.chat_aliases(req), make_fmt=make_fmt)


# (model, engine, params, reasoning mode: `jaxinfer.reasoning`, None without a parser) -> a format
MakeFormat = Callable[[ServedModel, object, SamplingParams, "str | None"], object]
StreamWriter = Callable[..., AsyncIterator[str]]  # (job, stream, first outputs, index, raw, ctx) -> SSE text


async def run_chat(req: ChatCompletionRequest, raw: Request, ctx: ServingContext, *, aliases: dict[str, str],
                   make_fmt: MakeFormat, sse: StreamWriter | None = None):
    """A chat request through the whole path (prompt, params, grammar, admission, degradation,
    disconnects); the answer is built by the format ``make_fmt`` returns (``response`` for
    JSON, or, when streamed, by ``sse``, default: chat chunks). `/v1/responses` enters here
    with its own format, stream writer and error-field ``aliases``."""
    received = time.monotonic()

    async def job_on(model: ServedModel) -> _Job:
        engine = ctx.engine(model)
        require_runner(engine, "generate")

        def prepare():  # template rendering and tokenizing run in a thread, as for completions
            with _as_api_error(aliases):
                params = params_mod.chat_params(req)
                _compile_grammar(engine, params)
                prompt = prompts_mod.chat_prompt(req, engine.tokenizer,
                                                 parse_special=ctx.config.parse_special_tokens_in_messages)
                mode = _reasoning_mode(engine, prompt, req.chat_template_kwargs)
                _compile_grammar(engine, params_mod.with_reasoning(params, mode))
                return params, [_truncate(prompt, req, params.max_tokens, engine, ctx.config)], mode

        params, prompts, mode = await asyncio.to_thread(prepare)
        fmt = make_fmt(model, engine, params, mode)
        return _Job(req, prompts, params, fmt, aliases, None, _max_model_len(engine), model, received, [mode])

    return await _run(await job_on(ctx.model(req.model)), job_on, raw, ctx, chat=True, sse=sse)


async def _admit(job: _Job, job_on: JobOn, ctx: ServingContext, *,
                 chat: bool) -> tuple[_Job, list[RequestSpec], OutputStream]:
    """Add the request's engine requests to its model, or to the fallback model when
    degradation moves it there: before adding when the TTFT estimate exceeds the SLO
    (`degrade.choose`), or when the model's waiting queue turns out full (instead of a 429).
    A request moved to a fallback whose queue is full goes back to its own model's queue:
    a fallback never turns away a request that its model alone would have queued.

    Returns:
      (the job as served, its engine requests, their stream).
    Raises:
      APIError: 429 (the queue of every model it may go to is full), 400 (refused by the
        engine), 503.
    """
    requested = job.model
    allow = job.request.allow_fallback is not False
    tokens = sum(len(p.token_ids) for p in job.prompts) * job.params.n
    target = degrade.choose(ctx.models, requested, tokens, allow_fallback=allow, chat=chat)
    fallback = degrade.fallback_for(ctx.models, requested, allow_fallback=allow, chat=chat)
    order = [target] + [m for m in (requested, fallback) if m is not None and m is not target]
    for i, model in enumerate(order):
        candidate = job
        if model is not requested:
            # counted on the fallback while its tokenizer prepares the request (an await), so the
            # rest of a burst sees it there; released just before `_add` counts it for real
            with degrade.holding(model, f"{job.fmt.id}-moving", tokens, job.params.max_tokens):
                candidate = await job_on(model)
        try:
            added = await _add(candidate, ctx)
        except QueueFullError as exc:
            if i + 1 == len(order):
                raise _queue_full_error(exc, candidate, ctx) from exc
            continue
        if model is not requested:
            ctx.metrics.count_degraded(requested.name, model.name)
            logger.debug("%s: %s -> fallback %s", job.fmt.id, requested.name, model.name)
        return added
    raise AssertionError("unreachable: the last model's QueueFullError is raised")


async def _add(job: _Job, ctx: ServingContext) -> tuple[_Job, list[RequestSpec], OutputStream]:
    """Add the job's engine requests to its model (`QueueFullError` passes through: the
    model's queue is full, or the estimated wait for a slot exceeds ``--max-queue-wait``)."""
    specs = _specs(job, ctx.config)
    _check_wait(job.model.async_engine, specs, ctx.config)
    try:
        return job, specs, await job.model.async_engine.add(specs)
    except QueueFullError:
        raise
    except Exception as exc:
        raise from_exception(exc, job.aliases) from exc


def _check_wait(ae: AsyncEngine, specs: list[RequestSpec], config: ServerConfig) -> None:
    """The queue-wait bound, on the estimate before the group is handed over (no await
    between this and `AsyncEngine.add` counting the group, so a burst sees itself).

    Raises:
      QueueFullError: the estimated wait for the group's slots exceeds ``max_queue_wait``.
    """
    ttft = getattr(ae, "ttft", None)
    if ttft is None or config.max_queue_wait is None:
        return
    longest = max((s.params.max_tokens or math.inf for s in specs), default=math.inf)
    admission.check_wait(ttft.queue_wait(len(specs), longest), config.max_queue_wait)


def _queue_full_error(exc: QueueFullError, job: _Job, ctx: ServingContext) -> APIError:
    ctx.metrics.reject("queue_full", job.model.name)
    exc.retry_after = max(exc.retry_after, ctx.config.retry_after)
    return from_exception(exc)


def _compile_grammar(engine, params: SamplingParams) -> None:
    """Compile a structured-output constraint here, in the request's worker thread, so the
    engine thread finds it in the grammar cache (a complex schema takes milliseconds to
    seconds); an invalid one is a 400 before the engine sees the request."""
    if params.structured_outputs is not None:
        engine.grammar_engine().matcher(params.structured_outputs)


def _reasoning_mode(engine, prompt: prompts_mod.Prompt, template_kwargs: dict | None = None) -> str | None:
    """The reasoning mode ``prompt`` leaves its output in (`jaxinfer.reasoning.ReasoningParser.start_mode`),
    or None without ``--reasoning-parser``. A token-id prompt is read from its decoded end."""
    parser = get_parser(engine.config.reasoning_parser)
    if parser is None:
        return None
    text = prompt.text
    if text is None and engine.tokenizer is not None:
        text = engine.tokenizer.decode(prompt.token_ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
    return parser.start_mode(text, template_kwargs)


def _max_model_len(engine) -> int:
    return engine.config.scheduler.max_model_len


def _truncate(prompt, req: _GenerationRequest, max_tokens: int | None, engine, config: ServerConfig):
    return prompts_mod.truncate(prompt, keep=req.truncate_prompt_tokens, max_model_len=_max_model_len(engine),
                                max_tokens=max_tokens, truncate_left=config.truncate_prompt == "left")


@contextlib.contextmanager
def _as_api_error(aliases: dict[str, str]):
    try:
        yield
    except APIError:
        raise
    except Exception as exc:  # RequestError and friends
        raise from_exception(exc, aliases) from exc


def _specs(job: _Job, config: ServerConfig) -> list[RequestSpec]:
    """``n`` engine requests per prompt, in choice order (choice index = position)."""
    timeout = job.request.request_timeout or config.request_timeout
    deadline = time.monotonic() + timeout if timeout else None
    base = job.fmt.id
    n = job.params.n
    out = []
    modes = job.reasoning_modes or [None] * len(job.prompts)
    for i, ((p, mode), j) in enumerate(itertools.product(zip(job.prompts, modes), range(n))):
        max_tokens = params_mod.default_max_tokens(job.params.max_tokens, job.default_max_tokens,
                                                   len(p.token_ids), job.max_model_len)
        seed = job.params.seed if n == 1 else choice_seed(job.params.seed, j)
        params = dataclasses.replace(params_mod.with_reasoning(job.params, mode), n=1, seed=seed,
                                     max_tokens=max_tokens)
        out.append(RequestSpec(f"{base}-{i}", p.token_ids, params, prompt=p.text, deadline=deadline,
                               max_queue_wait=config.queue_wait_expiry, arrival_time=job.received))
    return out


async def _run(job: _Job, job_on: JobOn, raw: Request, ctx: ServingContext, *, chat: bool,
               sse: StreamWriter | None = None):
    job, specs, stream = await _admit(job, job_on, ctx, chat=chat)
    ae = job.model.async_engine
    index = {s.request_id: i for i, s in enumerate(specs)}
    abort = lambda: ae.abort(sorted(stream.unfinished))  # noqa: E731
    served_by = {degrade.SERVED_BY_HEADER: job.model.name}
    try:
        async with abort_on_disconnect(raw, abort) as gone:
            if not job.request.stream:
                outputs = await _collect_unless_gone(stream, ctx, job.model, gone)
                return JSONResponse(job.fmt.response([outputs[s.request_id] for s in specs], _lengths(job)),
                                    headers=served_by)
            first = await _first_outputs(stream, ctx, job)
    except BaseException:
        abort()
        raise
    return StreamingResponse((sse or _sse)(job, stream, first, index, raw, ctx), media_type="text/event-stream",
                             headers={**SSE_HEADERS, **served_by})


def _lengths(job: _Job) -> list[int]:
    return [len(p.token_ids) for p in job.prompts]


async def _collect(stream: OutputStream, ctx: ServingContext, model: ServedModel) -> dict[str, RequestOutput]:
    """Wait until every request of the group ended; raise the HTTP error if one failed."""
    final: dict[str, RequestOutput] = {}
    while not stream.finished:
        try:
            batch = await stream.next_batch()
        except Exception as exc:
            raise from_exception(exc) from exc
        for out in batch:
            if out.finished:
                _check_failure(out, ctx, stream, model)
                ctx.metrics.observe_finished(out, model.name)
                final[out.request_id] = out
    return final


async def _collect_unless_gone(stream: OutputStream, ctx: ServingContext, model: ServedModel,
                               gone: asyncio.Event) -> dict[str, RequestOutput]:
    """`_collect`; but a group aborted because its client disconnected ends as a 499, not as
    the 503 of an abort, so that ``jaxinfer_http_error_responses_total`` does not count a
    client's leaving as a server failure."""
    try:
        return await _collect(stream, ctx, model)
    except APIError:
        if gone.is_set():
            raise client_closed_error() from None
        raise


async def _first_outputs(stream: OutputStream, ctx: ServingContext, job: _Job) -> list[RequestOutput]:
    """The first batch of a stream; raises (so the status is 429 / 504) if it is a failure."""
    try:
        batch = await stream.next_batch()
    except Exception as exc:
        raise from_exception(exc) from exc
    for out in batch:
        if out.finished:
            _check_failure(out, ctx, stream, job.model)
    return batch


def _check_failure(out: RequestOutput, ctx: ServingContext, stream: OutputStream, model: ServedModel) -> None:
    reason = out.outputs[0].finish_reason
    if reason in ("stop", "length"):
        return
    model.async_engine.abort(sorted(stream.unfinished))
    raise _failure_error(reason, ctx, model)


def _retry_after(ctx: ServingContext, model: ServedModel) -> float:
    """``Retry-After`` for a 429: the waiting queue's drain time at the engine's measured
    admission rate (`jaxinfer.engine.drain_rate`), never below ``config.retry_after``."""
    engine = model.async_engine.engine
    measured = engine.snapshot().retry_after_s if engine is not None else 0.0
    return max(measured, ctx.config.retry_after)


def _failure_error(reason: str, ctx: ServingContext, model: ServedModel) -> APIError:
    if reason == "timeout":
        return timeout_error(None)
    if reason == "rejected":
        ctx.metrics.reject("queue_wait_expired", model.name)
        return queue_wait_error(ctx.config.queue_wait_expiry, _retry_after(ctx, model))
    if reason == "failed":  # preparing its step raised on the host; the engine goes on (docs/api.md)
        return APIError(500, "the server failed to prepare the engine step of this request (nothing reached the "
                        "device; other requests go on): retry it", type="server_error", code="step_failed")
    if reason == "error":  # the static-batching baseline could not reserve max_model_len of KV
        return APIError(503, "the KV cache cannot hold this request's max_model_len reservation (static batching)",
                        code="kv_cache_exhausted", retry_after=ctx.config.retry_after)
    return APIError(503, "the request was aborted (client disconnected or server shutting down)",
                    code="aborted", retry_after=ctx.config.retry_after)


async def _sse(job: _Job, stream: OutputStream, first: list[RequestOutput], index: dict[str, int], raw: Request,
               ctx: ServingContext) -> AsyncIterator[str]:
    """The event stream: deltas per choice, finish chunks, usage, ``[DONE]``."""
    abort = lambda: job.model.async_engine.abort(sorted(stream.unfinished))  # noqa: E731
    cursors = [ChoiceCursor() for _ in index]
    final: dict[str, RequestOutput] = {}
    live = _live_usage(job) if job.request.continuous_usage else None
    try:
        async with abort_on_disconnect(raw, abort):
            for chunk in job.fmt.first_chunks(len(index), [live(i, None) for i in range(len(index))] if live else None):
                yield _event(chunk)
            batch = first
            while True:
                for out in batch:
                    error = stream_failure(out, ctx, job.model)
                    if error is not None:
                        abort()
                        yield _event(json.dumps(error.body()))
                        yield _event("[DONE]")
                        return
                    i = index[out.request_id]
                    chunk = job.fmt.delta_chunk(i, out, cursors[i], live(i, out) if live else None)
                    if chunk is not None:
                        yield _event(chunk)
                    if out.finished:
                        ctx.metrics.observe_finished(out, job.model.name)
                        final[out.request_id] = out
                if stream.finished:
                    break
                try:
                    batch = await stream.next_batch()
                except Exception as exc:
                    yield _event(json.dumps(from_exception(exc).body()))
                    yield _event("[DONE]")
                    return
            if job.request.include_usage:
                outs = [final[rid] for rid in sorted(final, key=index.get)]
                yield _event(job.fmt.usage_chunk(usage(_lengths(job), outs)))
            yield _event("[DONE]")
    finally:
        if not stream.finished:
            abort()


def _live_usage(job: _Job) -> Callable[[int, RequestOutput | None], Usage]:
    """``stream_options.continuous_usage_stats``: the usage a chunk of choice ``i`` carries
    (vLLM's): its prompt's tokens and the choice's completion tokens so far (0 before its
    first output)."""
    lengths, n = _lengths(job), job.params.n

    def live(i: int, out: RequestOutput | None) -> Usage:
        prompt = lengths[i // n]
        done = len(out.outputs[0].token_ids) if out is not None else 0
        cached = out.num_cached_tokens if out is not None else 0
        return Usage(prompt_tokens=prompt, completion_tokens=done, total_tokens=prompt + done,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))
    return live


def stream_failure(out: RequestOutput, ctx: ServingContext, model: ServedModel) -> APIError | None:
    """The error a stream reports for ``out`` (a deadline, an abort, ...), or None (still
    running, or finished by ``stop`` / ``length``)."""
    reason = out.outputs[0].finish_reason
    if reason is None or reason in ("stop", "length"):
        return None
    return _failure_error(reason, ctx, model)


def _event(data: str) -> str:
    return f"data: {data}\n\n"


@contextlib.asynccontextmanager
async def abort_on_disconnect(raw: Request, abort: Callable[[], None]):
    """While the body runs, a task blocks on the ASGI ``receive`` channel (the request body
    has been read, so the next message is ``http.disconnect``) and calls ``abort`` when the
    client goes away. No polling. Yields an `asyncio.Event`, set (before ``abort``) once the
    client has gone."""
    gone = asyncio.Event()

    async def watch() -> None:
        while True:
            message = await raw.receive()
            if message["type"] == "http.disconnect":
                gone.set()
                abort()
                return

    task = asyncio.create_task(watch())
    try:
        yield gone
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
