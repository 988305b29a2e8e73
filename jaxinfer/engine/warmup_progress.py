"""`WarmupProgress`: how far the warm-up compile is (buckets done of all, with an ETA).

A callable ``progress(done, total)`` that `jaxinfer.engine.llm_engine.LLMEngine.warmup` calls after
each bucket. It drives a tqdm bar (on a terminal, or when asked: ``LLM(use_tqdm=True)``)
and writes log lines at a modest rate for server logs, which are rarely terminals:
``warm-up: 12/77 buckets, ETA 40 s``, at most one per `LOG_EVERY_S` seconds or per
tenth of the buckets, and always the last.
"""
from __future__ import annotations

import logging
import sys
import time

from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

LOG_EVERY_S = 5.0


class WarmupProgress:
    """Progress of one warm-up.

    Args:
      use_tqdm: show a tqdm bar; None: only when stderr is a terminal.
      log: the logger the progress lines go to.
    """

    def __init__(self, use_tqdm: bool | None = None, log: logging.Logger = logger):
        self.use_tqdm = sys.stderr.isatty() if use_tqdm is None else use_tqdm
        self.log = log
        self._bar = None
        self._t0 = time.monotonic()
        self._last_log_t = self._t0
        self._last_log_done = 0

    def __call__(self, done: int, total: int) -> None:
        """``done`` of ``total`` buckets are compiled (0 <= done <= total); 0, before the first
        bucket, starts the clock (else it runs from this object's creation)."""
        if done == 0:
            self._t0 = self._last_log_t = time.monotonic()
            return
        if self._bar is None:
            self._bar = tqdm(total=total, desc="Warm-up (compiling buckets)", unit="bucket",
                             disable=not self.use_tqdm)
        self._bar.update(done - self._bar.n)
        now = time.monotonic()
        if done >= total or now - self._last_log_t >= LOG_EVERY_S or done - self._last_log_done >= total / 10:
            self.log.info("warm-up: %d/%d buckets, %s", done, total, self.eta_text(done, total, now - self._t0))
            self._last_log_t, self._last_log_done = now, done
        if done >= total:
            self._bar.close()

    @staticmethod
    def eta_text(done: int, total: int, elapsed: float) -> str:
        """``"ETA 40 s"`` (remaining buckets at the mean time per bucket so far), or
        ``"done in 12.3 s"`` once ``done == total``."""
        if done >= total:
            return f"done in {elapsed:.1f} s"
        return f"ETA {elapsed / max(done, 1) * (total - done):.0f} s"
