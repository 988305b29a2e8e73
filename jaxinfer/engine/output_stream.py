"""`OutputStream`: the asyncio side of one group of engine requests (one HTTP request, its ``n``
choices), fed by the engine thread of `jaxinfer.engine.async_engine.AsyncEngine`.

Owns the order of what a stream carries: the verdict on admission first (`ACCEPTED`, or the
exception the engine raised), then cumulative `RequestOutput`s, or an exception if the
engine dies.
"""
from __future__ import annotations

import asyncio

from jaxinfer.outputs import RequestOutput

ACCEPTED = object()  # first item of a stream when the engine took its requests


class OutputStream:
    """The asyncio side of a group of engine requests (one HTTP request, ``n`` choices).

    The engine thread puts ``ACCEPTED`` or an exception first (consumed by
    `AsyncEngine.add`), then cumulative `RequestOutput`s of the group's requests, in order,
    or an exception if the engine dies.
    """

    def __init__(self, request_ids: list[str], loop: asyncio.AbstractEventLoop):
        self.request_ids = list(request_ids)
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.unfinished = set(request_ids)
        self.failed = False

    @property
    def finished(self) -> bool:
        """True when every request of the group has ended (or the stream failed)."""
        return not self.unfinished or self.failed

    def put_batch(self, items: list) -> None:  # runs on the event loop
        for item in items:
            self.queue.put_nowait(item)

    async def next_batch(self) -> list[RequestOutput]:
        """Wait for news, then take all that is queued: the newest output per request,
        in first-seen order (outputs are cumulative, so nothing is lost).

        Raises:
          EngineDeadError: the engine died.
        """
        items = [await self.queue.get()]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        latest: dict[str, RequestOutput] = {}
        for item in items:
            if isinstance(item, BaseException):
                self.failed = True
                raise item
            if item is ACCEPTED:
                continue
            latest[item.request_id] = item
            if item.finished:
                self.unfinished.discard(item.request_id)
        return list(latest.values())
