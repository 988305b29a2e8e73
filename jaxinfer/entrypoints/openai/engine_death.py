"""The process side of the engine fault policy: a server whose engine died exits non-zero.

Owns `ExitOnEngineDeath`. When any served model's engine dies (a step raised: a device
error, an out-of-memory, a bug; see `jaxinfer.engine.async_engine`), every request in flight has
already been failed (HTTP 500 / an SSE error event then ``[DONE]``) and ``/live`` and
``/health`` answer 503. The server then:

1. tells the followers of a multi-host run (`jaxinfer.distributed.peer_failure.tell_peers`: they exit
   non-zero at once, their log naming the failure, instead of when this process is gone);
2. keeps answering for `LINGER_S` seconds (probes and load balancers see the 503s; the
   error responses are written), refusing new work with 503, and aborts the other models'
   requests (their clients get an error, not a cut connection);
3. stops uvicorn gracefully (the handlers finish writing), then exits with `EXIT_STATUS`
   at once (`exit_now`: ``os._exit`` after flushing the logs, skipping the interpreter's
   teardown, which can take seconds on a loaded machine and hang on a dead device);
4. whatever happens, exits with `EXIT_STATUS` at most `EXIT_BOUND_S` seconds after the
   failure (``os._exit`` from a timer: a stuck handler or a hung device call cannot keep
   it up).

A supervisor (systemd ``Restart=on-failure``, Kubernetes) then restarts it. This is
vLLM's "engine dead" rule (vllm/v1/engine/exceptions.py ``EngineDeadError``: the API
server shuts down once the engine core dies).
"""
from __future__ import annotations

import logging
import os
import sys
import threading

from jaxinfer.distributed import peer_failure

logger = logging.getLogger(__name__)

LINGER_S = 1.0  # seconds the server keeps answering 503 after the failure, before stopping
EXIT_BOUND_S = 5.0  # the process has exited at most this long after the failure
EXIT_STATUS = 1


class ExitOnEngineDeath:
    """Stops ``server`` (a `uvicorn.Server`) when an engine of ``models`` dies.

    Args:
      models: the server's `jaxinfer.entrypoints.openai.model_registry.ModelRegistry`.
      server: the uvicorn server (``should_exit`` is set to stop it).
      hard_exit: called with the exit status if the process is still up `EXIT_BOUND_S`
        seconds after the failure (``os._exit``; tests pass a stand-in).
    Attributes:
      error: the first engine failure (``"TypeName: message"``), None while none died.
    """

    def __init__(self, models, server, hard_exit=os._exit):
        self.models = models
        self.server = server
        self.hard_exit = hard_exit
        self.error: str | None = None
        self._lock = threading.Lock()
        for m in models:
            m.async_engine.add_death_callback(lambda error, name=m.name: self.on_death(name, error))

    @property
    def died(self) -> bool:
        """True once an engine died (the process must exit with `EXIT_STATUS`)."""
        return self.error is not None

    def on_death(self, name: str, error: str) -> None:
        """An engine died (any thread): start the bounded exit, once."""
        with self._lock:
            if self.error is not None:
                return
            self.error = error
        logger.error("engine of %s died (%s): every request in flight failed; exiting with status %d within %g s",
                     name, error, EXIT_STATUS, EXIT_BOUND_S)
        peer_failure.tell_peers(f"its engine of {name} died ({error})")  # a multi-host leader's followers end now
        self.models.start_draining()
        self.models.abort_all()
        _daemon_timer(LINGER_S, self._stop)
        _daemon_timer(EXIT_BOUND_S, self._force_exit)

    def exit_now(self) -> None:
        """End the process with `EXIT_STATUS` now (after the graceful stop), logs flushed."""
        logger.error("exiting with status %d (engine failure: %s)", EXIT_STATUS, self.error)
        _flush()
        self.hard_exit(EXIT_STATUS)

    def _stop(self) -> None:
        self.server.should_exit = True

    def _force_exit(self) -> None:
        logger.error("graceful stop took longer than %g s: exiting now", EXIT_BOUND_S)
        _flush()
        self.hard_exit(EXIT_STATUS)


def _flush() -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _daemon_timer(seconds: float, fn) -> None:
    timer = threading.Timer(seconds, fn)
    timer.daemon = True
    timer.start()
