"""When a step speculates: `SpeculationSwitch`, off at large batches and at low acceptance.

Verification rows cost compute: at high concurrency the step is already wide (and has no
spare rows), and when proposals are mostly rejected every verified row is waste. The
switch turns speculation off per step when (a) at least ``disable_by_batch_size``
requests run (vLLM's rule), or (b) the share of draft tokens accepted over the last
``acceptance_window`` drafted tokens is below ``min_acceptance_rate``; while (b) holds,
one step in ``probe_interval`` still speculates, so the measurement follows the workload.
The rate is judged only once a quarter of the window has been measured. Plain Python.
"""
from __future__ import annotations

import collections

from jaxinfer.spec_decode.config import SpeculativeConfig


class SpeculationSwitch:
    """Per-step on/off decision over a sliding window of verification results.

    Args:
      config: thresholds (``disable_by_batch_size``, ``min_acceptance_rate``,
        ``acceptance_window``, ``probe_interval``).
    """

    def __init__(self, config: SpeculativeConfig):
        self.config = config
        self._window: collections.deque[tuple[int, int]] = collections.deque()  # (drafted, accepted) per request
        self._drafted = 0
        self._accepted = 0
        self._steps_off = 0  # consecutive steps refused for a low rate

    @property
    def recent_acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens over the window; None until a quarter of it is measured."""
        if self._drafted < max(1, self.config.acceptance_window // 4):
            return None
        return self._accepted / self._drafted

    def allows(self, num_running: int) -> bool:
        """Whether this step may speculate (call once per step). ``num_running``: requests running."""
        c = self.config
        if c.disable_by_batch_size is not None and num_running >= c.disable_by_batch_size:
            return False
        rate = self.recent_acceptance_rate
        if rate is None or rate >= c.min_acceptance_rate:
            self._steps_off = 0
            return True
        self._steps_off += 1
        if self._steps_off >= c.probe_interval:
            self._steps_off = 0
            return True
        return False

    def record(self, drafted: int, accepted: int) -> None:
        """Add one verified request's result (draft tokens proposed, accepted) to the window."""
        self._window.append((drafted, accepted))
        self._drafted += drafted
        self._accepted += accepted
        while self._window and self._drafted - self._window[0][0] >= self.config.acceptance_window:
            d, a = self._window.popleft()
            self._drafted -= d
            self._accepted -= a
