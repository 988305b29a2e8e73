"""`render_config`: the HAProxy configuration that puts several jaxinfer servers behind one address.

Owns the routing policy of a jaxinfer cluster (``deploy/haproxy.cfg`` is this module's output
for three local servers, and ``python -m jaxinfer.cluster`` writes the same text for its own
instances):

- **Routing key.** The ``X-Session-Id`` request header; without it, the OpenAI ``user`` field
  of a JSON body (read from the first ``tune.bufsize`` bytes, `BUFSIZE`; a longer body or
  one without ``user`` falls back); else the client address. The key is copied into the
  ``X-Jaxinfer-Route-Key`` request header, which the backend hashes.
- **Consistent hashing** (``hash-type consistent``, Karger et al. 1997, "Consistent hashing
  and random trees"): a conversation keeps landing on the instance that holds its prefix in
  its KV cache, and adding or removing one of N instances moves about 1/N of the keys.
  ``balance="roundrobin"`` renders the baseline for benchmarks.
- **Active health checks** on ``GET /health``: an instance that is warming up, draining or
  dead answers 503 (or nothing) and gets no new requests.
- **Timeouts** long enough for SSE streams and queued requests (`TIMEOUTS`).
- **Connections:** each SSE event is sent on at once (``option http-no-delay``); each request
  gets its own connection to the instance (``option http-server-close``), since reusing an
  idle one races the instance closing it, and HAProxy then drops the request unanswered.
- **Retries** only when the TCP connection to an instance could not be made
  (``retry-on conn-failure``, on another instance): a request of which any byte reached an
  instance is never sent twice. Errors HAProxy answers itself (502/503/504) use OpenAI's
  error envelope.

Reference: the HAProxy 2.6 configuration manual (https://docs.haproxy.org/2.6/configuration.html).
"""
from __future__ import annotations

import dataclasses
import json
import os

ROUTE_HEADER = "X-Jaxinfer-Route-Key"
SESSION_HEADER = "X-Session-Id"
BACKEND = "jaxinfer"
BUFSIZE = 65536  # bytes of a request body HAProxy can see when it looks for `user`
BALANCES = ("hash", "roundrobin")
WEIGHT = 100  # each instance's points on the hash ring grow with its weight: an even split
TIMEOUTS = {
    "connect": "5s",
    "client": "10m",  # a client reading a long SSE stream, or waiting in the server's queue
    "server": "10m",  # an instance silent that long (no token, no byte) is given up on: 504
    "http-request": "30s",
    "http-keep-alive": "30s",
    "queue": "60s",
    "check": "5s",
}
_ERRORS = {502: ("server_error", "bad_gateway", "the instance serving this request failed before it finished"),
           503: ("service_unavailable", "no_instance", "no instance is ready (warming up, draining or down)"),
           504: ("timeout", "gateway_timeout", "the instance did not answer in time")}


@dataclasses.dataclass(frozen=True)
class Upstream:
    """One jaxinfer server as HAProxy sees it.

    Attributes:
      name: HAProxy's name for it (letters, digits, ``-_.``), used by the admin socket.
      address: ``host:port`` of its HTTP listener.
    """

    name: str
    address: str


@dataclasses.dataclass(frozen=True)
class HealthCheck:
    """Active check timing: every ``interval_ms``; ``fall`` failures mark an instance down,
    ``rise`` successes mark it up again."""

    interval_ms: int = 1000
    fall: int = 2
    rise: int = 2


def render_config(upstreams: list[Upstream], *, bind: str = "127.0.0.1:8000", balance: str = "hash",
                  check: HealthCheck = HealthCheck(), admin_socket: str | None = None,
                  stats_bind: str | None = None) -> str:
    """The whole ``haproxy.cfg`` text.

    Args:
      upstreams: the instances, in order (at least one).
      bind: ``host:port`` the balancer listens on.
      balance: ``"hash"`` (consistent hashing on the routing key) or ``"roundrobin"``.
      check: health-check timing.
      admin_socket: path of a Unix socket for the runtime API at admin level (drain, ready,
        ``show stat``), or None for none.
      stats_bind: ``host:port`` for HAProxy's stats page (``/stats``) and its Prometheus
        exporter (``/metrics``), or None for none.
    Returns:
      The configuration, newline-terminated.
    Raises:
      ValueError: no upstreams, duplicate names or an unknown ``balance``.
    """
    if not upstreams:
        raise ValueError("at least one upstream instance is needed")
    if len({u.name for u in upstreams}) != len(upstreams):
        raise ValueError(f"upstream names must be unique: {[u.name for u in upstreams]}")
    if balance not in BALANCES:
        raise ValueError(f"balance must be one of {BALANCES}, got {balance!r}")
    parts = [_global(admin_socket), _defaults(), _frontend(bind), _backend(upstreams, balance, check)]
    if stats_bind:
        parts.append(_stats(stats_bind))
    return "\n".join(parts)


