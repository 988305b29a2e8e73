"""`DrainRate`: how fast the waiting queue is being admitted, measured, for ``Retry-After``.

A 429 tells the client when to come back. A constant is wrong both ways: too soon when
the engine admits one request every few seconds, too late when it admits many per
second. The engine records how many requests it admits each step; the suggested wait
is the time the current queue needs to drain at the rate measured over a sliding
window (Little's law: wait = queue length / throughput), clamped to ``[min_s, max_s]``.
Plain Python; no JAX import.
"""
from __future__ import annotations

import collections


class DrainRate:
    """Admissions per second over the last ``window_s`` seconds.

    Args:
      window_s: length of the sliding window (seconds).
      min_s, max_s: bounds of the suggested wait (seconds).
    """

    def __init__(self, window_s: float = 60.0, min_s: float = 1.0, max_s: float = 300.0):
        self.window_s = window_s
        self.min_s = min_s
        self.max_s = max_s
        self._events: collections.deque[tuple[float, int]] = collections.deque()
        self._started: float | None = None

    def record(self, now: float, admitted: int) -> None:
        """Note ``admitted`` requests admitted at ``now`` (``time.monotonic()`` seconds)."""
        if self._started is None:
            self._started = now
        if admitted:
            self._events.append((now, admitted))
        while self._events and self._events[0][0] < now - self.window_s:
            self._events.popleft()

    def rate(self, now: float) -> float | None:
        """Admissions per second over the window (None before any admission)."""
        if not self._events or self._started is None:
            return None
        span = min(self.window_s, max(now - self._started, 1e-3))
        return sum(n for _, n in self._events) / span

    def seconds_to_drain(self, queue_len: int, now: float) -> float:
        """Seconds until ``queue_len`` waiting requests are admitted at the measured rate,
        clamped to ``[min_s, max_s]``; ``max_s`` when nothing was admitted in the window
        (the queue is not moving)."""
        r = self.rate(now)
        if r is None:
            return self.max_s if queue_len else self.min_s
        return min(self.max_s, max(self.min_s, queue_len / r))
