"""The OpenAI-compatible HTTP layer (FastAPI) over `jaxinfer.engine.async_engine.AsyncEngine`.

Modules, request order: ``protocol`` (pydantic bodies) -> ``routes`` (endpoints) ->
``serving`` (lifecycle of one generation request) with ``prompts`` (prompt ids),
``params`` (`SamplingParams`), ``responses`` / ``logprobs`` (JSON and SSE shapes);
``errors`` (OpenAI error envelope), ``metrics`` (Prometheus), ``config`` (`ServerConfig`),
``model_registry`` (the served models by name), ``degrade`` (the fallback decision),
``app`` (`create_app`), ``lifecycle`` (the process around the app: socket, uvicorn, the SIGTERM
drain). Contract: docs/api.md.
"""
from jaxinfer.entrypoints.openai.app import create_app
from jaxinfer.entrypoints.openai.config import ServerConfig

__all__ = ["create_app", "ServerConfig"]
