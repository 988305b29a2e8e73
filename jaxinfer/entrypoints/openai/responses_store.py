"""The bounded in-memory store of ``/v1/responses`` objects (``store``, ``previous_response_id``,
``GET`` / ``DELETE /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``).

Each entry is a response object and the conversation that led to it (normalized input
items with their ids, `jaxinfer.entrypoints.openai.responses_input.normalize_items`: the
stored history of its ``previous_response_id`` and its own input; ``instructions`` are not
part of it, as in OpenAI's API); the conversation is what ``input_items`` lists. Entries are kept as compact JSON bytes, so the memory they take is what they
are charged: ``len(response JSON) + len(conversation JSON) + ENTRY_OVERHEAD``.

Three limits, each a server flag, evict least recently used entries first (a read or a
``previous_response_id`` use refreshes an entry):
  * ``max_entries`` (``--responses-store-max-entries``, default 10,000; 0 turns storing off),
  * ``max_bytes`` (``--responses-store-max-bytes``, default 256 MiB: the budget the entries'
    charges stay within),
  * ``max_age_s`` (``--responses-store-max-age``, default 86,400 s from creation).
An evicted, expired, deleted or never-stored id is unknown: the API answers 404. The store
lives in the server process only: nothing survives a restart, and each replica behind a
load balancer has its own (route a conversation to one replica, or send the history).
Thread-safe (one lock); operations are O(1) amortized.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
from typing import Callable

DEFAULT_MAX_ENTRIES = 10_000
DEFAULT_MAX_BYTES = 256 << 20
DEFAULT_MAX_AGE_S = 86_400.0
ENTRY_OVERHEAD = 1024  # bytes charged per entry: the two dicts' slots, the key, the entry and bytes headers (measured)


@dataclasses.dataclass(frozen=True)
class StoredResponse:
    """A response object and its conversation (normalized input items, oldest first)."""

    response: dict
    conversation: list[dict]


@dataclasses.dataclass(slots=True)
class _Entry:
    response: bytes
    conversation: bytes
    created: float

    @property
    def charge(self) -> int:
        return len(self.response) + len(self.conversation) + ENTRY_OVERHEAD


class ResponseStore:
    """LRU store with entry, byte and age limits (see the module docstring).

    Args:
      max_entries: most entries kept (0: the store keeps nothing).
      max_bytes: most bytes charged over all entries; one entry larger than this is not kept.
      max_age_s: seconds an entry lives after it was stored.
      clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_age_s: float = DEFAULT_MAX_AGE_S, clock: Callable[[], float] = time.monotonic):
        if max_entries < 0 or max_bytes < 0 or not max_age_s > 0:
            raise ValueError(f"store limits must be >= 0 (age > 0): {max_entries}, {max_bytes}, {max_age_s}")
        self.max_entries, self.max_bytes, self.max_age_s = max_entries, max_bytes, max_age_s
        self._clock = clock
        self._lru: collections.OrderedDict[str, _Entry] = collections.OrderedDict()  # least recent first
        self._by_age: collections.OrderedDict[str, float] = collections.OrderedDict()  # oldest first
        self._bytes = 0
        self.evictions = 0  # entries dropped by a limit (not by DELETE), since start
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def bytes_charged(self) -> int:
        """Bytes charged over the entries kept (always <= ``max_bytes``)."""
        return self._bytes

    def put(self, response: dict, conversation: list[dict]) -> bool:
        """Store ``response`` (under ``response["id"]``, replacing an entry of that id).

        Returns:
          False when it was not kept (store off, or the entry alone exceeds ``max_bytes``).
        """
        entry = _Entry(_dumps(response), _dumps(conversation), self._clock())
        if not self.enabled or entry.charge > self.max_bytes:
            return False
        with self._lock:
            self._drop(response["id"])
            self._lru[response["id"]] = entry
            self._by_age[response["id"]] = entry.created
            self._bytes += entry.charge
            self._expire()
            while len(self._lru) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._lru)))
                self.evictions += 1
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response (refreshed as most recently used), or None if unknown or expired."""
        with self._lock:
            self._expire()
            entry = self._lru.get(response_id)
            if entry is None:
                return None
            self._lru.move_to_end(response_id)
        return StoredResponse(json.loads(entry.response), json.loads(entry.conversation))

    def delete(self, response_id: str) -> bool:
        """Forget ``response_id``; False if it was not stored (or already evicted)."""
        with self._lock:
            self._expire()
            return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        entry = self._lru.pop(response_id, None)
        if entry is None:
            return False
        del self._by_age[response_id]
        self._bytes -= entry.charge
        return True

    def _expire(self) -> None:
        horizon = self._clock() - self.max_age_s
        while self._by_age:
            oldest, created = next(iter(self._by_age.items()))
            if created > horizon:
                return
            self._drop(oldest)
            self.evictions += 1


def _dumps(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
