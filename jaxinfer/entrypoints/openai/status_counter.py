"""`ErrorResponseCounter`: an ASGI middleware that counts HTTP error responses by status.

It sits outside every other middleware (413 from `jaxinfer.entrypoints.openai.body_limit` included) and
looks only at the ``http.response.start`` message, so each response is counted exactly
once, whichever handler produced it. An exception that escapes the app before a response
started is counted as 500 (Starlette's outermost error middleware answers it). Errors sent
inside a stream that already began with 200 are not HTTP errors and are not counted.
"""
from __future__ import annotations

from typing import Callable


class ErrorResponseCounter:
    """Args:
      app: the ASGI app to wrap.
      count: called with the status code (int) of every response with status >= 400.
    """

    def __init__(self, app, count: Callable[[int], None]):
        self.app = app
        self.count = count

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def counting_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if message["status"] >= 400:
                    self.count(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:
                self.count(500)
            raise
