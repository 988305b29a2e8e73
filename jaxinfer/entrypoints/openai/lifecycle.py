"""The server process around the app: its listening socket, uvicorn's settings, the SIGTERM
drain, and the exit when an engine never becomes ready. ``server.py`` builds the app and the
engines and hands them to `serve`; `jaxinfer.entrypoints.openai.engine_death` owns the exit when an engine
dies while serving."""
from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time

logger = logging.getLogger("jaxinfer.server")  # the drain's log lines, as before they moved here
DRAIN_MARGIN_S = 1.0  # requests still running this long before the grace period ends are aborted


def uvicorn_config(app, config):
    """The ``uvicorn.Config`` that serves ``app`` as ``config`` (a `ServerConfig`) says."""
    import uvicorn

    return uvicorn.Config(app, host=config.host, port=config.port, log_level=logging.getLogger().level,
                          timeout_graceful_shutdown=config.shutdown_timeout,
                          timeout_keep_alive=config.timeout_keep_alive, lifespan="on")


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket for uvicorn, made before the model loads so that a busy
    port or a bad host fails at once.

    Raises:
      OSError: the address cannot be resolved or bound.
    """
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


class Drain:
    """The SIGTERM drain: refuse new requests, give in-flight ones ``shutdown_timeout``
    seconds, abort what is left `DRAIN_MARGIN_S` before uvicorn would cut it, and say
    so in the log: ``draining N requests (shutdown timeout T s)``, then ``drained: N
    finished`` or ``shutdown timeout: K aborted, M finished``. N counts client requests
    (one HTTP request with ``n`` choices is one)."""

    def __init__(self, async_engine, shutdown_timeout: float):
        self.async_engine = async_engine
        self.shutdown_timeout = shutdown_timeout
        self.started = False
        self.in_flight = 0
        self.aborted = 0
        self._timer: threading.Timer | None = None

    def start(self) -> None:
        """Begin draining (first signal only)."""
        if self.started:
            return
        self.started = True
        self.async_engine.start_draining()  # /health and new requests: 503 from now on
        self.in_flight = self.async_engine.num_in_flight_groups()
        logger.info("draining %d requests (shutdown timeout %g s)", self.in_flight, self.shutdown_timeout)
        # Just before uvicorn would cancel handlers (a bare 500 / a cut stream), abort what
        # is left so clients get a 503 envelope or an error event + [DONE].
        self._timer = threading.Timer(max(0.0, self.shutdown_timeout - DRAIN_MARGIN_S), self._abort_rest)
        self._timer.daemon = True
        self._timer.start()

    def _abort_rest(self) -> None:
        self.aborted = self.async_engine.num_in_flight_groups()
        self.async_engine.abort_all()

    def wait_idle(self, poll_s: float = 0.05) -> None:
        """Block until no client request is in flight, or ``shutdown_timeout`` seconds after
        `start` (what is left by then was aborted `DRAIN_MARGIN_S` earlier)."""
        deadline = time.monotonic() + self.shutdown_timeout
        while self.async_engine.num_in_flight_groups() and time.monotonic() < deadline:
            time.sleep(poll_s)

    def finish(self) -> None:
        """Log the outcome (once uvicorn has stopped)."""
        if not self.started:
            return
        if self._timer is not None:
            self._timer.cancel()
        if self.aborted:
            logger.info("shutdown timeout: %d aborted, %d finished", self.aborted,
                        max(0, self.in_flight - self.aborted))
        else:
            logger.info("drained: %d finished", self.in_flight)


def serve(app, models, config, sock: socket.socket | None = None) -> None:
    """Run uvicorn until SIGTERM / SIGINT, draining in-flight requests first (`Drain`; on
    ``sock`` when given, else on ``config.host:config.port``).

    Args:
      models: the app's `ModelRegistry`, or the `AsyncEngine` of its one model.
    """
    import uvicorn

    from jaxinfer.entrypoints.openai.engine_death import ExitOnEngineDeath
    from jaxinfer.entrypoints.openai.model_registry import ModelRegistry
    from jaxinfer.engine.async_engine import AsyncEngine

    if isinstance(models, AsyncEngine):
        models = ModelRegistry.single(config.served_model_name, models)
    drain = Drain(models, config.shutdown_timeout)

    class DrainingServer(uvicorn.Server):
        """The first SIGTERM / SIGINT drains with the listener still open (new requests get
        503 + Retry-After, not a refused connection), then stops uvicorn once nothing is in
        flight; a second signal stops it at once."""

        def handle_exit(self, sig, frame):
            if drain.started or self.should_exit:
                super().handle_exit(sig, frame)
                return
            drain.start()
            threading.Thread(target=self._stop_when_drained, args=(sig, frame), name="drain", daemon=True).start()

        def _stop_when_drained(self, sig, frame):
            drain.wait_idle()
            super().handle_exit(sig, frame)

    uv_config = uvicorn_config(app, config)
    # uvicorn re-raises the signal after its graceful shutdown: make that a clean exit, for Ctrl+C
    # too (Python's own SIGINT handler would end a finished drain with a KeyboardInterrupt, status 130)
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda *_: sys.exit(0))
    server = DrainingServer(uv_config)
    threading.Thread(target=exit_if_never_ready, args=(models, server), daemon=True).start()
    death = ExitOnEngineDeath(models, server)  # the fault policy: an engine that dies ends the process
    try:
        server.run(sockets=[sock] if sock is not None else None)
    finally:
        drain.finish()
    if getattr(server, "engine_failed_at_start", False):
        sys.exit(1)  # the engine failed while loading or warming up (logged above)
    if death.died:
        death.exit_now()  # a step raised while serving (logged above): exit status 1, a supervisor restarts us


def exit_if_never_ready(models, server) -> None:
    """Stop serving when an engine fails before it was ever ready (bad weights, out of memory):
    such a server could never answer for that model, so it exits 1 instead of staying up
    unready. An engine that dies later ends the process too (`jaxinfer.entrypoints.openai.engine_death`)."""
    if not models.wait_ready():
        server.engine_failed_at_start = True
        server.should_exit = True
