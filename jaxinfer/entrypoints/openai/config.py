"""`ServerConfig`: the HTTP server's own settings (the engine's are `jaxinfer.config.EngineConfig`).

Frozen, like the rest of the configuration tree; ``server.py`` flags map one-to-one onto
these fields (``--max-queue-wait`` -> ``max_queue_wait``).
"""
from __future__ import annotations

import dataclasses

from jaxinfer.config.args import DEFAULT_MODEL
from jaxinfer.entrypoints.openai.responses_store import DEFAULT_MAX_AGE_S, DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES

# A queued request expires at this multiple of ``max_queue_wait``: the estimate behind the
# bound is an upper bound while the measured step time holds (outputs counted at max_tokens),
# so twice the bound is left only by a wrong or missing estimate (a cold-start flood).
QUEUE_WAIT_EXPIRY_FACTOR = 2.0


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """HTTP-level settings.

    Attributes:
      host, port: where to listen (127.0.0.1 unless told otherwise).
      served_model_name: the ``model`` name clients send and ``/v1/models`` lists.
      api_key: when set, ``/v1/*``, ``/tokenize`` and ``/detokenize`` need
        ``Authorization: Bearer <api_key>``.
      max_queue_wait: the queue-wait bound in seconds (None: no bound). A request whose
        estimated wait for a sequence slot exceeds it gets HTTP 429 ``queue_full`` at once,
        with ``Retry-After`` = that estimate (`jaxinfer.engine.admission.check_wait`); one admitted
        to the queue is refused with 429 ``queue_wait_expired`` only if it is still waiting
        after `queue_wait_expiry` (the estimate was wrong, or there was none yet).
      request_timeout: default per-request deadline in seconds (None: no deadline);
        a request's ``request_timeout`` field overrides it.
      truncate_prompt: ``"none"`` (over-long prompts are a 400) or ``"left"`` (keep the
        last tokens that leave room for ``max_tokens``).
      shutdown_timeout: grace period in seconds for in-flight requests after SIGTERM.
      timeout_keep_alive: seconds an idle HTTP keep-alive connection stays open (uvicorn's
        ``timeout_keep_alive``). Longer than a load balancer that reuses idle connections to
        the server keeps them (nginx's upstream ``keepalive_timeout``: 60 s), so that the
        balancer closes them: a server closing an idle connection just as the balancer sends a
        request on it loses that request (HAProxy drops the client's connection unanswered
        and leaves the retry to the client). With uvicorn's default 5 s behind HAProxy reusing
        connections, one of six cluster benchmark runs lost a request that way; the rendered
        HAProxy config now opens a connection per request (`jaxinfer.cluster.haproxy_config`).
      retry_after: the least ``Retry-After`` (seconds) on 429; the engine suggests more when
        its measured admission rate says the queue needs longer (`jaxinfer.engine.drain_rate`).
      max_request_bytes: larger request bodies get 413 before they are parsed (None: no limit).
      parse_special_tokens_in_messages: map special-token strings typed inside chat message
        contents to control tokens (off: they are plain text, so a message cannot forge a
        turn; `jaxinfer.tokenizer.chat`). Also applies to ``/tokenize`` with ``messages``.
      instance_id: the ``x-jaxinfer-instance`` header every response carries (None: no header;
        ``server.py`` defaults it to ``hostname:port``).
      responses_store_max_entries, responses_store_max_bytes, responses_store_max_age: the
        limits of the in-memory store of ``/v1/responses`` objects (entries, bytes charged,
        seconds from creation; least recently used evicted first; 0 entries: nothing stored).
        `jaxinfer.entrypoints.openai.responses_store`.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str = DEFAULT_MODEL
    api_key: str | None = None
    max_queue_wait: float | None = 30.0
    request_timeout: float | None = None
    truncate_prompt: str = "none"
    shutdown_timeout: float = 30.0
    timeout_keep_alive: float = 75.0
    retry_after: float = 1.0
    max_request_bytes: int | None = 16 << 20
    parse_special_tokens_in_messages: bool = False
    instance_id: str | None = None
    responses_store_max_entries: int = DEFAULT_MAX_ENTRIES
    responses_store_max_bytes: int = DEFAULT_MAX_BYTES
    responses_store_max_age: float = DEFAULT_MAX_AGE_S

    @property
    def queue_wait_expiry(self) -> float | None:
        """Seconds a queued request may wait unadmitted before 429 ``queue_wait_expired``:
        `QUEUE_WAIT_EXPIRY_FACTOR` x ``max_queue_wait`` (None: no limit). A backstop: the
        bound itself is applied to the estimate at arrival, so this fires only when the
        estimate was too low or unknown, never for a queue draining as estimated."""
        return None if self.max_queue_wait is None else QUEUE_WAIT_EXPIRY_FACTOR * self.max_queue_wait

    def __post_init__(self) -> None:
        if self.truncate_prompt not in ("none", "left"):
            raise ValueError(f"truncate_prompt must be 'none' or 'left', got {self.truncate_prompt!r}")
        if not self.served_model_name:
            raise ValueError("served_model_name must not be empty")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (leave it unset for no authentication)")
        if not self.timeout_keep_alive > 0:
            raise ValueError(f"timeout_keep_alive must be > 0 seconds, got {self.timeout_keep_alive}")
        for name in ("max_queue_wait", "request_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds (or unset for no limit), got {value}")
        if self.max_request_bytes is not None and self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1, got {self.max_request_bytes}")
        if self.responses_store_max_entries < 0 or self.responses_store_max_bytes < 0:
            raise ValueError("responses_store_max_entries and responses_store_max_bytes must be >= 0")
        if not self.responses_store_max_age > 0:
            raise ValueError(f"responses_store_max_age must be > 0 seconds, got {self.responses_store_max_age}")
        if self.instance_id is not None and not (self.instance_id.isascii() and self.instance_id.isprintable()
                                                 and self.instance_id.strip()):
            raise ValueError(f"instance_id must be printable ASCII, got {self.instance_id!r}")
