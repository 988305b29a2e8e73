"""The HTTP endpoints (thin: each delegates to `serving` or reads the engine).

``/v1/*`` (and ``/tokenize``, ``/detokenize``) need ``Authorization: Bearer <key>`` when the
server has an API key; ``/live``, ``/health`` and ``/metrics`` never do. ``/live`` is 200 as
soon as HTTP listens, 503 once an engine died (the fault policy: the process exits soon);
``/health`` is 200 only when every served model's engine is warmed up and its thread alive
(503 + Retry-After while one is loading, draining or dead).
"""
from __future__ import annotations

import asyncio
import secrets
from typing import Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from jaxinfer.entrypoints.openai import prompts as prompts_mod
from jaxinfer.entrypoints.openai import embeddings as embeddings_mod
from jaxinfer.entrypoints.openai import responses_api, serving
from jaxinfer.entrypoints.openai.embedding_protocol import EmbeddingRequest, EmbeddingResponse
from jaxinfer.entrypoints.openai.errors import APIError, from_exception
from jaxinfer.entrypoints.openai.model_registry import ServedModel
from jaxinfer.entrypoints.openai.protocol import (ChatCompletionRequest, ChatCompletionResponse, CompletionRequest,
                                   CompletionResponse, DetokenizeRequest, DetokenizeResponse, ErrorResponse,
                                   ModelCard, ModelList, TokenizeRequest, TokenizeResponse)
from jaxinfer.entrypoints.openai.responses_items import DEFAULT_LIMIT, MAX_LIMIT
from jaxinfer.entrypoints.openai.responses_protocol import (ResponseDeleted, ResponseItemList, ResponseObject,
                                                            ResponsesRequest)
from jaxinfer.entrypoints.openai.serving import ServingContext
from jaxinfer.engine.async_engine import EngineState
from jaxinfer.errors import RequestError

