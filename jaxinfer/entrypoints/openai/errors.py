"""Every HTTP error in OpenAI's envelope: ``{"error": {"message", "type", "param", "code"}}``.

Owns `APIError` and the exception handlers that map the rest onto it:

| cause                                        | status | type                  | headers     |
|----------------------------------------------|--------|-----------------------|-------------|
| malformed body (FastAPI 422), `RequestError` | 400    | invalid_request_error |             |
| missing / wrong API key                      | 401    | invalid_request_error | WWW-Authenticate |
| unknown model, unknown route                 | 404    | invalid_request_error |             |
| queue full / wait estimate over the bound    | 429    | rate_limit_error      | Retry-After |
| queued past twice the bound (`queue_wait_expired`) | 429 | rate_limit_error | Retry-After |
| warming up, draining, engine dead (new work) | 503    | service_unavailable   | Retry-After |
| engine failed with the request in flight     | 500    | server_error          |             |
| request deadline passed                      | 504    | timeout               |             |
| client left before its (non-streamed) answer | 499    | client_closed_request |             |
| anything unexpected (a bug)                  | 500    | server_error          |             |

A prompt (or prompt + ``max_tokens``) too long for the context is a 400 with ``code``
``"context_length_exceeded"`` (OpenAI's code; `jaxinfer.errors.CONTEXT_LENGTH_EXCEEDED`)
and a message naming ``truncate_prompt_tokens``; ``param`` is ``prompt`` (``messages``
for chat) or the ``max_tokens`` field.
A handler never returns FastAPI's default bodies, and nothing ever surfaces a traceback.
"""
from __future__ import annotations

import logging
import math
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from jaxinfer.engine.async_engine import EngineDeadError, EngineNotReadyError
from jaxinfer.errors import QueueFullError, RequestError

logger = logging.getLogger(__name__)

_TYPE_BY_STATUS = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
                   405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
                   499: "client_closed_request", 503: "service_unavailable", 504: "timeout"}


class APIError(Exception):
    """An error response in OpenAI's shape.

    Args:
      status: HTTP status code.
      message: human-readable explanation.
      type: OpenAI error type (defaults from the status).
      param: the request field at fault, or None.
      code: machine-readable code, or None.
      retry_after: seconds for the ``Retry-After`` header (429 / 503), or None.
    """

    def __init__(self, status: int, message: str, *, type: str | None = None, param: str | None = None,
                 code: str | int | None = None, retry_after: float | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPE_BY_STATUS.get(status, "server_error")
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        if retry_after is not None:
            self.headers["Retry-After"] = str(max(1, math.ceil(retry_after)))

    def body(self) -> dict:
        """The JSON envelope."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def from_exception(exc: BaseException, param_aliases: dict[str, str] | None = None) -> APIError:
    """Map an engine-side exception onto an `APIError`.

    Args:
      exc: `RequestError`, `QueueFullError`, `EngineNotReadyError`, `EngineDeadError` or `APIError`.
      param_aliases: renames of ``param`` for this endpoint (chat reports ``prompt`` as ``messages``);
        the message names the renamed field too (``max_completion_tokens``), except for
        ``prompt``, whose messages speak of prompt tokens.
    """
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestError):
        param = (param_aliases or {}).get(exc.param, exc.param)
        message = exc.message
        if param != exc.param and exc.param != "prompt":
            message = re.sub(rf"(?<![\w.]){re.escape(exc.param)}\b", param, message)
        return APIError(400, message, param=param, code=exc.code)
    if isinstance(exc, QueueFullError):
        return APIError(429, exc.message, code="queue_full", retry_after=exc.retry_after)
    if isinstance(exc, EngineNotReadyError):
        return APIError(503, exc.message, code=exc.code, retry_after=exc.retry_after)
    if isinstance(exc, EngineDeadError) and exc.in_flight:  # the fault policy (docs/api.md)
        return APIError(500, exc.message, type="server_error", code="engine_dead")
    if isinstance(exc, EngineDeadError):
        return APIError(503, exc.message, code="engine_dead", retry_after=10)
    logger.exception("unexpected error", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}", type="server_error")


def timeout_error(seconds: float | None) -> APIError:
    """HTTP 504 for a request evicted at its deadline."""
    after = f" after {seconds:g} s" if seconds is not None else ""
    return APIError(504, f"the request timed out{after}", code="request_timeout")


def client_closed_error() -> APIError:
    """HTTP 499 (nginx's "client closed request") for a non-streamed request whose client
    disconnected before the answer was ready: the request was aborted and no one reads this
    response; the status only keeps the client's leaving apart from server errors in logs and
    ``jaxinfer_http_error_responses_total``."""
    return APIError(499, "the client closed the connection before the answer was ready; the request was aborted",
                    code="client_closed_request")


def queue_wait_error(seconds: float | None, retry_after: float) -> APIError:
    """HTTP 429 ``queue_wait_expired`` for a queued request still unadmitted after ``seconds``
    (`jaxinfer.entrypoints.openai.config.ServerConfig.queue_wait_expiry`; None: not said); ``retry_after``
    in seconds for the header."""
    waited = f" within {seconds:g} s" if seconds is not None else ""
    return APIError(429, f"the server is overloaded: the request was not admitted{waited}; retry later",
                    code="queue_wait_expired", retry_after=retry_after)


def _validation_error(exc: RequestValidationError, content_type: str = "application/json") -> APIError:
    """FastAPI's 422 as a 400 naming the first offending top-level field or query / path
    parameter (all its problems in the message: a union such as ``prompt`` reports one per
    accepted form). A body that
    is wrong as a whole says so, and names the Content-Type when it is not JSON (``curl -d``
    without ``-H 'Content-Type: application/json'`` sends a form)."""
    errors = exc.errors() or [{}]
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ())]
    if first.get("type") == "json_invalid" or len(loc) < 2 or loc[0] not in ("body", "query", "path"):
        hint = "" if "json" in content_type.lower() else (
            f" (the body must be JSON sent with Content-Type: application/json; this request's Content-Type "
            f"was {content_type or 'missing'!r})")
        return APIError(400, f"invalid request body: {first.get('msg', 'not valid JSON')}{hint}", code=first.get("type"))
    where, field = loc[0], loc[1]
    msgs = []
    for e in errors:
        eloc = [str(p) for p in e.get("loc", ())]
        if eloc[:2] == [where, field]:
            text = f"{'.'.join(eloc[1:])}: {e.get('msg')}"
            if text not in msgs:
                msgs.append(text)
    return APIError(400, "; ".join(msgs)[:1000], param=field, code=first.get("type"))


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that put every error into the OpenAI envelope."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return _validation_error(exc, request.headers.get("content-type", "")).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return APIError(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None)).response()

    for cls in (RequestError, QueueFullError, EngineNotReadyError, EngineDeadError):
        app.add_exception_handler(cls, lambda request, exc: from_exception(exc).response())

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        return from_exception(exc).response()
