"""Exceptions that cross the engine/API boundary.

`RequestError` is a client mistake (HTTP 400 in the OpenAI error shape, naming the
offending ``param``); `QueueFullError` is overload (HTTP 429 with Retry-After).

A request whose prompt (or prompt + ``max_tokens``) cannot fit in the context the server
holds (``max_model_len``, or the whole KV pool when smaller) carries
``code = CONTEXT_LENGTH_EXCEEDED``, OpenAI's code for it, and a message naming
`SHORTEN_HINT`'s remedies, offline (`jaxinfer.entrypoints.llm.LLM`) and over HTTP alike.
"""
from __future__ import annotations

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
SHORTEN_HINT = ("shorten the prompt, or set truncate_prompt_tokens: K (HTTP API) to keep only "
                "its last K tokens")


class RequestError(ValueError):
    """A request the engine refuses before touching the device (HTTP 400).

    Attributes:
      param: the request field at fault (``"prompt"``, ``"max_tokens"``, ...) or None.
      code: optional machine-readable code.
    """

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class QueueFullError(RuntimeError):
    """The bounded waiting queue is full (HTTP 429, retry later).

    Attributes:
      retry_after: suggested seconds before retrying.
    """

    def __init__(self, message: str, retry_after: float = 1.0):
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
