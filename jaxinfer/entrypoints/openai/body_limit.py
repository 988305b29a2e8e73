"""`BodySizeLimit`: an ASGI middleware that answers 413 to request bodies over a byte limit.

It reads the body before the app does (FastAPI would buffer it whole anyway), so an
oversized body costs at most ``max_bytes`` of memory and is never JSON-parsed: the 413
goes out in OpenAI's error envelope as soon as the declared ``Content-Length`` or the bytes
received pass the limit. The buffered body is then replayed to the app; later ``receive``
calls go to the server, so disconnect detection is unchanged.
"""
from __future__ import annotations

import json


class BodySizeLimit:
    """Args:
      app: the ASGI app to wrap.
      max_bytes: largest accepted body in bytes (None: no limit).
    """

    def __init__(self, app, max_bytes: int | None):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.max_bytes is None:
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._reject(send)
        chunks, size, first = [], 0, None
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending the body
                first = message
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._reject(send)
            if not message.get("more_body"):
                break
        first = first or {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        pending = [first]

        async def replay():
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)

    async def _reject(self, send) -> None:
        body = json.dumps({"error": {"message": f"the request body is over the limit of {self.max_bytes} bytes",
                                     "type": "invalid_request_error", "param": None,
                                     "code": "request_too_large"}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
