"""``POST /v1/embeddings``: inputs -> pooling requests -> one vector each (OpenAI's response).

Served by a model started with ``--runner pooling`` (vLLM's name); any other model answers
400 naming the flag, and a pooling model answers the generation endpoints 400 the same way
(`require_runner`). The inputs of a request become one group of engine pooling requests
(`jaxinfer.engine.protocol.RequestSpec` with ``pooling``), admitted all or none through the same
queue, limits and 429s as generation (`jaxinfer.engine.admission`); each computes its prompt
only (chunked when longer than a step's token budget) and holds no KV block once it ends
(`jaxinfer.core.pooling`). A client that disconnects aborts the group (499). ``dimensions``
keeps the first values and normalizes again; ``encoding_format: base64`` sends each vector's
little-endian float32 bytes, base64-encoded, as OpenAI does.
"""
from __future__ import annotations

import asyncio
import base64
import time
import uuid

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse

from jaxinfer.entrypoints.openai import prompts as prompts_mod
from jaxinfer.entrypoints.openai.embedding_protocol import (MAX_INPUTS, Embedding, EmbeddingRequest,
                                                            EmbeddingResponse, EmbeddingUsage)
from jaxinfer.entrypoints.openai.errors import APIError, from_exception
from jaxinfer.engine.protocol import RequestSpec
from jaxinfer.errors import QueueFullError, RequestError
from jaxinfer.pooling_params import PoolingParams
from jaxinfer.sampling_params import SamplingParams

ALIASES = {"prompt": "input"}  # engine params as this endpoint names them


def require_runner(engine, runner: str) -> None:
    """Refuse a request for an endpoint of the other runner (vLLM answers such a request 400 too).

    Raises:
      APIError: 400 naming the flag the model would need.
    """
    have = engine.config.runner
    if have == runner:
        return
    if runner == "pooling":
        raise APIError(400, "this model does not serve embeddings: start the server with --runner pooling "
                       "for /v1/embeddings", param="model", code="model_not_supported")
    raise APIError(400, "this model serves embeddings (--runner pooling): use /v1/embeddings; completions and "
                   "chat completions need a server started with --runner generate", param="model",
                   code="model_not_supported")


def input_prompts(req: EmbeddingRequest, tokenizer) -> list[prompts_mod.Prompt]:
    """The inputs' prompts, in order, each truncated to ``truncate_prompt_tokens``.

    Raises:
      RequestError: no input, an empty input, more than `MAX_INPUTS`, text without a
        tokenizer (param ``input``).
    """
    x = req.input
    add = req.add_special_tokens is not False
    if isinstance(x, str):
        x = [x]
    if not x:
        raise RequestError("input must not be empty", param="input")
    if len(x) > MAX_INPUTS:
        raise RequestError(f"at most {MAX_INPUTS} inputs per request, got {len(x)}", param="input")
    if isinstance(x[0], int):
        x = [x]
    out = []
    for item in x:
        if isinstance(item, str):
            ids = prompts_mod.encode_text(tokenizer, item, add_special_tokens=add, param="input")
            p = prompts_mod.Prompt(ids, item)
        else:
            p = prompts_mod.Prompt(list(item))
        if not p.token_ids:
            raise RequestError("an input is empty (0 tokens)", param="input")
        keep = req.truncate_prompt_tokens
        if keep is not None and len(p.token_ids) > keep:
            p = prompts_mod.Prompt(p.token_ids[-keep:], None, len(p.token_ids) - keep)
        out.append(p)
    return out


def encode_vector(vec: np.ndarray, encoding_format: str) -> list[float] | str:
    """A vector as OpenAI sends it: a list of floats, or base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vec, "<f4").tobytes()).decode("ascii")
    return [float(v) for v in vec]


async def create_embedding(req: EmbeddingRequest, raw: Request, ctx):
    """``POST /v1/embeddings`` (``ctx``: the app's `jaxinfer.entrypoints.openai.serving.ServingContext`)."""
    received = time.monotonic()
    model = ctx.model(req.model)
    engine = ctx.engine(model)
    require_runner(engine, "pooling")
    rid = f"embd-{uuid.uuid4().hex}"
    specs = await _specs(req, engine, ctx.config, rid, received)
    outputs = await _run(specs, model, raw, ctx)
    fmt = req.encoding_format or "float"
    data = [Embedding(index=i, embedding=encode_vector(outputs[s.request_id].pooled.data, fmt))
            for i, s in enumerate(specs)]
    tokens = sum(len(s.prompt_token_ids) for s in specs)
    body = EmbeddingResponse(id=rid, created=int(time.time()), model=model.name, data=data,
                             usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens))
    return JSONResponse(body.model_dump())


async def _specs(req: EmbeddingRequest, engine, config, rid: str, received: float) -> list[RequestSpec]:
    """One pooling engine request per input (400 on anything invalid, before any engine work)."""
    try:
        pooling = PoolingParams(dimensions=req.dimensions, normalize=req.normalize)
        pooling.check(engine.model_config.hidden_size)
        prompts = await asyncio.to_thread(input_prompts, req, engine.tokenizer)  # off the event loop
        limit = engine.config.scheduler.max_queue_len
        if len(prompts) > limit:  # the engine's group bound, in this endpoint's words
            raise RequestError(f"this request has {len(prompts)} inputs; the server queues at most {limit} "
                               "(--max-queue-len)", param="input")
        params = SamplingParams(temperature=0.0, max_tokens=1, priority=req.priority or 0)  # orders it only
    except RequestError as exc:
        raise from_exception(exc, ALIASES) from exc
    timeout = req.request_timeout or config.request_timeout
    deadline = received + timeout if timeout else None
    return [RequestSpec(f"{rid}-{i}", p.token_ids, params, prompt=p.text, deadline=deadline,
                        max_queue_wait=config.queue_wait_expiry, arrival_time=received, pooling=pooling)
            for i, p in enumerate(prompts)]


async def _run(specs: list[RequestSpec], model, raw: Request, ctx) -> dict:
    """Add the group (all or none: 400 / 429) and wait for every output; a client that goes away
    aborts the group."""
    from jaxinfer.entrypoints.openai import serving  # the shared admission and collection helpers

    ae = model.async_engine
    try:
        serving._check_wait(ae, specs, ctx.config)
        stream = await ae.add(specs)
    except QueueFullError as exc:  # 429, counted and with Retry-After as for generation
        ctx.metrics.reject("queue_full", model.name)
        exc.retry_after = max(exc.retry_after, ctx.config.retry_after)
        raise from_exception(exc) from exc
    except Exception as exc:
        raise from_exception(exc, ALIASES) from exc
    abort = lambda: ae.abort(sorted(stream.unfinished))  # noqa: E731
    try:
        async with serving.abort_on_disconnect(raw, abort) as gone:
            return await serving._collect_unless_gone(stream, ctx, model, gone)
    except BaseException:
        abort()
        raise