_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <--api-key>` (only when set).")

_ERRORS = {status: {"model": ErrorResponse, "description": why} for status, why in {
    400: "Invalid request (OpenAI error envelope, `param` names the field).",
    401: "Missing or wrong API key.",
    404: "Unknown model (or, for /v1/responses, unknown stored response).",
    429: "Overloaded: waiting queue full or queue wait expired (`Retry-After`).",
    503: "Warming up, draining or engine down (`Retry-After`).",
    504: "The request passed its deadline (`request_timeout`).",
}.items()}


def get_ctx(request: Request) -> ServingContext:
    return request.app.state.ctx


def require_api_key(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
    """401 unless the bearer token equals the server's API key (no key configured: open)."""
    key = get_ctx(request).config.api_key
    if key is None:
        return
    if creds is None or not secrets.compare_digest(creds.credentials.encode(), key.encode()):
        raise APIError(401, "invalid or missing API key (Authorization: Bearer <key>)", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})


v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)], responses=_ERRORS)
debug = APIRouter(dependencies=[Depends(require_api_key)], responses=_ERRORS, tags=["debug"])
ops = APIRouter(tags=["operations"])


@v1.post("/completions", response_model=CompletionResponse,
         responses={200: {"content": {"text/event-stream": {}},
                          "description": "JSON, or with `stream: true` server-sent `text_completion` chunks."}})
async def completions(body: CompletionRequest, raw: Request, ctx: ServingContext = Depends(get_ctx)):
    """OpenAI completions (text, texts, token ids or lists of token ids)."""
    return await serving.create_completion(body, raw, ctx)


@v1.post("/chat/completions", response_model=ChatCompletionResponse,
         responses={200: {"content": {"text/event-stream": {}},
                          "description": "JSON, or with `stream: true` server-sent `chat.completion.chunk`s."}})
async def chat_completions(body: ChatCompletionRequest, raw: Request, ctx: ServingContext = Depends(get_ctx)):
    """OpenAI chat completions (the model's chat template renders the messages)."""
    return await serving.create_chat_completion(body, raw, ctx)


@v1.post("/embeddings", response_model=EmbeddingResponse)
async def embeddings(body: EmbeddingRequest, raw: Request, ctx: ServingContext = Depends(get_ctx)):
    """OpenAI embeddings (a model served with `--runner pooling`; others answer 400)."""
    return await embeddings_mod.create_embedding(body, raw, ctx)


@v1.post("/responses", response_model=ResponseObject,
         responses={200: {"content": {"text/event-stream": {}},
                          "description": "A response object, or with `stream: true` typed server-sent events "
                                         "(`response.created` ... `response.completed`)."}})
async def create_response(body: ResponsesRequest, raw: Request, ctx: ServingContext = Depends(get_ctx)):
    """OpenAI Responses API (text, function tools, JSON output, stored responses), run by the
    chat path. Unsupported fields (built-in tools, `background`, ...) are a 400 naming them."""
    return await responses_api.create_response(body, raw, ctx)


@v1.get("/responses/{response_id}", response_model=ResponseObject)
async def retrieve_response(response_id: str, stream: bool | None = None, ctx: ServingContext = Depends(get_ctx)):
    """A stored response (404 once evicted, deleted or after a restart). ``stream=true`` (replaying
    a background response's events) is a 400: responses are never run in the background."""
    if stream:
        raise APIError(400, "stream is not supported when retrieving a response (there are no background "
                       "responses to follow)", param="stream")
    return JSONResponse(responses_api.retrieve_response(response_id, ctx))


@v1.get("/responses/{response_id}/input_items", response_model=ResponseItemList)
async def list_input_items(response_id: str, limit: int = Query(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT),
                           order: Literal["asc", "desc"] = "desc", after: str | None = None,
                           before: str | None = None, include: list[str] | None = Query(None),
                           include_brackets: list[str] | None = Query(None, alias="include[]",
                                                                      description="`include` as the SDK sends it."),
                           ctx: ServingContext = Depends(get_ctx)):
    """The input items of a stored response (its whole conversation, oldest first before
    ``order``), as a cursor page; 404 once evicted, deleted or after a restart."""
    return JSONResponse(responses_api.list_input_items(response_id, ctx, limit=limit, order=order, after=after,
                                                       before=before, include=(include or []) + (include_brackets or [])))


@v1.delete("/responses/{response_id}", response_model=ResponseDeleted)
async def delete_response(response_id: str, ctx: ServingContext = Depends(get_ctx)):
    """Forget a stored response (404 if not stored)."""
    return responses_api.delete_response(response_id, ctx)


def _model_card(ctx: ServingContext, model: ServedModel) -> ModelCard:
    engine = model.async_engine.engine
    loaded = engine is not None
    return ModelCard(id=model.name, created=ctx.started,
                     max_model_len=engine.config.scheduler.max_model_len if loaded else None,
                     kv_cache_memory=model.kv_cache_memory,
                     kv_blocks=engine.snapshot().kv_blocks_total if loaded else None,
                     fallback=model.name == ctx.models.fallback)


@v1.get("/models", response_model=ModelList)
async def models(ctx: ServingContext = Depends(get_ctx)):
    """The served models (the default one first)."""
    return ModelList(data=[_model_card(ctx, m) for m in ctx.models])


@v1.get("/models/{model_id:path}", response_model=ModelCard)
async def model(model_id: str, ctx: ServingContext = Depends(get_ctx)):
    """One model (``client.models.retrieve``); 404 for a name not served."""
    return _model_card(ctx, ctx.model(model_id))


@debug.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(body: TokenizeRequest, ctx: ServingContext = Depends(get_ctx)):
    """The prompt token ids the engine would see for `prompt` (text or ids) or chat `messages`
    with the chat request's template inputs (`tools`, `tool_choice`, `chat_template_kwargs`,
    `add_generation_prompt`, `continue_final_message`); no truncation applied."""
    engine = ctx.engine(ctx.model(body.model))
    try:
        if (body.prompt is None) == (body.messages is None):
            raise RequestError("give exactly one of prompt or messages", param="prompt")
        if body.messages is not None:
            ids = (await asyncio.to_thread(prompts_mod.chat_prompt, body, engine.tokenizer,
                                           parse_special=ctx.config.parse_special_tokens_in_messages)).token_ids
        elif isinstance(body.prompt, str):
            ids = await asyncio.to_thread(prompts_mod.encode_text, engine.tokenizer, body.prompt,
                                          add_special_tokens=body.add_special_tokens is not False)
        else:
            ids = list(body.prompt)
            vocab = engine.model_config.vocab_size
            if any(not 0 <= t < vocab for t in ids):  # the same rule generation applies
                raise RequestError(f"token ids must be in [0, {vocab})", param="prompt")
    except RequestError as exc:
        raise from_exception(exc) from exc
    return TokenizeResponse(tokens=ids, count=len(ids), max_model_len=engine.config.scheduler.max_model_len)


@debug.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(body: DetokenizeRequest, ctx: ServingContext = Depends(get_ctx)):
    """The text of token ids (special tokens kept)."""
    engine = ctx.engine(ctx.model(body.model))
    V = engine.model_config.vocab_size
    if engine.tokenizer is None:
        raise APIError(400, "this model has no tokenizer", param="tokens")
    if any(not 0 <= t < min(V, engine.tokenizer.vocab_size) for t in body.tokens):
        raise APIError(400, f"token ids must be in [0, {V})", param="tokens")
    return DetokenizeResponse(prompt=engine.tokenizer.decode(body.tokens, skip_special_tokens=False))


@ops.get("/live", responses={503: {"model": ErrorResponse, "description": "An engine died; the process exits."}})
async def live(ctx: ServingContext = Depends(get_ctx)):
    """Liveness: 200 while the HTTP server runs (warming up included), 503 once an engine
    died (a step raised: docs/api.md's fault policy; the process exits within seconds)."""
    dead = ctx.models.dead()
    if not dead:
        return {"status": "alive"}
    ae = dead[0].async_engine
    return JSONResponse(APIError(503, f"engine dead: {ae.error or 'thread exited'}", code="engine_dead").body(),
                        status_code=503)


@ops.get("/health", responses={503: {"model": ErrorResponse, "description": "Not ready (`Retry-After`)."}})
async def health(ctx: ServingContext = Depends(get_ctx)):
    """Readiness: 200 once every model's weights are loaded and every bucket compiled, while
    serving; otherwise 503 naming the first model that is not ready (with several models)."""
    waiting = ctx.models.not_ready()
    if not waiting:
        return {"status": "ready"}
    m = waiting[0]
    ae = m.async_engine
    state = ae.state.value if ae.state != EngineState.READY else "dead"
    retry = 5 if ae.state == EngineState.STARTING else 10
    which = f" ({m.name})" if len(ctx.models) > 1 else ""
    return JSONResponse(APIError(503, f"not ready{which}: {state}" + (f" ({ae.error})" if ae.error else ""),
                                 code=state).body(), status_code=503, headers={"Retry-After": str(retry)})


@ops.get("/metrics")
async def metrics(ctx: ServingContext = Depends(get_ctx)):
    """Prometheus text format."""
    body, content_type = ctx.metrics.render()
    return Response(body, media_type=content_type)
