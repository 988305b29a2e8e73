"""Keep health and liveness probes out of uvicorn's access log.

Orchestrators poll ``/health`` and ``/live`` every few seconds; logging each poll
buries the real traffic. `ProbeFilter` drops ``uvicorn.access`` records whose path is
one of `PROBE_PATHS` (any method, GET or HEAD, any query string); every other request
is still logged.
"""
from __future__ import annotations

import logging

PROBE_PATHS = frozenset({"/health", "/live"})
ACCESS_LOGGER = "uvicorn.access"


class ProbeFilter(logging.Filter):
    """Drops access-log records of probe paths. uvicorn's record args are
    ``(client_addr, method, full_path, http_version, status_code)``."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            return args[2].split("?", 1)[0] not in PROBE_PATHS
        return True


def install_probe_filter() -> None:
    """Add `ProbeFilter` to the ``uvicorn.access`` logger once (idempotent)."""
    log = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, ProbeFilter) for f in log.filters):
        log.addFilter(ProbeFilter())
