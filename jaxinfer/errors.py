"""Exceptions that cross the engine/API boundary.

`RequestError` is a client mistake (HTTP 400 in the OpenAI error shape, naming the
offending ``param``); `QueueFullError` is overload (HTTP 429 with Retry-After).
"""
from __future__ import annotations


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
