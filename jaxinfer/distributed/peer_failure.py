"""How a multi-process run ends when one of its processes fails: every process exits, non-zero.

In a multi-controller SPMD job (`jaxinfer.distributed.multihost`) a process that is gone leaves
the others blocked in their next collective, and ``jax.distributed``'s own exit path
(an ``atexit`` shutdown barrier that waits up to ``shutdown_timeout_seconds``, 300 s)
keeps even a process whose Python code has already failed alive. This module owns the
rule that replaces both:

* `fail` (any thread, once): log the reason, tell the peers (the step channel's
  ``error`` message, so that their log names the process that failed and why), run the
  `on_failure` callbacks (the leader's HTTP server fails every request in flight: 500s
  and SSE error events), give the answers `EXIT_GRACE_S` to go out, and leave with
  ``os._exit(EXIT_STATUS)``: no ``atexit`` hook and no collective can hold the process.
* `tell_peers`: only tell the peers (the leader's engine died: the leader ends itself
  through `jaxinfer.entrypoints.openai.engine_death`, its followers at once on the news).
* `install_exit_guard`: an ``atexit`` hook (it runs before JAX's own, ``atexit`` being
  last-in first-out) that turns any exit without a clean `mark_clean_exit` (an uncaught
  exception on a follower, ``sys.exit`` after a failed start-up) into `fail`.

This is the multi-process form of vLLM's "engine dead" rule (clean client errors, then a
non-zero exit, so that a supervisor restarts the job).
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from typing import Callable

logger = logging.getLogger(__name__)

EXIT_STATUS = 1
EXIT_GRACE_S = 1.0  # after failing the requests in flight: time for their error answers to be written

_lock = threading.Lock()
_failing = False
_clean = False
_callbacks: list[Callable[[str], None]] = []
_notify_peers: list[Callable[[str], None]] = []


def on_failure(fn: Callable[[str], None]) -> None:
    """Run ``fn(reason)`` in `fail` before the process exits (the leader's server fails its
    requests here). Callbacks must not block for long; exceptions are logged and skipped."""
    with _lock:
        _callbacks.append(fn)


def set_peer_notifier(fn: Callable[[str], None]) -> None:
    """``fn(reason)`` tells the other processes why this one fails (best effort, bounded);
    set by `jaxinfer.distributed.step_channel.StepChannel`."""
    with _lock:
        _notify_peers.append(fn)


def mark_clean_exit() -> None:
    """This process leaves through the orderly shutdown: the exit guard stays quiet."""
    global _clean
    _clean = True


def failing() -> bool:
    """True once `fail` has started (a peer's going away is then expected, not news)."""
    return _failing


def fail(reason: str, status: int = EXIT_STATUS) -> None:
    """End this process because the job cannot go on (never returns; once per process:
    a second caller just waits for the first to finish the exit).

    Args:
      reason: what went wrong, for the log and the peers (one line).
      status: the exit status (non-zero).
    """
    global _failing
    with _lock:
        first = not _failing
        _failing = True
        callbacks, notifiers = list(_callbacks), list(_notify_peers)
    if not first:
        while True:  # the first caller is exiting the process
            time.sleep(60)
    logger.error("%s; exiting with status %d", reason, status)
    for fn in notifiers:
        _call(fn, reason)
    for fn in callbacks:
        _call(fn, reason)
    if callbacks:
        time.sleep(EXIT_GRACE_S)
    hard_exit(status)


def tell_peers(reason: str) -> None:
    """Tell the other processes of the job that this one fails, and why, without ending
    this one (its own bounded exit is under way: `jaxinfer.entrypoints.openai.engine_death` on the
    leader). They end on the news (their step channel's reader calls `fail`). Best effort,
    bounded (`jaxinfer.distributed.step_channel.StepChannel.send_error`); a no-op on one process."""
    with _lock:
        notifiers = list(_notify_peers)
    for fn in notifiers:
        _call(fn, reason)


def _call(fn: Callable[[str], None], reason: str) -> None:
    try:
        fn(reason)
    except Exception:  # noqa: BLE001 - one failing callback must not keep the process up
        logger.exception("failure callback %r raised", fn)


def hard_exit(status: int) -> None:
    """Flush the logs and leave now with ``status`` (``os._exit``: no atexit hook, no barrier)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _exit_guard() -> None:
    if not _clean and not _failing:
        fail("this process is exiting without the multi-host shutdown (an error above, or a failed start-up)")


def install_exit_guard() -> None:
    """Register the ``atexit`` guard (once; call after JAX is imported so that it runs first)."""
    atexit.register(_exit_guard)
