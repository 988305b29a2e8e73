"""`InstanceHeader`: an ASGI middleware that names the answering instance on every response.

Behind a load balancer (``python -m jaxinfer.cluster``, docs/deploy.md) each response carries
``x-jaxinfer-instance: <instance id>`` (``--instance-id``, by default ``hostname:port``), so a
client or a test can see where a request was routed. It adds the header to the
``http.response.start`` message, so errors, streams and probes carry it too.
"""
from __future__ import annotations

HEADER = b"x-jaxinfer-instance"


class InstanceHeader:
    """Args:
      app: the ASGI app to wrap.
      instance_id: the header's value (printable ASCII).

    Raises:
      ValueError: ``instance_id`` is empty or not printable ASCII (it could not be a header value).
    """

    def __init__(self, app, instance_id: str):
        if not instance_id or not instance_id.isascii() or not instance_id.isprintable():
            raise ValueError(f"instance id must be non-empty printable ASCII, got {instance_id!r}")
        self.app = app
        self.value = instance_id.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_header(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (HEADER, self.value)]
            await send(message)

        await self.app(scope, receive, send_with_header)