def _global(admin_socket: str | None) -> str:
    lines = ["# jaxinfer behind HAProxy (rendered by jaxinfer.cluster.haproxy_config; docs/deploy.md explains it)",
             "global",
             "    maxconn 4096",
             f"    tune.bufsize {BUFSIZE}  # the part of a request body the `user` lookup can see"]
    if admin_socket:  # absolute: HAProxy reads a relative path as host:port
        lines.append(f"    stats socket {os.path.abspath(admin_socket)} mode 600 level admin  # runtime API: drain / ready / show stat")
    return "\n".join(lines) + "\n"


def _defaults() -> str:
    lines = ["defaults",
             "    mode http",
             "    option dontlognull",
             "    # Send each SSE event on at once. By default HAProxy asks the kernel to hold small writes",
             "    # for more data (MSG_MORE, Nagle): a stream's first token came ~230 ms late.",
             "    option http-no-delay",
             "    # One connection to the instance per request (the client's own stays open). Reusing an",
             "    # idle one races the instance closing it, and then HAProxy drops the request unanswered.",
             "    option http-server-close"]
    lines += [f"    timeout {name} {value}" for name, value in TIMEOUTS.items()]
    lines += ["    # Retry only a connection that could not be made (nothing reached the instance), on",
              "    # another instance; a request that reached an instance is never sent again.",
              "    retries 2",
              "    retry-on conn-failure",
              "    option redispatch 1"]
    for status, (kind, code, message) in _ERRORS.items():
        body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
        lines.append(f"    http-error status {status} content-type application/json string '{body}'")
    return "\n".join(lines) + "\n"


def _frontend(bind: str) -> str:
    key = "var(txn.route_key)"
    return "\n".join([
        f"frontend {BACKEND}",
        f"    bind {bind}",
        "    option forwardfor",
        "    option http-buffer-request  # lets the `user` lookup read the body",
        f"    http-request set-var(txn.route_key) req.hdr({SESSION_HEADER})",
        f"    http-request set-var(txn.route_key) req.body,json_query('$.user') if METH_POST !{{ {key} -m found }}",
        f"    http-request set-var(txn.route_key) src if !{{ {key} -m found }}",
        f"    http-request set-header {ROUTE_HEADER} %[{key}]",
        f"    default_backend {BACKEND}",
    ]) + "\n"


def _backend(upstreams: list[Upstream], balance: str, check: HealthCheck) -> str:
    lines = [f"backend {BACKEND}"]
    if balance == "hash":
        # avalanche: keys that differ in one character (session-1, session-2) still spread evenly
        lines += [f"    balance hdr({ROUTE_HEADER})", "    hash-type consistent sdbm avalanche"]
    else:
        lines.append("    balance roundrobin")
    lines += ["    option httpchk GET /health  # 503 while warming up or draining",
              "    http-check expect status 200",
              f"    default-server check inter {check.interval_ms}ms fall {check.fall} rise {check.rise} "
              f"weight {WEIGHT}"]
    lines += [f"    server {u.name} {u.address}" for u in upstreams]
    return "\n".join(lines) + "\n"


def _stats(stats_bind: str) -> str:
    return "\n".join([
        "frontend stats",
        f"    bind {stats_bind}",
        "    stats enable",
        "    stats uri /stats",
        "    http-request use-service prometheus-exporter if { path /metrics }",
    ]) + "\n"


def main(argv: list[str] | None = None) -> None:
    """``python -m jaxinfer.cluster.haproxy_config HOST:PORT... [--bind ...]``: print a configuration for
    servers anywhere (docs/deploy.md). Server names are ``inst1``, ``inst2``... in order."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m jaxinfer.cluster.haproxy_config", description=main.__doc__.split("(")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("servers", nargs="+", metavar="HOST:PORT", help="the jaxinfer servers, in order")
    p.add_argument("--bind", default="127.0.0.1:8000", help="where HAProxy listens")
    p.add_argument("--balance", default="hash", choices=BALANCES, help="routing")
    p.add_argument("--admin-socket", default="/run/haproxy/jaxinfer-admin.sock",
                   help="runtime API socket ('' for none)")
    p.add_argument("--stats", default="127.0.0.1:8404", help="stats page and HAProxy's own metrics ('' for none)")
    p.add_argument("--check-interval-ms", type=int, default=HealthCheck.interval_ms, help="health-check period")
    args = p.parse_args(argv)
    upstreams = [Upstream(f"inst{i + 1}", address) for i, address in enumerate(args.servers)]
    print(render_config(upstreams, bind=args.bind, balance=args.balance, admin_socket=args.admin_socket or None,
                        stats_bind=args.stats or None, check=HealthCheck(interval_ms=args.check_interval_ms)), end="")


if __name__ == "__main__":
    main()
