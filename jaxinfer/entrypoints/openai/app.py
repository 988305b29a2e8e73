"""`create_app`: the FastAPI application of one server (routes, errors, metrics, lifespan).

The app owns nothing global: its metrics registry, config and engine handles live on
``app.state``, so tests can run several apps in one process. It serves one model (an
`AsyncEngine`) or several (a `ModelRegistry`, one engine each). The lifespan starts the
engine threads if nobody did (loading and warm-up then run in the background while HTTP
already answers ``/live``) and shuts them down on exit. Probes (``/health``, ``/live``) are kept out
of the access log (`jaxinfer.entrypoints.openai.access_log`).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import FastAPI

from jaxinfer.entrypoints.openai import routes
from jaxinfer.entrypoints.openai.access_log import install_probe_filter
from jaxinfer.entrypoints.openai.body_limit import BodySizeLimit
from jaxinfer.entrypoints.openai.config import ServerConfig
from jaxinfer.entrypoints.openai.errors import install_error_handlers
from jaxinfer.entrypoints.openai.instance_header import InstanceHeader
from jaxinfer.entrypoints.openai.metrics import Metrics
from jaxinfer.entrypoints.openai.model_registry import ModelRegistry
from jaxinfer.entrypoints.openai.prompts import check_chat_template
from jaxinfer.entrypoints.openai.responses_store import ResponseStore
from jaxinfer.entrypoints.openai.serving import ServingContext
from jaxinfer.entrypoints.openai.status_counter import ErrorResponseCounter
from jaxinfer.engine.async_engine import AsyncEngine

logger = logging.getLogger(__name__)

DESCRIPTION = """An OpenAI-compatible LLM server in pure JAX.

Errors always use OpenAI's envelope `{"error": {"message", "type", "param", "code"}}`:
400 invalid request, 401 API key, 404 unknown model, 429 overloaded (`Retry-After`),
503 warming up / draining (`Retry-After`), 504 request deadline. See `docs/api.md`.
"""


def create_app(models: AsyncEngine | ModelRegistry, server_config: ServerConfig | None = None) -> FastAPI:
    """Build the app.

    Args:
      models: the engine front end of the one served model (served as
        ``server_config.served_model_name``), or a `ModelRegistry` of several (each under
        its own name; ``served_model_name`` is then unused). Started or not: the
        lifespan starts them.
      server_config: HTTP settings (defaults: `ServerConfig()`).
    Returns:
      A FastAPI app; ``app.state.ctx`` is its `ServingContext`.
    """
    config = server_config or ServerConfig()
    if isinstance(models, AsyncEngine):
        models = ModelRegistry.single(config.served_model_name, models)
    store = ResponseStore(config.responses_store_max_entries, config.responses_store_max_bytes,
                          config.responses_store_max_age)
    ctx = ServingContext(models, config, Metrics(models), responses=store)
    ctx.metrics.register_responses_store(store)
    for m in models:
        m.async_engine.add_ready_callback(lambda engine: check_chat_template(engine.tokenizer))

    install_probe_filter()  # /health and /live polls stay out of the access log

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        install_probe_filter()  # again, in case logging was configured since (idempotent)
        models.start()
        yield
        await asyncio.to_thread(models.shutdown)

    app = FastAPI(title="jaxinfer", version="0.1.0", description=DESCRIPTION, lifespan=lifespan)
    app.state.ctx = ctx
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=config.max_request_bytes)
    app.add_middleware(ErrorResponseCounter, count=ctx.metrics.count_error_response)  # sees 413s
    if config.instance_id is not None:  # outermost: every response names its instance
        app.add_middleware(InstanceHeader, instance_id=config.instance_id)
    app.include_router(routes.v1)
    app.include_router(routes.debug)
    app.include_router(routes.ops)
    return app
